"""Conformance checks for Emberbox against the real `withruntime==0.35.0` SDK.

Every check goes through the SDK, the way a user's code would. See
docs/notes/withruntime-0.35.0-wire.md for what each SDK call sends.
One default-size sandbox (`sbx` fixture, conftest.py) is shared by the module;
tests 9 and 9b make their own, because they end them.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
import uuid

import pytest
from _helpers import ok as _ok, poll as _poll
from withruntime import ConflictError, NotFoundError, Sandbox
from withruntime.tools import sandbox_tools

WS = "/workspace"
SLOW_MS = 300_000  # generous limit for commands under software emulation


def _unique(prefix: str) -> str:
    return f"{WS}/conformance/{prefix}-{uuid.uuid4().hex[:8]}"


# 1 -------------------------------------------------------------------------
def test_01_default_size_user_and_sudo(sbx):
    assert sbx.state == "running"
    r = sbx.exec("nproc && free -m")
    _ok(r, "nproc && free -m")
    lines = r.stdout.splitlines()
    assert lines[0].strip() == "2", f"nproc said {lines[0]!r}"
    mem = [line for line in lines if line.startswith("Mem:")]
    assert mem, f"no Mem: line in {r.stdout!r}"
    total_mib = int(mem[0].split()[1])
    assert 3700 <= total_mib <= 4096, f"total memory {total_mib} MiB"

    who = sbx.exec("id -un")
    _ok(who, "id -un")
    assert who.stdout.strip() == "user"

    _ok(sbx.exec("sudo -n true"), "sudo -n true")


# 2 -------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["python3 --version", "node --version", "sqlite3 --version",
                                 "gcc --version", "pip --version"])
def test_02_toolchain_versions(sbx, cmd):
    r = sbx.exec(cmd)
    _ok(r, cmd)
    assert (r.stdout + r.stderr).strip(), f"{cmd} printed nothing"


def test_02_go_build_and_run(sbx):
    d = _unique("gohello")
    src = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello from go", 6*7) }\n'
    sbx.files.write(f"{d}/main.go", src)
    env = {"HOME": WS, "GOCACHE": f"{WS}/.cache/go-build", "GOPATH": f"{WS}/go",
           "GOTELEMETRY": "off", "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"}
    r = sbx.exec('export PATH="$PATH:/usr/local/go/bin:/usr/lib/go/bin" && go build -o hello main.go && ./hello',
                 cwd=d, env=env, timeout_ms=SLOW_MS)
    _ok(r, "go build && ./hello")
    assert r.stdout.strip().endswith("hello from go 42"), r.stdout


# 3 -------------------------------------------------------------------------
def test_03_file_persists_between_calls(sbx):
    path = _unique("persist") + "/note.txt"
    text = "written in one call, read in another\nline 2 ü€\n"
    sbx.files.write(path, text)
    assert sbx.files.read(path).decode() == text
    r = sbx.exec(["cat", "--", path])
    _ok(r, "cat")
    assert r.stdout == text


def test_03_binary_round_trip(sbx):
    path = _unique("binary") + "/blob.bin"
    payload = bytes(range(256)) + os.urandom(300 * 1024 - 256)
    sbx.files.write(path, payload)
    back = sbx.files.read(path)
    assert len(back) == len(payload)
    assert back == payload, "binary file did not round-trip byte for byte"
    r = sbx.exec(["sha256sum", path])
    _ok(r, "sha256sum")
    assert r.stdout.split()[0] == hashlib.sha256(payload).hexdigest()


def test_03b_large_file_chunked_upload(sbx):
    """Over 1 MiB the SDK switches to POST /uploads + PUT chunks + :commit."""
    path = _unique("large") + "/big.bin"
    payload = os.urandom(1_048_576 + 512 * 1024)
    sbx.files.write(path, payload)
    assert sbx.files.read(path) == payload


def test_03c_files_list_stat_mkdir_remove(sbx):
    d = _unique("fsops")
    sbx.files.mkdir(f"{d}/sub", parents=True)
    sbx.files.write(f"{d}/sub/a.txt", "abc")
    st = sbx.files.stat(f"{d}/sub/a.txt")
    assert st.get("exists", True) is True and st.get("type") == "file" and st.get("size") == 3, st
    assert sbx.files.exists(f"{d}/sub/a.txt")
    assert not sbx.files.exists(f"{d}/nope.txt")
    names = {e["name"] for e in sbx.files.list(f"{d}/sub")}
    assert "a.txt" in names
    assert sbx.files.remove(f"{d}/sub", recursive=True) is True
    assert not sbx.files.exists(f"{d}/sub")


# 4 -------------------------------------------------------------------------
def test_04_missing_file_is_not_found(sbx):
    with pytest.raises(NotFoundError) as info:
        sbx.files.read(f"{WS}/definitely/not/here-{uuid.uuid4().hex}.txt")
    assert info.value.status == 404
    assert info.value.code == "file_not_found"


# 5 -------------------------------------------------------------------------
def test_05_background_http_server_via_processes(sbx):
    proc = sbx.spawn("python3 -m http.server 8000", cwd=WS)
    assert proc.id
    try:
        def answered():
            r = sbx.exec("curl -s --max-time 5 http://127.0.0.1:8000/", timeout_ms=20_000)
            return r if r.exit_code == 0 and "Directory listing" in r.stdout else None
        r = _poll(answered, timeout_s=90, interval_s=1)
        assert r, "python3 -m http.server never answered on 127.0.0.1:8000"

        listed = [p.get("id") for p in sbx.processes()]
        assert proc.id in listed, listed
        again = sbx.process(proc.id)
        assert again.id == proc.id and again.state == "running", again.info
    finally:
        proc.kill("SIGTERM")
    gone = _poll(lambda: sbx.process(proc.id).state not in (None, "running"), timeout_s=30)
    assert gone, f"process {proc.id} still running after SIGTERM"


# 6 -------------------------------------------------------------------------
def test_06_timeout_is_a_result(sbx):
    t0 = time.monotonic()
    r = sbx.exec("sleep 30", timeout_ms=2000)
    elapsed = time.monotonic() - t0
    assert r.timed_out is True, r
    assert r.exit_code != 0, r
    assert elapsed < 15, f"a 2 s timeout took {elapsed:.1f} s"


# 7 -------------------------------------------------------------------------
def test_07_large_output_truncated_and_flagged(sbx):
    r = sbx.exec(r"head -c 10485760 /dev/zero | tr '\0' 'a'")  # non-streamed (no callback, default timeout)
    assert r.stdout_truncated is True, f"stdout_truncated={r.stdout_truncated}, len={len(r.stdout)}"
    assert 0 < len(r.stdout) < 10_485_760
    assert set(r.stdout) == {"a"}


# 8 -------------------------------------------------------------------------
def test_08_streamed_exec_callback_in_order(sbx):
    chunks: list[str] = []
    expected = "".join(f"line-{i}\n" for i in range(1, 61))
    r = sbx.exec('for i in $(seq 1 60); do echo "line-$i"; sleep 0.02; done', on_stdout=chunks.append)
    _ok(r, "streamed loop")
    assert "".join(chunks) == expected
    assert r.stdout == expected
    assert not r.stdout_truncated and not r.timed_out


# 9 -------------------------------------------------------------------------
def _assert_exec_refused_after_end(box, allow_404: bool):
    for attempt in ("plain", "streamed"):
        kwargs = {} if attempt == "plain" else {"on_stdout": lambda _s: None}
        with pytest.raises((ConflictError, NotFoundError) if allow_404 else ConflictError) as info:
            box.exec("echo should-not-run", **kwargs)
        err = info.value
        if isinstance(err, ConflictError):
            assert err.status == 409 and err.code in ("not_running", "sandbox_stopped"), (attempt, err.code)


def test_09_with_block_stops_sandbox(runtime_client):
    """0.35.0: a `with` block STOPS the sandbox only with keep=True (client-side flag)."""
    with Sandbox.create(client=runtime_client, timeout_seconds=900, on_lease_end="stop", keep=True) as box:
        r = box.exec("echo inside")
        _ok(r, "echo inside")
        assert r.stdout.strip() == "inside"
        box_id = box.id
    fresh = _poll(lambda: (lambda s: s if s.state == "stopped" else None)(
        Sandbox.connect(box_id, client=runtime_client)), timeout_s=120, interval_s=1)
    assert fresh, f"sandbox {box_id} not stopped after the with block"
    _assert_exec_refused_after_end(box, allow_404=False)
    box.delete()


def test_09b_with_block_default_deletes_sandbox(runtime_client):
    """0.35.0 default: the end of the block sends DELETE /v1/sandboxes/{id}."""
    with Sandbox.create(client=runtime_client, timeout_seconds=900, on_lease_end="stop") as box:
        _ok(box.exec("true"), "true")
        box_id = box.id

    def ended():
        try:
            s = Sandbox.connect(box_id, client=runtime_client)
        except NotFoundError:
            return "gone"
        return "ended" if s.state == "stopped" else None
    assert _poll(ended, timeout_s=120, interval_s=1), f"sandbox {box_id} still alive after the with block"
    _assert_exec_refused_after_end(box, allow_404=True)


def test_09c_get_list_extend(sbx, runtime_client):
    assert sbx.refresh().state == "running"
    assert sbx.id in [s.id for s in runtime_client.sandboxes.list(limit=100)]
    assert sbx.extend(600).id == sbx.id


# 10 ------------------------------------------------------------------------
def test_10_sandbox_tools(sbx):
    runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files = sandbox_tools(sbx)
    assert [f.__name__ for f in (runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files)] == [
        "runtime_exec", "runtime_read_file", "runtime_write_file", "runtime_list_files"]

    out = runtime_exec("nproc")  # streamed: timeoutMs 300000 > 60000
    assert out["exit_code"] == 0 and out["stdout"].strip() == "2" and out["timed_out"] is False, out

    rel_dir = f"conformance/tools-{uuid.uuid4().hex[:8]}"
    msg = runtime_write_file(f"{rel_dir}/hello.txt", "hi from tools\n")
    assert msg == f"Wrote 14 bytes to {WS}/{rel_dir}/hello.txt", msg
    assert runtime_read_file(f"{rel_dir}/hello.txt") == "hi from tools\n"
    assert runtime_read_file(f"{rel_dir}/missing.txt").startswith("No such file:")

    entries = runtime_list_files(rel_dir)
    assert {"path": f"{WS}/{rel_dir}/hello.txt", "type": "file", "size": 14} in entries, entries

    # outside /workspace the tools use exec (argv + stdin) instead of the files API
    tmp = f"/tmp/tools-{uuid.uuid4().hex[:8]}/x.txt"
    assert runtime_write_file(tmp, "outside\n") == f"Wrote 8 bytes to {tmp}"
    assert runtime_read_file(tmp) == "outside\n"


# 11 ------------------------------------------------------------------------
def test_11_smolagents_tool_calling_agent(sbx):
    from smolagents import ToolCallingAgent, tool
    from smolagents.monitoring import LogLevel
    from _scripted_model import ScriptedModel, call

    model = ScriptedModel([
        call("runtime_exec", {"command": "nproc && free -m"}),
        call("final_answer", {"answer": "done"}),
    ])
    agent = ToolCallingAgent(tools=[tool(f) for f in sandbox_tools(sbx)], model=model,
                             verbosity_level=LogLevel.OFF, max_steps=4)
    result = agent.run("How many CPUs does the sandbox have?", return_full_result=True)
    assert result.state == "success" and result.output == "done", result
    observations = [getattr(s, "observations", None) for s in agent.memory.steps]
    exec_obs = next((o for o in observations if o and "exit_code" in o), None)
    assert exec_obs is not None, observations
    assert "'exit_code': 0" in exec_obs, exec_obs
    assert re.search(r"'stdout': '2\\n", exec_obs), exec_obs
    assert model.calls == 2


# curl ----------------------------------------------------------------------
def test_curl_smoke(emberbox_server):
    """The same core flow with plain curl (tests/conformance/curl_smoke.sh)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).with_name("curl_smoke.sh")
    env = dict(os.environ, EMBERBOX_TEST_URL=emberbox_server.url, EMBERBOX_TEST_KEY=emberbox_server.key)
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"curl_smoke.sh failed:\n{proc.stdout}\n{proc.stderr}"
    assert "ok:" in proc.stdout
