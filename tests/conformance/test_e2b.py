"""E2B's own SDKs (e2b 2.63.0, e2b-code-interpreter 2.11.5) and smolagents'
executor_type="e2b" against Emberbox, with no code change: only E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY point at the server (docs/e2b.md)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from _helpers import poll

e2b = pytest.importorskip("e2b")
e2b_ci = pytest.importorskip("e2b_code_interpreter")

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2b_env(emberbox_server):
    """Points E2B's SDKs at the server the way a user would: three variables."""
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN")}
    os.environ["E2B_API_URL"] = emberbox_server.url
    os.environ["E2B_SANDBOX_URL"] = emberbox_server.url
    os.environ["E2B_API_KEY"] = emberbox_server.key
    os.environ.pop("E2B_DOMAIN", None)
    yield emberbox_server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def other_key(emberbox_server) -> str:
    """A second tenant key, made with `emberbox keys create` on the server's data dir."""
    if emberbox_server.data_dir is None:
        pytest.skip("an external server: no data dir to make a second key in")
    out = subprocess.run([str(REPO_ROOT / "bin" / "emberbox"), "keys", "create", "--data-dir",
                          str(emberbox_server.data_dir), "--name", "e2b-other"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def box(e2b_env):
    """One E2B sandbox (template base) shared by the module's SDK tests."""
    sbx = e2b.Sandbox.create(template="base", timeout=600, metadata={"suite": "e2b-conformance"})
    yield sbx
    try:
        sbx.kill()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: kill of {sbx.sandbox_id} failed: {e}")


def _raw(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# --- control plane -----------------------------------------------------------
def test_sandbox_info_list_timeout_and_runtime_view(box, runtime_client):
    info = box.get_info()
    assert info.sandbox_id == box.sandbox_id and info.state == "running"
    assert info.metadata == {"suite": "e2b-conformance"}
    assert info.template_id == "base"

    found = poll(lambda: [s for s in e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "e2b-conformance"})).next_items()
                          if s.sandbox_id == box.sandbox_id], 30)
    assert found, "Sandbox.list(query=metadata) did not find the sandbox"
    assert not [s for s in e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "nope"})).next_items()
                if s.sandbox_id == box.sandbox_id]

    box.set_timeout(120)
    end1 = box.get_info().end_at
    assert 60 < (end1.timestamp() - time.time()) <= 121
    box.set_timeout(900)
    assert box.get_info().end_at > end1

    # The same sandbox through the Runtime API, labelled with its template.
    rs = runtime_client.sandboxes.get(box.sandbox_id)
    labels = rs.info.get("labels") or {}
    assert labels.get("suite") == "e2b-conformance" and labels.get("e2b.template") == "base"
    assert rs.state == "running"


def test_refused_with_another_key_and_without_key(box, e2b_env, other_key):
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.connect(box.sandbox_id, api_key=other_key)
    assert e2b.Sandbox.kill(box.sandbox_id, api_key=other_key) is False
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.get_info(box.sandbox_id, api_key=other_key)
    assert box.sandbox_id not in [s.sandbox_id for s in e2b.Sandbox.list(api_key=other_key).next_items()]
    # Another key cannot reach the sandbox's envd either: no token of its own.
    base = e2b_env.url
    st, body = _raw("GET", base + f"/sandboxes/{box.sandbox_id}", {"X-API-KEY": other_key})
    assert st == 404 and json.loads(body)["code"] == 404
    # No key at all: 401 in E2B's error shape, on the control plane and on envd.
    st, body = _raw("GET", base + "/v2/sandboxes")
    assert st == 401 and json.loads(body)["code"] == 401
    st, body = _raw("POST", base + "/v2/sandboxes", {"Content-Type": "application/json"}, b'{"templateID":"base"}')
    assert st == 401
    st, body = _raw("POST", base + "/filesystem.Filesystem/ListDir",
                    {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"},
                    b'{"path":"/"}')
    assert st == 401, body
    st, body = _raw("POST", base + "/execute",
                    {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"},
                    b'{"code":"1+1"}')
    assert st == 401, body
    # A token of another sandbox opens nothing here. That sandbox is a
    # key's of its own, whose tokens then end with its secrets: a rotation
    # without grace ends the old secret's, a revocation every one.
    data_dir = e2b_env.data_dir  # other_key skipped the test without one
    key_id, secret = _keys(data_dir, "create", "--name", "e2b-revoked")
    other = e2b.Sandbox.create(template="base", timeout=120, api_key=secret)
    st, body = _raw("POST", base + "/execute",
                    {"E2b-Sandbox-Id": box.sandbox_id, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json",
                     "E2B-Traffic-Access-Token": other.traffic_access_token or "", "X-Access-Token": other._envd_access_token or ""},
                    b'{"code":"1+1"}')
    assert st == 401, body

    def envd_stat(token: str):
        return _raw("POST", base + "/filesystem.Filesystem/Stat",
                    {"E2b-Sandbox-Id": other.sandbox_id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json",
                     "X-Access-Token": token}, b'{"path":"/tmp"}')

    first = other._envd_access_token or ""
    assert envd_stat(first)[0] == 200
    _, secret2 = _keys(data_dir, "rotate", key_id, "--grace", "0")
    st, body = envd_stat(first)
    assert st == 401 and b"no longer valid" in body, body
    again = e2b.Sandbox.connect(other.sandbox_id, api_key=secret2)
    second = again._envd_access_token or ""
    assert second != first and envd_stat(second)[0] == 200
    again.set_timeout(60)  # its key ends below: the lease removes it
    _keys(data_dir, "revoke", key_id)
    st, body = envd_stat(second)
    assert st == 401 and b"no longer valid" in body, body
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.connect(other.sandbox_id, api_key=secret2)
    assert box.is_running()


def _keys(data_dir, *args: str) -> tuple[str, str]:
    """Runs `emberbox keys <args>` on the server's data dir: the key id it
    names on stderr, and the secret it prints (if any)."""
    out = subprocess.run([str(REPO_ROOT / "bin" / "emberbox"), "keys", *args, "--data-dir", str(data_dir)],
                         check=True, capture_output=True, text=True)
    words = out.stderr.split()
    key_id = next((w for w in words if w.startswith("key_")), "")
    return key_id, out.stdout.strip()


# --- commands (envd's process service) ----------------------------------------
def test_commands_foreground_background_stream_stdin_timeout_kill(box):
    r = box.commands.run("echo hello; echo oops >&2; whoami; pwd")
    assert r.exit_code == 0 and r.stdout.splitlines()[0] == "hello" and "oops" in r.stderr
    assert r.stdout.splitlines()[1] == "user"

    with pytest.raises(e2b.CommandExitException) as ei:
        box.commands.run("echo partial; exit 3")
    assert ei.value.exit_code == 3 and "partial" in ei.value.stdout

    seen: list[str] = []
    r = box.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", on_stdout=seen.append)
    assert "".join(seen).split() == ["line1", "line2", "line3"] and r.exit_code == 0

    h = box.commands.run("sleep 1; echo bg-done", background=True)
    assert h.pid > 0
    assert h.wait().stdout.strip() == "bg-done"

    h = box.commands.run("read a; read b; echo got:$a:$b", background=True, stdin=True)
    box.commands.send_stdin(h.pid, "one\n")
    box.commands.send_stdin(h.pid, "two\n")
    assert h.wait().stdout.strip() == "got:one:two"

    with pytest.raises(e2b.TimeoutException):
        box.commands.run("sleep 60", timeout=3)

    h = box.commands.run("sleep 300", background=True)
    assert any(p.pid == h.pid for p in box.commands.list())
    assert box.commands.kill(h.pid) is True
    with pytest.raises(e2b.CommandExitException):
        h.wait()
    assert poll(lambda: not any(p.pid == h.pid for p in box.commands.list()), 30)

    r = box.commands.run("echo $FOO-$PWD", envs={"FOO": "bar"}, cwd="/tmp")
    assert r.stdout.strip() == "bar-/tmp"
    r = box.commands.run("whoami", user="root")
    assert r.stdout.strip() == "root"


# --- files (envd's filesystem service and /files) -----------------------------
def test_files_write_read_list_rename_remove_watch(box):
    d = f"/tmp/e2b-files-{uuid.uuid4().hex[:8]}"
    info = box.files.write(f"{d}/a.txt", "alpha\n")
    assert info.path == f"{d}/a.txt"
    assert box.files.read(f"{d}/a.txt") == "alpha\n"
    blob = os.urandom(3 * 1024 * 1024 + 17)
    box.files.write(f"{d}/blob.bin", blob)
    assert bytes(box.files.read(f"{d}/blob.bin", format="bytes")) == blob
    names = {e.name: e for e in box.files.list(d)}
    assert set(names) == {"a.txt", "blob.bin"} and names["blob.bin"].size == len(blob)
    assert box.files.exists(f"{d}/a.txt") and not box.files.exists(f"{d}/none")
    box.files.make_dir(f"{d}/sub/deeper")
    box.files.rename(f"{d}/a.txt", f"{d}/sub/b.txt")
    assert box.files.read(f"{d}/sub/b.txt") == "alpha\n" and not box.files.exists(f"{d}/a.txt")
    box.files.remove(f"{d}/sub")
    assert not box.files.exists(f"{d}/sub")
    with pytest.raises(e2b.NotFoundException):
        box.files.read(f"{d}/sub/b.txt")

    handle = box.files.watch_dir(d, recursive=True)
    try:
        box.files.make_dir(f"{d}/w")
        box.files.write(f"{d}/w/watched.txt", "x")
        seen: list = []
        assert poll(lambda: seen.extend(handle.get_new_events()) or any(e.name == "w/watched.txt" for e in seen), 30), seen
        box.files.remove(f"{d}/w/watched.txt")
        assert poll(lambda: seen.extend(handle.get_new_events()) or any(
            e.name == "w/watched.txt" and e.type.name == "REMOVE" for e in seen), 30), seen
    finally:
        handle.stop()


def test_e2b_layout_home_user(box, runtime_client):
    """E2B's layout: user `user`, home and working directory /home/user, the
    same directory as the Runtime API's /workspace (a link to it)."""
    info = box.files.write("/home/user/x.txt", "from e2b\n")
    assert info.path == "/home/user/x.txt"
    assert box.files.read("/home/user/x.txt") == "from e2b\n"
    assert "x.txt" in {e.name for e in box.files.list("/home/user")}
    r = box.commands.run('echo "$HOME"; pwd; whoami; cat x.txt')
    assert r.stdout.splitlines() == ["/home/user", "/home/user", "user", "from e2b"], r.stdout
    assert runtime_client.sandboxes.get(box.sandbox_id).files.read_text("/workspace/x.txt") == "from e2b\n"
    r = box.commands.run("pwd; echo $HOME", user="root")
    assert r.stdout.split() == ["/root", "/root"], r.stdout


# --- the code interpreter -------------------------------------------------------
def test_code_interpreter_state_chart_table_contexts(e2b_env):
    sbx = e2b_ci.Sandbox.create(timeout=600)
    try:
        ex = sbx.run_code("x = 40\nx + 2")
        assert ex.error is None and ex.text == "42"
        assert sbx.run_code("x * 10").text == "400"  # state persists

        out: list[str] = []
        ex = sbx.run_code("print('to stdout')", on_stdout=lambda m: out.append(m.line))
        assert ex.logs.stdout == ["to stdout\n"] and out == ["to stdout\n"]

        ex = sbx.run_code(
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots()\nax.plot([1, 2, 3], [1, 4, 9])\nfig")
        assert ex.error is None
        pngs = [r.png for r in ex.results if r.png]
        assert pngs, ex.results
        from PIL import Image
        import base64
        img = Image.open(io.BytesIO(base64.b64decode(pngs[0])))
        assert img.format == "PNG" and img.size[0] > 100

        ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
        main = [r for r in ex.results if r.is_main_result][0]
        assert "<table" in (main.html or "") and "a" in main.text

        ex = sbx.run_code("1/0")
        assert ex.error is not None and ex.error.name == "ZeroDivisionError"
        assert "division by zero" in ex.error.value and "ZeroDivisionError" in ex.error.traceback

        ctx = sbx.create_code_context()
        sbx.run_code("y = 'in context'", context=ctx)
        assert sbx.run_code("y", context=ctx).text == "in context"  # E2B unquotes text/plain
        ex = sbx.run_code("y")  # the default context has no y
        assert ex.error is not None and ex.error.name == "NameError"
        assert ctx.id in [c.id for c in sbx.list_code_contexts()]
        sbx.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    finally:
        sbx.kill()


# --- smolagents: CodeAgent(executor_type="e2b") unchanged -----------------------
def _code(src: str) -> str:
    return f"Thought: next step.\n<code>\n{src}\n</code>"


class _CodeScript:
    """A scripted smolagents Model for CodeAgent: fixed code blocks, no LLM."""

    def __new__(cls, steps: list[str]):
        from smolagents import ChatMessage, Model
        from smolagents.models import MessageRole

        class Scripted(Model):
            def __init__(self):
                super().__init__(model_id="scripted")
                self.steps = list(steps)

            def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kw):
                content = self.steps.pop(0) if self.steps else "done"
                return ChatMessage(role=MessageRole.ASSISTANT, content=content)

        return Scripted()


def test_smolagents_code_agent_executor_type_e2b(e2b_env, runtime_client):
    from smolagents import CodeAgent
    from smolagents.monitoring import LogLevel
    from smolagents.utils import AgentExecutionError
    from PIL import Image

    model = _CodeScript([
        _code("x = 21\nprint('x is', x)"),
        _code("!pip install -q tabulate==0.9.0"),
        _code("import tabulate\nprint(tabulate.tabulate([[x, x * 2]], headers=['x', 'y']))"),
        _code("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.bar(['a', 'b'], [x, x * 2])\nfig"),
        _code("raise ValueError('deliberate failure')"),
        _code("final_answer({'x': x, 'double': x * 2})"),
    ])
    agent = CodeAgent(tools=[], model=model, executor_type="e2b", verbosity_level=LogLevel.OFF, max_steps=10)
    sandbox_id = agent.python_executor.sandbox.sandbox_id
    try:
        result = agent.run("Compute things step by step.", return_full_result=True)
    finally:
        agent.cleanup()
    assert result.state == "success", result
    assert result.output == {"x": 21, "double": 42}
    steps = [s for s in agent.memory.steps if hasattr(s, "code_action")]
    assert "x is 21" in steps[0].observations
    assert steps[1].error is None, steps[1].error
    assert "x    y" in steps[2].observations and "21   42" in steps[2].observations  # the package from PyPI
    assert isinstance(steps[3].action_output, Image.Image), steps[3].action_output  # the chart as a PIL image
    assert "PIL" in steps[3].observations
    assert isinstance(steps[4].error, AgentExecutionError) and "ValueError" in str(steps[4].error)
    assert "deliberate failure" in str(steps[4].error)
    assert steps[5].is_final_answer

    # cleanup deleted the sandbox.
    assert poll(lambda: _gone(runtime_client, sandbox_id), 60), "the sandbox outlived the agent's cleanup"


def _gone(runtime_client, sandbox_id: str) -> bool:
    from withruntime import NotFoundError
    try:
        return runtime_client.sandboxes.get(sandbox_id).state in ("deleted", "deleting")
    except NotFoundError:
        return True
