"""Fixtures. Unit tests need nothing; tests marked `integration` need a live server.

If EMBERBOX_API_URL and EMBERBOX_API_KEY are set, the integration tests use that
server. Otherwise the first one starts `bin/emberbox serve --listen
127.0.0.1:<free port> --data-dir <tmp>` from the repository root, waits for
/v1/openapi.json, reads <data-dir>/admin.key, and stops the server at the end.
Every sandbox a test creates is registered in `created` and deleted at the end.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
BINARY = REPO_ROOT / "bin" / "emberbox"
STARTUP_TIMEOUT_S = float(os.environ.get("EMBERBOX_STARTUP_TIMEOUT", "600"))

# withruntime routes even http://127.0.0.1 through HTTP_PROXY unless NO_PROXY names it.
for _var in ("NO_PROXY", "no_proxy"):
    _cur = os.environ.get(_var, "")
    os.environ[_var] = ",".join(x for x in (_cur, "127.0.0.1", "localhost") if x)

_FAILED = {"any": False}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if outcome.get_result().failed:
        _FAILED["any"] = True


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in item.fixturenames or any(
                f in item.fixturenames for f in ("server", "client", "sbx", "created")):
            item.add_marker(pytest.mark.integration)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/openapi.json", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Server:
    def __init__(self, url: str, key: str, log: Path | None = None) -> None:
        self.url, self.key, self.log = url, key, log

    def log_tail(self, n: int = 60) -> str:
        if not self.log:
            return "<external server>"
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError as e:
            return f"<no log: {e}>"


@pytest.fixture(scope="session")
def server():
    url, key = os.environ.get("EMBERBOX_API_URL"), os.environ.get("EMBERBOX_API_KEY")
    if url and key:
        os.environ.setdefault("RUNTIME_API_URL", url)
        os.environ.setdefault("RUNTIME_API_KEY", key)
        yield Server(url.rstrip("/"), key)
        return
    if not os.access(BINARY, os.X_OK):
        pytest.fail(f"{BINARY} is missing: run `make build` in {REPO_ROOT}, or set "
                    "EMBERBOX_API_URL and EMBERBOX_API_KEY", pytrace=False)
    data_dir = Path(tempfile.mkdtemp(prefix="emberbox-sdk-"))
    log_path = data_dir.parent / (data_dir.name + ".log")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(BINARY), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir)],
                            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    srv = Server(url, "", log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _up(url):
            if proc.poll() is not None:
                pytest.fail(f"emberbox exited ({proc.returncode}) before serving. Log:\n{srv.log_tail()}",
                            pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"emberbox did not start within {STARTUP_TIMEOUT_S:.0f} s. Log:\n{srv.log_tail()}",
                            pytrace=False)
            time.sleep(0.5)
        key_file = data_dir / "admin.key"
        for _ in range(60):
            if key_file.is_file() and key_file.read_text().strip():
                break
            time.sleep(0.5)
        srv.key = key_file.read_text().strip()
        for name, value in (("EMBERBOX_API_URL", url), ("EMBERBOX_API_KEY", srv.key),
                            ("RUNTIME_API_URL", url), ("RUNTIME_API_KEY", srv.key)):
            os.environ[name] = value
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()
        if _FAILED["any"]:
            print(f"\n==== emberbox log tail ({log_path}) ====\n{srv.log_tail()}\n==== end ====")
        if os.environ.get("EMBERBOX_KEEP_DATA") != "1":
            shutil.rmtree(data_dir, ignore_errors=True)
            if not _FAILED["any"]:
                log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def client(server):
    from emberbox import Client

    c = Client(server.url, server.key)
    yield c
    c.close()


@pytest.fixture(scope="session")
def created(client):
    """Ids of sandboxes made by tests: all deleted at session end."""
    from emberbox import Sandbox

    ids: list[str] = []
    yield ids
    for sid in ids:
        try:
            Sandbox(client, {"id": sid}).delete()
        except Exception as e:  # noqa: BLE001 - cleanup must not hide the result
            print(f"cleanup: delete {sid}: {e}")


@pytest.fixture(scope="session")
def sbx(client, created):
    """One default-size sandbox shared by the session (VMs boot slowly under emulation)."""
    from emberbox import Sandbox

    box = Sandbox.create(client=client, timeout_seconds=3600, on_lease_end="delete",
                         labels={"suite": "sdk-python"})
    created.append(box.id)
    return box
