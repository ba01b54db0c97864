"""Pause, wake, snapshots and fork through the real `withruntime==0.35.0` SDK.

These need a server whose VMM can pause, resume, snapshot and clone (the
QEMU driver's side of issue 9). Each test makes its own sandbox, since it
pauses or copies it; files live under /workspace so copies carry them.
"""
from __future__ import annotations

import uuid

import pytest
from _helpers import ok as _ok, poll as _poll
from withruntime import Sandbox

WS = "/workspace"


def _serve(box, port: int):
    """Starts an HTTP server in the sandbox and waits until it answers."""
    proc = box.spawn(f"python3 -m http.server {port}", cwd=WS)
    assert _poll(lambda: _answers(box, port), timeout_s=90, interval_s=1), "the HTTP server never answered"
    return proc


def _answers(box, port: int) -> bool:
    r = box.exec(f"curl -s --max-time 5 http://127.0.0.1:{port}/", timeout_ms=20_000)
    return r.exit_code == 0 and "Directory listing" in r.stdout


@pytest.fixture
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    yield b
    try:
        b.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {b.id} failed: {e}")


def test_pause_wake_keeps_files_and_processes(box):
    token = uuid.uuid4().hex
    box.files.write(f"{WS}/kept.txt", token)
    _serve(box, 8001)
    for cycle in range(3):
        box.pause()
        assert box.state == "paused", (cycle, box.info)
        assert box.info.get("pausedAt"), box.info
        box.wake()
        assert box.state == "running", (cycle, box.info)
        assert box.files.read(f"{WS}/kept.txt").decode() == token
        assert _answers(box, 8001), f"cycle {cycle}: the server started before the pause does not answer"
    # Waking a running sandbox is done, not an error (the SDK reads not_paused).
    assert box.wake().state == "running"


def test_auto_wake_on_exec(box):
    box.pause()
    assert box.refresh().state == "paused"
    r = box.exec("echo awake")
    _ok(r, "exec on a paused sandbox")
    assert r.stdout.strip() == "awake"
    assert box.refresh().state == "running"


def test_snapshot_and_create_from_it(box, runtime_client):
    box.files.write(f"{WS}/snap.txt", "from the snapshot")
    _serve(box, 8002)
    snap = box.snapshot(name="conformance", labels={"suite": "conformance"})
    assert snap["state"] == "ready" and snap["mode"] == "memory", snap
    assert snap["sourceSandboxId"] == box.id
    assert box.refresh().state == "running"
    assert runtime_client.snapshots.get(snap["id"])["id"] == snap["id"]
    assert snap["id"] in [s["id"] for s in runtime_client.snapshots.list(sandbox_id=box.id)]
    copy = Sandbox.create(client=runtime_client, snapshot=snap["id"])
    try:
        assert copy.state == "running" and copy.id != box.id
        assert copy.files.read(f"{WS}/snap.txt").decode() == "from the snapshot"
        assert _answers(copy, 8002), "the copy's server (running when the snapshot was taken) does not answer"
        # Copies do not share identity or randomness.
        a = box.exec("cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1")
        b = copy.exec("cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1")
        _ok(a, "identity of the source")
        _ok(b, "identity of the copy")
        assert a.stdout != b.stdout
    finally:
        copy.delete()
    runtime_client.snapshots.delete(snap["id"])


def test_disk_snapshot(box, runtime_client):
    box.files.write(f"{WS}/disk.txt", "on disk")
    box.exec("sync")
    snap = box.snapshot(mode="disk")
    assert snap["mode"] == "disk" and snap["state"] == "ready", snap
    copy = Sandbox.create(client=runtime_client, snapshot=snap["id"])
    try:
        assert copy.files.read(f"{WS}/disk.txt").decode() == "on disk"
    finally:
        copy.delete()
        runtime_client.snapshots.delete(snap["id"])


def test_fork(box):
    box.files.write(f"{WS}/fork.txt", "parent")
    _serve(box, 8003)
    copies = box.fork(count=2)
    try:
        assert len(copies) == 2
        for i, c in enumerate(copies):
            assert c.state == "running", c.info
            assert c.files.read(f"{WS}/fork.txt").decode() == "parent"
            assert _answers(c, 8003), f"copy {i}'s server does not answer"
            c.files.write(f"{WS}/fork.txt", f"copy {i}")
        # Their files diverge.
        assert copies[0].files.read(f"{WS}/fork.txt").decode() == "copy 0"
        assert copies[1].files.read(f"{WS}/fork.txt").decode() == "copy 1"
        assert box.files.read(f"{WS}/fork.txt").decode() == "parent"
    finally:
        for c in copies:
            c.delete()
