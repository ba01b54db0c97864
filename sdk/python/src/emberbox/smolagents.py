"""A smolagents executor that runs a CodeAgent's code in an Emberbox sandbox.

    from smolagents import CodeAgent
    from emberbox.smolagents import SandboxExecutor

    with CodeAgent(tools=[], model=model, executor=SandboxExecutor()) as agent:
        agent.run("...")

State (variables, imports, functions) lives in one long-lived Python process in
the sandbox (the "kernel", `_guest/kernel.py`), started with the processes API.
Each code step is one short exec of `_guest/client.py`, which hands the code to
the kernel over a unix socket and prints the JSON answer. Values cross the
boundary as smolagents' safe JSON (`allow_pickle=False` by default).

Needs `pip install 'emberbox[smolagents]'`.
"""
from __future__ import annotations

import json
import re
import uuid
from importlib import resources
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ._client import Client
from ._errors import EmberboxError
from ._sandbox import Sandbox

__all__ = ["SandboxExecutor", "PackageInstallError", "KernelError"]

KERNEL_DIR = "/workspace/.emberbox"
STDIN_LIMIT = 512 * 1024  # bigger requests go through a file
# pip name -> import name, for the usual mismatches (and back).
_IMPORT_NAMES = {
    "pillow": "PIL", "scikit-learn": "sklearn", "beautifulsoup4": "bs4", "opencv-python": "cv2",
    "opencv-python-headless": "cv2", "pyyaml": "yaml", "python-dateutil": "dateutil",
    "attrs": "attr", "protobuf": "google.protobuf",
}
_PIP_NAMES = {v: k for k, v in _IMPORT_NAMES.items() if k not in ("opencv-python-headless",)}


class PackageInstallError(EmberboxError):
    """pip could not install a package in the sandbox."""

    code = "package_install_failed"

    def __init__(self, message: str, packages: list[str]) -> None:
        super().__init__(message)
        self.packages = packages


class KernelError(EmberboxError):
    """The in-sandbox Python process could not be started or reached."""

    code = "kernel_failed"


def _requirement_to_module(req: str) -> tuple[str, str] | None:
    """('numpy>=1', 'numpy.*', 'PIL', 'scikit-learn') -> (pip spec, top-level module); None for '*'."""
    spec = req.strip()
    name = re.split(r"[<>=!~\[;@ ]", spec, maxsplit=1)[0]
    is_pattern = name.endswith(".*")
    if is_pattern:
        name = name[:-2]
    if not name or name == "*":
        return None
    if name.lower() in _IMPORT_NAMES:  # a pip name whose module is called differently
        return spec, _IMPORT_NAMES[name.lower()].split(".")[0]
    top = name.split(".")[0]
    if top in _PIP_NAMES:  # a module name whose pip name differs
        return _PIP_NAMES[top], top
    if is_pattern or "." in name:
        spec = top
    return spec, top.replace("-", "_")


class SandboxExecutor(RemotePythonExecutor):
    """Runs CodeAgent code in an Emberbox sandbox, keeping Python state between steps.

    Args:
        additional_imports: packages to make importable first; those that already import are
            skipped, the others are pip-installed (which needs network egress in the sandbox).
        logger: a smolagents logger (defaults to one at INFO level).
        allow_pickle: let values that safe JSON cannot carry cross as pickle (runs code on unpickling).
        sandbox: a running Sandbox to use; it is left running by cleanup(). Without it the
            executor creates one (with `create` and `sandbox_timeout_seconds`) and cleanup() stops it.
        timeout_seconds: time limit of each code step.
        client: the Client used to create a sandbox.
        delete_on_cleanup: delete (instead of stop) a sandbox this executor created.
        sandbox_timeout_seconds: the lease of a sandbox this executor creates.
        **create: more Sandbox.create arguments (vcpu, memory_mib, labels, ...).
    """

    def __init__(
        self,
        additional_imports: list[str] | None = None,
        logger: Any = None,
        allow_pickle: bool = False,
        *,
        sandbox: Sandbox | None = None,
        timeout_seconds: float = 120.0,
        client: Client | None = None,
        delete_on_cleanup: bool = False,
        sandbox_timeout_seconds: int | None = None,
        **create: Any,
    ) -> None:
        if logger is None:
            logger = AgentLogger(level=LogLevel.INFO)
        super().__init__(list(additional_imports or []), logger, allow_pickle)
        self.timeout_seconds = float(timeout_seconds)
        self.owns_sandbox = sandbox is None
        self.delete_on_cleanup = delete_on_cleanup
        if sandbox is None:
            labels = dict(create.pop("labels", None) or {})
            labels.setdefault("created_by", "emberbox-smolagents")
            sandbox = Sandbox.create(client=client, timeout_seconds=sandbox_timeout_seconds, labels=labels, **create)
        self.sandbox: Sandbox | None = sandbox
        tag = uuid.uuid4().hex[:10]
        self._kernel_path = f"{KERNEL_DIR}/kernel.py"
        self._client_path = f"{KERNEL_DIR}/client.py"
        self._socket = f"/tmp/emberbox-kernel-{tag}.sock"
        self._process_id: str | None = None
        try:
            self._start_kernel()
            self.installed_packages = self.install_packages(self.additional_imports)
        except BaseException:
            self.cleanup()
            raise
        self.logger.log(f"Emberbox sandbox {sandbox.id} is running the Python kernel", level=LogLevel.INFO)

    # -- kernel ---------------------------------------------------------------
    def _sbx(self) -> Sandbox:
        if self.sandbox is None:
            raise KernelError("this executor has been cleaned up")
        return self.sandbox

    def _start_kernel(self) -> None:
        sbx = self._sbx()
        guest = resources.files("emberbox") / "_guest"
        sbx.files.write(self._kernel_path, (guest / "kernel.py").read_bytes())
        sbx.files.write(self._client_path, (guest / "client.py").read_bytes())
        proc = sbx.processes.spawn(["python3", "-u", self._kernel_path, self._socket], cwd="/workspace")
        self._process_id = proc.id
        answer = self._call({"op": "ping"}, connect_wait=60.0, timeout=90.0)
        if not answer.get("ok"):
            raise KernelError(f"the Python kernel did not start in sandbox {sbx.id}: {answer}")

    def _kernel_log(self) -> str:
        if self.sandbox is None or self._process_id is None:
            return ""
        try:
            out = self.sandbox.processes.output(self._process_id)
            return (out.stdout + out.stderr)[-2000:]
        except EmberboxError:
            return ""

    def _restart_kernel(self) -> str:
        """Kills and restarts the kernel; returns what its log said."""
        log = self._kernel_log()
        if self.sandbox is not None and self._process_id is not None:
            try:
                self.sandbox.processes.kill(self._process_id)
            except EmberboxError:
                pass
        self._process_id = None
        self._start_kernel()
        return log

    def _call(self, request: dict[str, Any], *, connect_wait: float = 5.0, timeout: float | None = None
              ) -> dict[str, Any]:
        """Sends one request to the kernel. Returns its answer, or a dict with
        `kernel_unreachable` / `kernel_died` / `timed_out`."""
        sbx = self._sbx()
        payload = json.dumps(request)
        limit = timeout if timeout is not None else self.timeout_seconds + 30.0
        argv = ["python3", self._client_path, self._socket, str(connect_wait)]
        if len(payload) > STDIN_LIMIT:
            req_path = f"{KERNEL_DIR}/request-{uuid.uuid4().hex[:10]}.json"
            sbx.files.write(req_path, payload)
            cmd = " ".join(_sh(a) for a in argv) + f" < {_sh(req_path)}; s=$?; rm -f {_sh(req_path)}; exit $s"
            r = sbx.exec(cmd, timeout=limit)
        else:
            r = sbx.exec(argv, stdin=payload, timeout=limit)
        if r.timed_out:
            return {"timed_out": True}
        try:
            answer = json.loads(r.stdout) if r.stdout.strip() else {}
        except json.JSONDecodeError:
            answer = {}
        if not isinstance(answer, dict) or not answer:
            return {"kernel_died": True, "detail": (r.stderr or r.stdout)[-2000:], "exit_code": r.exit_code}
        return answer

    # -- RemotePythonExecutor --------------------------------------------------
    def run_code_raise_errors(self, code: str) -> CodeOutput:
        answer = self._call({"op": "run", "code": code, "timeout": self.timeout_seconds})
        if answer.get("timed_out") or answer.get("kernel_died") or answer.get("kernel_unreachable"):
            if answer.get("timed_out"):
                why = (f"The code step did not finish within {self.timeout_seconds:g} s and could not be "
                       "interrupted")
            else:
                why = "The Python process in the sandbox exited while running this step"
            log = self._restart_kernel()
            detail = f"\nIts last output:\n{log}" if log.strip() else ""
            raise AgentError(
                f"{why}. It was restarted: variables, imports and functions defined in earlier steps "
                f"are gone and must be defined again.{detail}", self.logger)
        logs = str(answer.get("logs") or "")
        if answer.get("ok"):
            return CodeOutput(output=answer.get("output"), logs=logs, is_final_answer=False)
        if "final_answer" in answer:
            value = self._deserialize_final_answer(str(answer["final_answer"]), self.allow_pickle)
            return CodeOutput(output=value, logs=logs, is_final_answer=True)
        err = answer.get("error") or {}
        trace = str(err.get("traceback") or "").rstrip()
        if not trace:
            trace = f"{err.get('name', 'Error')}: {err.get('value', '')}"
        prefix = f"{logs.rstrip()}\n" if logs.strip() else ""
        raise AgentError(f"{prefix}Executing code yielded an error:\n{trace}", self.logger)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Makes the packages importable: skips those that import already, pip-installs the rest,
        and raises PackageInstallError naming the packages when pip fails."""
        wanted: dict[str, str] = {}
        for req in additional_imports:
            if not req or req.strip() == "smolagents":
                continue
            pm = _requirement_to_module(req)
            if pm is not None:
                wanted[pm[0]] = pm[1]
        if not wanted:
            return list(additional_imports)
        sbx = self._sbx()
        check = ("import importlib.util, json, sys\n"
                 "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")
        r = sbx.exec(["python3", "-c", check, *sorted(set(wanted.values()))], timeout=60)
        try:
            missing_modules = set(json.loads(r.stdout))
        except (json.JSONDecodeError, TypeError):
            missing_modules = set(wanted.values())
        missing = [pkg for pkg, mod in wanted.items() if mod in missing_modules]
        if missing:
            self.logger.log(f"Installing {', '.join(missing)} in sandbox {sbx.id}", level=LogLevel.INFO)
            pip = sbx.exec(["python3", "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                            "--progress-bar", "off", *missing], timeout=900)
            if not pip.ok:
                tail = (pip.stderr or pip.stdout).strip()[-1500:]
                why = "timed out" if pip.timed_out else f"exited {pip.exit_code}"
                raise PackageInstallError(
                    f"Could not install {', '.join(missing)} in sandbox {sbx.id}: pip {why}. "
                    "Installing packages needs network egress from the sandbox; packages that are "
                    f"already in the image (numpy, pillow, ...) need no install.\npip said:\n{tail}",
                    missing)
        return list(additional_imports)

    def cleanup(self) -> None:
        """Ends the kernel; stops (or deletes) the sandbox if this executor created it."""
        sbx = self.sandbox
        if sbx is None:
            return
        try:
            if self.owns_sandbox:
                if self.delete_on_cleanup:
                    sbx.delete()
                else:
                    sbx.stop(wait=False)
                sbx.close()
            elif self._process_id is not None:
                sbx.processes.kill(self._process_id)
        except EmberboxError as e:
            self.logger.log_error(f"Emberbox cleanup of {sbx.id} failed: {e}")
        finally:
            self.sandbox = None
            self._process_id = None


def _sh(s: str) -> str:
    import shlex

    return shlex.quote(s)
