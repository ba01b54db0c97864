"""Process input, pty processes and the terminal through the real `withruntime==0.35.0` SDK.

One sandbox serves every test but the last, which stops its own.
"""
from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest
from withruntime import Sandbox


@pytest.fixture(scope="module")
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    yield b
    try:
        b.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {b.id} failed: {e}")


@contextmanager
def _deadline(seconds: int):
    """Fails the test instead of hanging if a terminal never answers: the
    SDK's WebSocket reads have no timeout."""
    def fail(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _read_until(term, want: str) -> str:
    """Reads the terminal's bytes until they contain want."""
    got = b""
    while want.encode() not in got:
        chunk = term.recv()
        assert chunk is not None, f"the terminal ended before {want!r}; it printed {got!r}"
        got += chunk
    return got.decode(errors="replace")


def test_spawn_stdin_pipe_write_eof(box):
    proc = box.spawn("read x; echo got:$x; cat", stdin="pipe")
    assert proc.info.get("stdinOpen") is True, proc.info
    assert proc.info.get("stdinOffset") == 0, proc.info
    assert proc.user == "sandbox", proc.info
    proc.write("hello\n")
    proc.write("the rest", eof=True)
    result = proc.wait()
    assert result.exit_code == 0, result
    assert result.stdout == "got:hello\nthe rest", result.stdout
    info = proc.refresh()
    assert info["stdinOpen"] is False and info["stdinOffset"] == len("hello\nthe rest"), info


def test_spawn_pty_python_and_resize(box):
    py = box.spawn("python3 -i", pty={"cols": 80, "rows": 24})
    assert py.info.get("pty") == {"cols": 80, "rows": 24}, py.info
    py.write("1+1\nexit()\n")
    result = py.wait()
    assert result.exit_code == 0, result
    assert "\r\n2\r\n" in result.stdout, result.stdout

    sized = box.spawn("read; stty size", pty={"cols": 80, "rows": 24})
    sized.resize(100, 30)
    assert sized.refresh()["pty"] == {"cols": 100, "rows": 30}
    sized.write("\n")
    assert "30 100" in sized.wait().stdout


def test_spawn_base64_output(box):
    proc = box.spawn("printf 'a\\377b'", output_encoding="base64")
    data = b"".join(ev["data"] for ev in proc.output_bytes() if ev["type"] == "stdout")
    assert data == b"a\xffb"


def test_terminal_python_and_reattach(box):
    with _deadline(180):
        term = box.terminal(cols=80, rows=24, command="python3 -i")
        assert term.process_id
        _read_until(term, ">>> ")
        term.write("1+1\n")
        _read_until(term, "2\r\n>>> ")
        term.resize(100, 30)
        term.close()

        again = box.terminal(process_id=term.process_id)
        assert again.process_id == term.process_id
        _read_until(again, "1+1\r\n2\r\n>>> ")  # replayed from the process's output
        again.write("import shutil; print(shutil.get_terminal_size())\n")
        _read_until(again, "columns=100, lines=30")
        again.write("exit(5)\n")
        while again.recv() is not None:
            pass
        assert again.exit_code == 5


def test_terminal_refused_when_not_running(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=600)
    try:
        b.stop()
        with _deadline(60), pytest.raises(ConnectionRefusedError, match="409"):
            b.terminal()
    finally:
        b.delete()
