"""Emberbox kernel: one long-lived Python interpreter inside the sandbox.

Started once per executor (`python3 -u kernel.py SOCKET`) through the processes
API. It serves one request at a time on a unix socket; each request is a frame
(8-byte big-endian length, then UTF-8 JSON) and so is each answer.

Request:  {"op": "run", "code": str, "timeout": float} | {"op": "ping"}
Answer:   {"ok": true, "logs": str, "output": str|null}
        | {"ok": false, "logs": str, "error": {"name", "value", "traceback"}}
        | {"ok": false, "logs": str, "final_answer": str}  (FinalAnswerException's value)

Code runs in one persistent namespace (globals == locals, like a notebook).
When the last statement is an expression, its repr is the output. stdout and
stderr of the code (and of its child processes) are captured at the fd level.
A step's timeout raises StepTimeout (a BaseException) inside the code.
This file uses the standard library only.
"""
import ast
import importlib
import json
import linecache
import os
import signal
import site
import socket
import struct
import sys
import tempfile
import traceback

MAX_LOG_CHARS = 200_000
MAX_OUTPUT_CHARS = 100_000


class StepTimeout(BaseException):
    """Raised inside user code when the step's time is up."""


def _alarm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise StepTimeout("the code step ran out of time")


NAMESPACE = {"__name__": "__main__", "__builtins__": __builtins__}
_cell = [0]


def _refresh_paths():
    importlib.invalidate_caches()
    try:
        user_site = site.getusersitepackages()
        if os.path.isdir(user_site) and user_site not in sys.path:
            site.addsitedir(user_site)
    except Exception:  # noqa: BLE001
        pass


def _compile(code):
    _cell[0] += 1
    filename = f"<step {_cell[0]}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    expr = compile(last, filename, "eval") if last is not None else None
    return body, expr


def _clip(text, limit):
    if len(text) <= limit:
        return text
    return f"[{len(text) - limit} earlier characters omitted]\n" + text[-limit:]


def _user_traceback(exc, name=None, value=None):
    if name is not None:  # report as `name: value`, showing only the step's own frames
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<step ")]
        head = "Traceback (most recent call last):\n" if frames else ""
        return head + "".join(traceback.format_list(frames)) + f"{name}: {value}\n"
    tb = exc.__traceback__
    # Drop the kernel's own frames: keep from the first frame of the step on.
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<step "):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def run(code, timeout):
    _refresh_paths()
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    capture = tempfile.TemporaryFile()
    os.dup2(capture.fileno(), 1)
    os.dup2(capture.fileno(), 2)
    answer = {"ok": True, "output": None}
    try:
        if timeout and timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, float(timeout))
        try:
            body, expr = _compile(code)
            exec(body, NAMESPACE)  # noqa: S102 - this is the point
            if expr is not None:
                value = eval(expr, NAMESPACE)  # noqa: S307
                if value is not None:
                    answer["output"] = _clip(repr(value), MAX_OUTPUT_CHARS)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as e:  # noqa: BLE001 - everything the code raises is reported
        answer["ok"] = False
        if type(e).__name__ == "FinalAnswerException":
            answer["final_answer"] = getattr(e, "value", None)
        else:
            if isinstance(e, StepTimeout):
                name, value = "TimeoutError", f"The code step did not finish within {timeout:g} s and was interrupted"
                trace = _user_traceback(e, name, value)
            else:
                name, value = type(e).__name__, str(e)
                trace = _user_traceback(e)
            answer["error"] = {"name": name, "value": value, "traceback": trace}
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        capture.seek(0)
        logs = capture.read().decode("utf-8", errors="replace")
        capture.close()
    answer["logs"] = _clip(logs, MAX_LOG_CHARS)
    return answer


def _recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def serve(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    os.chmod(path + ".tmp", 0o600)
    srv.listen(4)
    os.rename(path + ".tmp", path)  # the socket appears only once it accepts
    signal.signal(signal.SIGALRM, _alarm)
    print(f"emberbox kernel ready on {path} (pid {os.getpid()})", flush=True)
    while True:
        conn, _ = srv.accept()
        try:
            (n,) = struct.unpack(">Q", _recv_exact(conn, 8))
            req = json.loads(_recv_exact(conn, n).decode("utf-8"))
            if req.get("op") == "ping":
                answer = {"ok": True, "pid": os.getpid(), "python": sys.version.split()[0]}
            elif req.get("op") == "run":
                answer = run(req.get("code", ""), req.get("timeout"))
            else:
                answer = {"ok": False, "logs": "", "error": {"name": "ProtocolError",
                                                             "value": f"unknown op {req.get('op')!r}",
                                                             "traceback": ""}}
            data = json.dumps(answer).encode("utf-8")
            conn.sendall(struct.pack(">Q", len(data)) + data)
        except Exception as e:  # noqa: BLE001 - one bad client must not end the kernel
            print(f"emberbox kernel: request failed: {e!r}", file=sys.stderr, flush=True)
        finally:
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
