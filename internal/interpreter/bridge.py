# Emberbox interpreter bridge: runs in the guest as the sandbox user, starts
# one IPython kernel (jupyter_client + ipykernel) and drives it for the host
# over a loopback TCP connection of JSON lines. Kept in the server's source
# and sent with every start, so it always matches the host.
#
# Start: stdin carries one line, the token. The bridge listens on
# 127.0.0.1:<any> and prints {"port": N, "cwd": dir} on stdout. A
# connection whose first line is the token becomes the host's (replacing
# the one before: after a pause and wake the host connects again); the
# bridge and its kernel live until "shutdown", or until the host kills it.
#
# Host -> bridge: {"op": "execute", "id", "code", "env"} |
#   {"op": "interrupt"} | {"op": "restart", "id"} | {"op": "shutdown"}
# Bridge -> host: {"ev": "ready"} (on each connection, once the kernel is
#   up) | {"ev": "fatal", "message"} | and with the request's id:
#   {"ev": "stdout"|"stderr", "text"} | {"ev": "count", "n"} |
#   {"ev": "result", "main", "data"} | {"ev": "error", "name", "value",
#   "traceback"} | {"ev": "end", "status": "ok"|"error"|"aborted"|"lost"} |
#   {"ev": "restarted"}
# Events are dropped while no host is connected.
import json
import os
import queue
import signal
import site
import socket
import sys
import threading
import time

MAX_EVENT = 16 << 20  # bytes of one event line
MAX_OUTPUT = 32 << 20  # bytes sent for one execution
START_TIMEOUT = 240

out_lock = threading.Lock()
conn = None

# An interrupt asked for during a cell. A SIGINT that reaches the kernel
# before the cell runs is lost, so it is sent again each second once the
# cell has started, until the cell reports an error or ends.
interrupt_wanted = threading.Event()

# Set once the kernel is up: a new connection is told "ready" at once.
kernel_ready = threading.Event()


def send(obj):
    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace") + b"\n"
    if len(line) > MAX_EVENT:
        return False
    with out_lock:
        if conn is None:
            return True  # nobody to tell: dropped, as the host expects
        try:
            conn.sendall(line)
        except OSError:
            pass
    return True


class Kernel:
    def __init__(self):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.kc = None
        self.pid = None

    def start(self, restart=False):
        if restart:
            if self.kc is not None:
                self.kc.stop_channels()
            self.km.restart_kernel(now=True)
        else:
            self.km.start_kernel(cwd=os.getcwd(), env=dict(os.environ))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=START_TIMEOUT)
        try:
            self.pid = self.km.provisioner.process.pid
        except Exception:
            self.pid = None
        # Plain tracebacks: they go to programs and language models, not
        # terminals.
        self.run_silent("get_ipython().run_line_magic('colors', 'nocolor')")

    def signal_interrupt(self):
        pid = self.pid
        if pid is None:
            return
        try:
            os.killpg(os.getpgid(pid), signal.SIGINT)
        except Exception:
            try:
                os.kill(pid, signal.SIGINT)
            except Exception:
                pass

    def alive(self):
        try:
            return self.km.is_alive()
        except Exception:
            return False

    def run_silent(self, code):
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False, stop_on_error=False)
        self.wait_idle(msg_id, None)

    def wait_idle(self, msg_id, on_msg, tick=None):
        """Reads iopub until the request's idle status; False if the kernel died."""
        while True:
            if tick is not None:
                tick()
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                if not self.alive():
                    return False
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg.get("msg_type")
            content = msg.get("content", {})
            if kind == "status":
                if content.get("execution_state") == "idle":
                    return True
                continue
            if on_msg is not None:
                on_msg(kind, content)

    def reply_status(self, msg_id):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_shell_msg(timeout=1)
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg.get("content", {}).get("status", "ok")
        return "ok"


def env_code(env, saving):
    if saving:
        return ("import os as __eb_os, json as __eb_json\n"
                "__eb_env = __eb_json.loads(%r)\n"
                "__eb_saved = {k: __eb_os.environ.get(k) for k in __eb_env}\n"
                "__eb_os.environ.update(__eb_env)\n" % json.dumps(env))
    return ("for __eb_k, __eb_v in __eb_saved.items():\n"
            "    if __eb_v is None: __eb_os.environ.pop(__eb_k, None)\n"
            "    else: __eb_os.environ[__eb_k] = __eb_v\n")


def execute(kernel, req):
    rid = req.get("id")
    env = req.get("env") or {}
    if env:
        kernel.run_silent(env_code(env, True))
    msg_id = kernel.kc.execute(req.get("code", ""), silent=False, store_history=True, allow_stdin=False,
                               stop_on_error=False)
    state = {"sent": 0, "dropped": False, "error": False, "started": False, "signalled": 0.0}

    def tick():
        if not interrupt_wanted.is_set() or not state["started"] or state["error"]:
            return
        now = time.monotonic()
        if now - state["signalled"] >= 1.0:
            state["signalled"] = now
            kernel.signal_interrupt()

    def emit(obj):
        obj["id"] = rid
        if state["dropped"]:
            return
        size = len(json.dumps(obj))
        if state["sent"] + size > MAX_OUTPUT:
            state["dropped"] = True
            return
        if send(obj):
            state["sent"] += size
        else:
            send({"ev": "stderr", "id": rid, "text": "[emberbox: an output of %d bytes was left out]\n" % size})

    def on_msg(kind, content):
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            emit({"ev": name, "text": content.get("text", "")})
        elif kind == "execute_input":
            state["started"] = True
            emit({"ev": "count", "n": content.get("execution_count")})
        elif kind in ("execute_result", "display_data"):
            emit({"ev": "result", "main": kind == "execute_result", "data": content.get("data", {})})
        elif kind == "error":
            state["error"] = True
            emit({"ev": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                  "traceback": "\n".join(content.get("traceback", []))})

    if not kernel.wait_idle(msg_id, on_msg, tick):
        send({"ev": "error", "id": rid, "name": "KernelDied",
              "value": "The kernel died during the execution; it was started again with empty state.",
              "traceback": ""})
        try:
            kernel.start(restart=True)
        except Exception as e:  # noqa: BLE001
            send({"ev": "fatal", "message": "restarting the kernel: %s" % e})
            raise
        send({"ev": "end", "id": rid, "status": "lost"})
        return
    status = kernel.reply_status(msg_id)
    if state["dropped"]:
        send({"ev": "stderr", "id": rid, "text": "[emberbox: output past %d bytes was left out]\n" % MAX_OUTPUT})
    if env:
        kernel.run_silent(env_code(env, False))
    if status == "ok" and state["error"]:
        status = "error"
    send({"ev": "end", "id": rid, "status": status})


def worker(kernel, jobs):
    try:
        kernel.start()
    except Exception as e:  # noqa: BLE001
        send({"ev": "fatal", "message": "starting the kernel: %s" % e})
        return
    kernel_ready.set()
    send({"ev": "ready"})
    while True:
        req = jobs.get()
        op = req.get("op")
        if op == "execute":
            execute(kernel, req)
        elif op == "restart":
            kernel.start(restart=True)
            send({"ev": "restarted", "id": req.get("id")})


def shutdown(kernel):
    # The kernel leads its own process group (jupyter_client starts it in
    # a new session): end it and whatever it started.
    if kernel.pid is not None:
        try:
            os.killpg(kernel.pid, signal.SIGKILL)
        except Exception:
            pass
    try:
        kernel.km.cleanup_resources()
    except Exception:
        pass
    os._exit(0)


def read(c, kernel, jobs):
    """Serves one host connection until it ends."""
    global conn
    reader = c.makefile("rb")
    try:
        while True:
            line = reader.readline(1 << 24)
            if not line:
                return
            try:
                req = json.loads(line)
            except ValueError:
                continue
            op = req.get("op")
            if op == "interrupt":
                interrupt_wanted.set()
            elif op == "shutdown":
                shutdown(kernel)
            elif op in ("execute", "restart"):
                if op == "execute":
                    interrupt_wanted.clear()  # one left from the cell before
                jobs.put(req)
    except OSError:
        return
    finally:
        try:
            c.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with out_lock:
            if conn is c:
                conn = None
        try:
            c.close()
        except OSError:
            pass


def accept(listener, token):
    """Returns the next connection that gives the token."""
    while True:
        c, _ = listener.accept()
        c.settimeout(10)
        try:
            first = c.makefile("rb").readline(256).strip().decode("ascii", "replace")
        except Exception:
            first = ""
        if first == token:
            c.settimeout(None)
            return c
        c.close()


def main():
    global conn
    token = sys.stdin.readline().strip()
    if not token:
        sys.exit("no token")
    os.makedirs(site.getusersitepackages(), exist_ok=True)  # so a later "pip install --user" is importable
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger, noisy on stderr
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    print(json.dumps({"port": listener.getsockname()[1], "cwd": os.getcwd()}), flush=True)
    kernel = Kernel()
    jobs = queue.Queue()
    started = False
    while True:
        c = accept(listener, token)
        # Cut the connection before first: a send blocked on it (a host
        # that went away without closing) then fails and lets go of the lock.
        old = conn
        if old is not None:
            try:
                old.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with out_lock:
            conn = c
        threading.Thread(target=read, args=(c, kernel, jobs), daemon=True).start()
        if not started:
            started = True
            threading.Thread(target=worker, args=(kernel, jobs), daemon=True).start()
        elif kernel_ready.is_set():
            send({"ev": "ready"})


main()
