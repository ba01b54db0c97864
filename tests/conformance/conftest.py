"""Fixtures for the withruntime==0.35.0 conformance suite.

If EMBERBOX_TEST_URL and EMBERBOX_TEST_KEY are set, the tests use that server.
Otherwise they start `bin/emberbox serve --listen 127.0.0.1:<port> --data-dir <tmp>
--webhook-allow-private`
from the repository root, wait for GET /v1/openapi.json (up to 10 minutes: the
first start may build the guest image), read <data-dir>/admin.key and point
RUNTIME_API_URL / RUNTIME_API_KEY at it. The server is stopped at session end
(SIGTERM, then SIGKILL), and the tail of its log is printed if a test failed.
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

REPO_ROOT = Path(__file__).resolve().parents[2]
BINARY = REPO_ROOT / "bin" / "emberbox"
STARTUP_TIMEOUT_S = float(os.environ.get("EMBERBOX_STARTUP_TIMEOUT", "600"))
LOG_TAIL_LINES = 80

# The SDK routes even http://127.0.0.1 through HTTP_PROXY unless NO_PROXY names it.
for _var in ("NO_PROXY", "no_proxy"):
    _cur = os.environ.get(_var, "")
    os.environ[_var] = ",".join(x for x in (_cur, "127.0.0.1", "localhost") if x)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<no log: {e}>"


class _Server:
    def __init__(self, url: str, key: str, proc=None, log_path=None, data_dir=None):
        self.url, self.key, self.proc, self.log_path, self.data_dir = url, key, proc, log_path, data_dir

    def log_tail(self) -> str:
        return _tail(self.log_path) if self.log_path else "<external server: no log>"


def _openapi_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/openapi.json"), timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


_FAILED = {"any": False}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        _FAILED["any"] = True


@pytest.fixture(scope="session")
def emberbox_server():
    url, key = os.environ.get("EMBERBOX_TEST_URL"), os.environ.get("EMBERBOX_TEST_KEY")
    if url and key:
        server = _Server(url.rstrip("/"), key)
        os.environ["RUNTIME_API_URL"], os.environ["RUNTIME_API_KEY"] = server.url, server.key
        yield server
        return

    if not (BINARY.is_file() and os.access(BINARY, os.X_OK)):
        pytest.fail(f"{BINARY} is missing or not executable: run `make build` in {REPO_ROOT} "
                    "(or set EMBERBOX_TEST_URL and EMBERBOX_TEST_KEY to use a running server).",
                    pytrace=False)

    data_dir = Path(tempfile.mkdtemp(prefix="emberbox-conformance-"))
    log_path = data_dir.parent / (data_dir.name + ".log")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        # --webhook-allow-private: the suite's webhook receivers listen on
        # this machine's loopback, which a server refuses by default.
        [str(BINARY), "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
         "--webhook-allow-private"],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = _Server(url, "", proc, log_path, data_dir)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _openapi_ok(url):
            if proc.poll() is not None:
                pytest.fail(f"emberbox exited with {proc.returncode} before serving "
                            f"/v1/openapi.json. Log tail:\n{server.log_tail()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"emberbox did not serve /v1/openapi.json within {STARTUP_TIMEOUT_S:.0f} s. "
                            f"Log tail:\n{server.log_tail()}", pytrace=False)
            time.sleep(1)
        key_file = data_dir / "admin.key"
        for _ in range(30):
            if key_file.is_file() and key_file.read_text().strip():
                break
            time.sleep(1)
        else:
            pytest.fail(f"{key_file} not found after the server started. Log tail:\n{server.log_tail()}",
                        pytrace=False)
        server.key = key_file.read_text().strip()
        os.environ["RUNTIME_API_URL"], os.environ["RUNTIME_API_KEY"] = url, server.key
        yield server
    finally:
        _stop(proc)
        log.close()
        if _FAILED["any"]:
            print(f"\n==== emberbox log tail ({log_path}) ====\n{server.log_tail()}\n==== end ====")
        if os.environ.get("EMBERBOX_KEEP_DATA") != "1":
            shutil.rmtree(data_dir, ignore_errors=True)
            if not _FAILED["any"]:
                log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def runtime_client(emberbox_server):
    from withruntime import Runtime
    client = Runtime(api_key=emberbox_server.key, base_url=emberbox_server.url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def sbx(runtime_client):
    """One default-size sandbox shared by the whole module (VMs boot slowly)."""
    from withruntime import Sandbox
    box = Sandbox.create(client=runtime_client)
    yield box
    try:
        box.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {box.id} failed: {e}")
