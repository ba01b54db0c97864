"""A smolagents executor that runs a CodeAgent's code in an Emberbox sandbox.

    from smolagents import CodeAgent
    from emberbox.smolagents import SandboxExecutor

    with CodeAgent(tools=[], model=model, executor=SandboxExecutor()) as agent:
        agent.run("...")

Each code step is one `Sandbox.run_code` in an interpreter context of its own (an
IPython kernel in the sandbox), so variables, imports and functions persist between
steps. Results come back the way smolagents' E2BExecutor returns them: the step's
value (its main result) as a PIL image for PNG/JPEG, else its richest other MIME
data (HTML, JSON, ..., text); `final_answer(...)` ends the run with its value; any
other exception becomes an AgentError carrying the step's output and traceback.
Values cross the boundary as smolagents' safe JSON (`allow_pickle=False` by default).

Needs `pip install 'emberbox[smolagents]'`.
"""
from __future__ import annotations

import base64
import json
import re
from io import BytesIO
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ._client import Client
from ._errors import EmberboxError
from ._execution import Context, Execution, Result
from ._sandbox import Sandbox

__all__ = ["SandboxExecutor", "PackageInstallError", "KernelError"]

WORKDIR = "/workspace"
CONTEXT_START_TIMEOUT_S = 300.0  # the first cell of a context waits for its kernel to start
# The MIME data returned for a main result that is not an image, in smolagents' E2BExecutor's order.
_OUTPUT_FIELDS = ("html", "javascript", "json", "latex", "markdown", "pdf", "svg", "text")
# Makes packages pip installed after the kernel started importable (a new user site dir).
_REFRESH_PATHS = ("def __emberbox_refresh_paths():\n"
                  "    import importlib, os, site, sys\n"
                  "    importlib.invalidate_caches()\n"
                  "    user_site = site.getusersitepackages()\n"
                  "    if os.path.isdir(user_site) and user_site not in sys.path:\n"
                  "        site.addsitedir(user_site)\n"
                  "__emberbox_refresh_paths()\n"
                  "del __emberbox_refresh_paths")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
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
    """The sandbox's interpreter could not start a Python context for the executor."""

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
        timeout_seconds: time limit of each code step; a step over it is interrupted (state kept).
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
        self.context: Context | None = None
        try:
            # Packages first: a kernel started afterwards sees them without a refresh.
            self.installed_packages = self.install_packages(self.additional_imports)
            self._start_context()
        except BaseException:
            self.cleanup()
            raise
        self.logger.log(f"Emberbox sandbox {sandbox.id} is running the Python interpreter", level=LogLevel.INFO)

    # -- the interpreter context ----------------------------------------------
    def _sbx(self) -> Sandbox:
        if self.sandbox is None:
            raise KernelError("this executor has been cleaned up")
        return self.sandbox

    def _start_context(self) -> None:
        """Makes this executor's own Python context and waits for its kernel."""
        sbx = self._sbx()
        try:
            self.context = sbx.interpreter.contexts.create(language="python", cwd=WORKDIR)
            self._warm_up()
        except EmberboxError as e:
            raise KernelError(f"the interpreter in sandbox {sbx.id} could not start a Python context: {e}") from e

    def _warm_up(self) -> None:
        """Runs a first cell with a generous limit (the kernel starts), which also makes
        packages installed since importable."""
        ex = self._sbx().run_code(_REFRESH_PATHS, context=self.context, timeout=CONTEXT_START_TIMEOUT_S)
        if ex.error is not None or ex.status in ("timeout", "lost"):
            why = f"{ex.error.name}: {ex.error.value}" if ex.error is not None else f"status {ex.status}"
            raise KernelError(f"the Python context in sandbox {self._sbx().id} did not start: {why}")

    def _restart_context(self) -> None:
        """Starts the context again (empty state), or a new one if it cannot be restarted
        (a context whose kernel died may be gone from the server)."""
        sbx = self._sbx()
        assert self.context is not None
        try:
            self.context = sbx.interpreter.contexts.restart(self.context)
        except EmberboxError:
            old, self.context = self.context, None
            try:
                sbx.interpreter.contexts.remove(old)
            except EmberboxError:
                pass
            self.context = sbx.interpreter.contexts.create(language="python", cwd=WORKDIR)
        self._warm_up()

    # -- RemotePythonExecutor --------------------------------------------------
    def run_code_raise_errors(self, code: str) -> CodeOutput:
        sbx = self._sbx()
        printed: list[str] = []  # stdout and stderr in the order they came
        try:
            execution = sbx.run_code(code, context=self.context, timeout=self.timeout_seconds,
                                     on_stdout=printed.append, on_stderr=printed.append)
        except EmberboxError as e:
            raise AgentError(f"Could not run the code in the sandbox: {e}", self.logger) from e
        logs = "".join(printed) if printed else execution.stdout + execution.stderr
        if execution.status == "lost":
            try:
                self._restart_context()
                restarted = "It was restarted"
            except EmberboxError as e:
                restarted = f"Restarting it failed ({e})"
            raise AgentError(
                f"{_logs_prefix(logs)}The Python process in the sandbox exited while running this step. "
                f"{restarted}: variables, imports and functions defined in earlier steps are gone and must be "
                "defined again.", self.logger)
        if execution.status == "timeout":
            raise AgentError(
                f"{_logs_prefix(logs)}Executing code yielded an error:\nTimeoutError: The code step did not "
                f"finish within {self.timeout_seconds:g} s and was interrupted; variables defined before it are "
                "kept.", self.logger)
        err = execution.error
        if err is not None:
            if err.name == RemotePythonExecutor.FINAL_ANSWER_EXCEPTION:
                value = self._deserialize_final_answer(err.value, self.allow_pickle)
                return CodeOutput(output=value, logs=logs, is_final_answer=True)
            raise AgentError(f"{_logs_prefix(logs)}Executing code yielded an error:\n{_error_text(err)}", self.logger)
        return CodeOutput(output=main_output(execution), logs=logs, is_final_answer=False)

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
            if self.context is not None:  # a running kernel must look for the new packages
                self._warm_up()
        return list(additional_imports)

    def cleanup(self) -> None:
        """Removes the executor's interpreter context; stops (or deletes) the sandbox if
        this executor created it."""
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
            elif self.context is not None:
                sbx.interpreter.contexts.remove(self.context)
        except EmberboxError as e:
            self.logger.log_error(f"Emberbox cleanup of {sbx.id} failed: {e}")
        finally:
            self.sandbox = None
            self.context = None


def main_output(execution: Execution) -> Any:
    """A step's value as smolagents' E2BExecutor returns it: the main result as a PIL
    image if it is a JPEG or PNG, else its first MIME data of html, javascript, json,
    latex, markdown, pdf, svg, text; None without a main result."""
    result = execution.main_result
    if result is None:
        return None
    image = result_image(result)
    if image is not None:
        return image
    for name in _OUTPUT_FIELDS:
        value = getattr(result, name)
        if value is not None:
            return value
    return None


def result_image(result: Result) -> Any:
    """The result's JPEG or PNG as a PIL image, or None."""
    for b64 in (result.jpeg, result.png):
        if b64 is not None:
            import PIL.Image

            return PIL.Image.open(BytesIO(base64.b64decode(b64.encode("ascii"))))
    return None


def _logs_prefix(logs: str) -> str:
    return f"{logs.rstrip()}\n" if logs.strip() else ""


def _error_text(err: Any) -> str:
    """The traceback without colour codes, ending with `Name: value`."""
    trace = _ANSI.sub("", err.traceback or "").rstrip()
    last = f"{err.name}: {err.value}" if err.value else err.name
    if not trace:
        return last
    return trace if trace.endswith(last) else f"{trace}\n{last}"
