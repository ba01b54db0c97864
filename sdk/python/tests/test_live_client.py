"""The sync client against a live server (one shared sandbox, plus one small one
for the context-manager stop)."""
from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest

from emberbox import (
    AuthenticationError,
    Client,
    CommandError,
    ConflictError,
    FileNotFoundInSandboxError,
    NotFoundError,
    Sandbox,
)


def _dir() -> str:
    return f"/workspace/sdk-{uuid.uuid4().hex[:8]}"


def test_create_connect_list_refresh(sbx, client):
    assert sbx.state == "running" and sbx.id.startswith("sbx_")
    again = Sandbox.connect(sbx.id, client=client)
    assert again.id == sbx.id and again.state == "running"
    ids = [s.id for s in Sandbox.list(client=client, labels={"suite": "sdk-python"})]
    assert sbx.id in ids
    assert sbx.refresh().state == "running"
    assert sbx.info["labels"] == {"suite": "sdk-python"}


def test_extend_moves_the_lease(sbx):
    before = sbx.refresh().ends_at
    sbx.extend(3500)
    assert sbx.id and sbx.state == "running"
    assert sbx.ends_at is not None and before is not None and sbx.ends_at >= before


def test_exec_basics(sbx):
    r = sbx.exec("nproc && id -un && pwd")
    assert r.ok, r
    assert r.stdout.split() == ["2", "user", "/workspace"]
    r = sbx.exec(["python3", "-c", "import sys; print(sys.stdin.read().upper()); sys.exit(3)"], stdin="abc")
    assert (r.exit_code, r.stdout) == (3, "ABC\n")
    r = sbx.exec("echo $GREETING; pwd", env={"GREETING": "hej"}, cwd="/tmp")
    assert r.stdout == "hej\n/tmp\n"
    with pytest.raises(CommandError):
        sbx.exec("false", check=True)


def test_exec_timeout_is_a_result(sbx):
    r = sbx.exec("echo started; sleep 30", timeout=2)
    assert r.timed_out and r.exit_code is None and r.stdout == "started\n"


def test_exec_streams_with_callbacks(sbx):
    chunks: list[str] = []
    errs: list[str] = []
    r = sbx.exec("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done; printf '\\xff\\xfe'",
                 on_stdout=chunks.append, on_stderr=errs.append, timeout=120)
    assert r.ok and not r.truncated
    assert "".join(chunks).startswith("out1\nout2\nout3\n") and len(chunks) >= 3
    assert "".join(errs) == "err1\nerr2\nerr3\n" and r.stderr == "err1\nerr2\nerr3\n"
    assert r.stdout.endswith("\ufffd\ufffd")  # raw bytes came as base64 and kept offsets straight


def test_streamed_exec_long_output_is_complete(sbx):
    r = sbx.exec("python3 -c \"import sys; [print(f'line {i:06d}') for i in range(40000)]\"", timeout=300)
    assert r.ok and not r.truncated
    lines = r.stdout.splitlines()
    assert len(lines) == 40000 and lines[-1] == "line 039999"


def test_files_roundtrip(sbx):
    d = _dir()
    assert sbx.files.write(f"{d}/a.txt", "héllo\n") == {"path": f"{d}/a.txt", "size": 7}
    assert sbx.files.read(f"{d}/a.txt") == "héllo\n".encode()
    assert sbx.files.read_text(f"{d}/a.txt") == "héllo\n"
    blob = bytes(range(256)) * 3
    sbx.files.write(f"{d}/sub dir/b.bin", blob, mode="755")
    assert sbx.files.read(f"{d}/sub dir/b.bin") == blob
    st = sbx.files.stat(f"{d}/sub dir/b.bin")
    assert st["exists"] is True and st["size"] == len(blob) and st["mode"] == "755"
    assert sbx.files.exists(f"{d}/nope") is False
    sbx.files.mkdir(f"{d}/x/y/z")
    paths = sorted(e["path"] for e in sbx.files.list(d, depth=3))
    assert f"{d}/a.txt" in paths and f"{d}/x/y/z" in paths and f"{d}/sub dir/b.bin" in paths
    with pytest.raises(FileNotFoundInSandboxError):
        sbx.files.read(f"{d}/missing")
    with pytest.raises(ConflictError):
        sbx.files.read(d)
    assert sbx.files.remove(f"{d}/a.txt") is True
    assert sbx.files.remove(d, recursive=True) is True
    assert not sbx.files.exists(d)


def test_relative_paths_resolve_under_workspace(sbx):
    name = f"rel-{uuid.uuid4().hex[:6]}.txt"
    sbx.files.write(name, "x")
    assert sbx.exec(["cat", f"/workspace/{name}"]).stdout == "x"
    sbx.files.remove(name)


def test_big_file_goes_up_in_parts(sbx):
    d = _dir()
    blob = os.urandom((1 << 20) * 2 + 12345)
    assert sbx.files.write(f"{d}/big.bin", blob)["size"] == len(blob)
    assert sbx.files.read(f"{d}/big.bin") == blob
    assert [e["name"] for e in sbx.files.list(d)] == ["big.bin"]  # no parts left behind
    sbx.files.remove(d, recursive=True)


@pytest.mark.parametrize("size", [5 << 20, (5 << 20) + 654321, (3 << 20) - 1])
def test_big_file_chunked_upload_roundtrip(sbx, size):
    d = _dir()
    blob = os.urandom(size)
    want = hashlib.sha256(blob).hexdigest()
    sent: list[tuple[str, str]] = []
    http = sbx.client._http
    hooks = http.event_hooks
    http.event_hooks = {**hooks, "request": [*hooks["request"], lambda r: sent.append((r.method, r.url.path))]}
    try:
        assert sbx.files.write(f"{d}/big.bin", blob, mode="750") == {"path": f"{d}/big.bin", "size": size}
    finally:
        http.event_hooks = hooks
    up = f"/v1/sandboxes/{sbx.id}/uploads"
    assert sent[0] == ("POST", up) and sent[-1][1].endswith(":commit")  # the uploads trio, no chmod needed
    chunks = -(-size // (1 << 20))
    assert len(sent) == chunks + 2 and all(m == "PUT" and p.startswith(up + "/") for m, p in sent[1:-1])
    got = sbx.files.read(f"{d}/big.bin")
    assert len(got) == size and hashlib.sha256(got).hexdigest() == want
    assert sbx.exec(["sha256sum", f"{d}/big.bin"]).stdout.split()[0] == want
    st = sbx.files.stat(f"{d}/big.bin")
    assert st["size"] == size and st["mode"] == "750"
    assert [e["name"] for e in sbx.files.list(d)] == ["big.bin"]
    sbx.files.remove(d, recursive=True)


def test_big_file_outside_workspace_goes_up_in_parts(sbx):
    target = f"/tmp/sdk-{uuid.uuid4().hex[:8]}.bin"
    blob = os.urandom((1 << 20) + 4321)
    assert sbx.files.write(target, blob, mode="600")["size"] == len(blob)
    assert sbx.exec(["sha256sum", target]).stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    assert sbx.files.stat(target)["mode"] == "600"
    assert sbx.exec(f"ls {target}.emberbox-* 2>/dev/null | wc -l").stdout.strip() == "0"
    sbx.exec(["rm", "-f", target])


def test_processes_spawn_output_wait_signal(sbx):
    p = sbx.processes.spawn("for i in 1 2 3; do echo tick$i; sleep 0.3; done")
    assert p.id and p.state == "running"
    assert any(x.id == p.id for x in sbx.processes.list())
    res = sbx.processes.wait(p.id)
    assert res.exit_code == 0 and res.stdout == "tick1\ntick2\ntick3\n"
    tail = sbx.processes.output(p.id, cursor=6)
    assert tail.stdout == "tick2\ntick3\n" and tail.exited and tail.next_cursor == 18
    assert sbx.processes.get(p.id).state == "exited"

    srv = sbx.processes.spawn(["python3", "-c", "import time\nprint('up', flush=True)\ntime.sleep(600)"])
    deadline = time.monotonic() + 30
    while "up" not in sbx.processes.output(srv.id).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    sbx.processes.signal(srv.id, "TERM")
    res = sbx.processes.wait(srv.id)
    assert res.exit_code != 0
    assert sbx.processes.get(srv.id).state != "running"

    events = list(sbx.processes.stream(sbx.processes.spawn("echo a; echo b >&2").id))
    assert [e.type for e in events if e.type != "truncated"][-1] == "exit"
    # stdout and stderr are two pipes: each keeps its order, but nothing
    # orders one against the other.
    assert "".join(e.data for e in events if e.type == "stdout") == "a\n"
    assert "".join(e.data for e in events if e.type == "stderr") == "b\n"


def test_errors_live(server, client):
    with pytest.raises(NotFoundError) as ei:
        Sandbox.connect("sbx_doesnotexist", client=client)
    assert ei.value.status == 404 and ei.value.request_id
    with Client(server.url, "not-a-key") as bad:
        with pytest.raises(AuthenticationError):
            Sandbox.list(client=bad)


def test_context_manager_stops_and_delete(client, created):
    with Sandbox.create(client=client, timeout_seconds=600, on_lease_end="delete", memory_mib=1024,
                        labels={"suite": "sdk-python", "case": "ctx"}) as box:
        created.append(box.id)
        assert box.exec("echo in-block").stdout == "in-block\n"
    state = box.wait_for("stopped", timeout_seconds=60).state
    assert state == "stopped"
    answer = box.delete()
    assert answer.get("id") == box.id
    with pytest.raises(NotFoundError):
        box.refresh()
