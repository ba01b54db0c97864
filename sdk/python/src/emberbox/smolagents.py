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

With `checkpoints=True` the executor checkpoints the sandbox after every code step
(labels `step-1`, `step-2`, ...; `step-0` is the state the first step started from),
so that `rollback(step)` can return the sandbox, Python session included, to the end
of an earlier step, and `branch(step, n)` can start n executors from there:

    executor = SandboxExecutor(checkpoints=True)
    agent = CodeAgent(tools=[], model=model, executor=executor)
    agent.run("...")                 # steps 1, 2, 3
    executor.rollback(2)             # files, processes and variables of the end of step 2
    agent.run("...", reset=False)    # goes on from there as step 3

Needs `pip install 'emberbox[smolagents]'`.
"""
from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ._client import Client
from ._errors import EmberboxError, NotFoundError
from ._execution import Context, Execution, Result
from ._sandbox import Sandbox

__all__ = ["SandboxExecutor", "PackageInstallError", "KernelError", "CheckpointError"]

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
    """The sandbox's interpreter could not start a Python context for the executor (or,
    after `rollback`, could not reach the restored one)."""

    code = "kernel_failed"


class CheckpointError(EmberboxError):
    """`rollback` or `branch` cannot be done: the executor was made without
    `checkpoints=True`, or it has no usable checkpoint of that step."""

    code = "checkpoint_unavailable"


@dataclass
class _StepCheckpoint:
    """The checkpoint taken at the end of a step, and the executor's own state then, which
    `rollback` puts back with it. `checkpoint_id` is None if the capture failed (`error`)."""

    step: int
    checkpoint_id: str | None
    context: Context | None = None
    owns_context: bool = True
    installed_packages: list[str] = field(default_factory=list)
    error: str = ""
    # pending: the capture was still going on when the step ended (taken in the
    # background); `_usable` waits for it before the checkpoint is used.
    pending: bool = False


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
        context: an interpreter context in `sandbox` to run the steps in, keeping its Python
            state (KernelError if it cannot be reached); by default the executor makes one of
            its own, and cleanup() removes only a context the executor made.
        checkpoints: checkpoint the sandbox after every code step, for `rollback` and `branch`.
        **create: more Sandbox.create arguments (vcpu, memory_mib, labels, ...).

    Checkpoints (`checkpoints=True`). A step is one call of the executor with the agent's
    code (`executor(code)`, as CodeAgent makes for each action; the code it sends with
    `send_tools` and `send_variables` is not a step). `step` counts them from 1, and after
    step N, whether its code failed or not, the sandbox is checkpointed with the label
    `step-N` (`step_checkpoints` maps N to the checkpoint's id). Before its first step the
    executor also takes `step-0`, the state after the agent sent its tools and variables.
    In an agent's first run N is its step number as long as every step has code in it (a
    step whose code cannot be parsed calls no executor); the agent numbers each run from 1
    again, while the executor counts on. A checkpoint
    holds memory, processes and disk, so it holds the Python session (the kernel of the
    executor's context) with its variables. A capture that fails does not fail the step:
    it is logged, and that step cannot be rolled back to. The capture runs in the
    background (`wait=False`): the step returns at once and the copy overlaps with the
    model's thinking, the sandbox's next call waiting for it only if the model answers
    first (a capture takes about a second on a slow host); `rollback` and `branch` wait for
    the checkpoint they use. Each checkpoint counts against the key's checkpoint space;
    the server keeps a bounded number per sandbox (20 by default), deleting the oldest past
    it or to make room in that space (a step whose checkpoint is gone cannot be rolled back to).
    cleanup() deletes the executor's checkpoints of a sandbox it was given (those of its
    own sandbox go with it).
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
        context: Context | str | None = None,
        checkpoints: bool = False,
        **create: Any,
    ) -> None:
        if logger is None:
            logger = AgentLogger(level=LogLevel.INFO)
        super().__init__(list(additional_imports or []), logger, allow_pickle)
        self.timeout_seconds = float(timeout_seconds)
        self.owns_sandbox = sandbox is None
        self.delete_on_cleanup = delete_on_cleanup
        self.checkpoints = bool(checkpoints)
        self.step = 0  # code steps run so far
        self._steps: dict[int, _StepCheckpoint] = {}
        if sandbox is None:
            if context is not None:
                raise ValueError("context= needs the sandbox= it lives in")
            labels = dict(create.pop("labels", None) or {})
            labels.setdefault("created_by", "emberbox-smolagents")
            sandbox = Sandbox.create(client=client, timeout_seconds=sandbox_timeout_seconds, labels=labels, **create)
        self.sandbox: Sandbox | None = sandbox
        self.context: Context | None = None
        self.owns_context = context is None
        self.kept_session = context is not None  # runs in a session it did not start (context=, branch)
        try:
            # Packages first: a kernel started afterwards sees them without a refresh.
            self.installed_packages = self.install_packages(self.additional_imports)
            if context is None:
                self._start_context()
            else:
                self.context = context if isinstance(context, Context) else Context(id=str(context))
                self._attach_context()
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

    def _attach_context(self) -> None:
        """Checks that the executor's context answers, by running the warm-up cell in it
        (which keeps its state); KernelError if it does not."""
        sbx = self._sbx()
        assert self.context is not None
        try:
            self._warm_up()
        except KernelError:
            raise
        except EmberboxError as e:
            raise KernelError(f"the Python context {self.context.id} in sandbox {sbx.id} cannot be reached: {e}") from e

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
            self.owns_context = True
        self._warm_up()

    # -- checkpoints -----------------------------------------------------------
    def __call__(self, code_action: str) -> CodeOutput:
        """Runs one code step of the agent; with checkpoints on, checkpoints the sandbox
        after it (and, before the first step, the state it starts from)."""
        if self.checkpoints and self.step not in self._steps:
            self._checkpoint_step(self.step)
        self.step += 1
        step = self.step
        try:
            output = super().__call__(code_action)
        except AgentError:  # the code failed, but it ran: the state it left is a step too
            if self.checkpoints:
                self._checkpoint_step(step)
            raise
        if self.checkpoints:
            self._checkpoint_step(step)
        return output

    @property
    def step_checkpoints(self) -> dict[int, str]:
        """The id of the checkpoint taken at the end of each step (0: before the first),
        for the steps that have one."""
        return {n: r.checkpoint_id for n, r in sorted(self._steps.items()) if r.checkpoint_id is not None}

    def _checkpoint_step(self, step: int) -> None:
        """Checkpoints the sandbox as `step-N` and remembers it with the executor's state.
        A failure is logged and remembered, never raised: the step itself went fine."""
        sbx = self._sbx()
        record = _StepCheckpoint(step, None, self.context, self.owns_context, list(self.installed_packages))
        try:
            checkpoint = sbx.checkpoint(f"step-{step}", wait=False)
        except EmberboxError as e:
            record.error = str(e)
        else:
            if checkpoint.ok or checkpoint.state == "capturing":
                record.checkpoint_id = checkpoint.id
                record.pending = checkpoint.state == "capturing"
            else:
                record.error = checkpoint.error or f"the capture ended in state {checkpoint.state}"
                self._delete_checkpoint(checkpoint.id)
        self._steps[step] = record
        if record.checkpoint_id is None:
            self.logger.log_error(f"Could not checkpoint sandbox {sbx.id} after step {step}: {record.error}")
        else:
            self.logger.log(f"Checkpoint {record.checkpoint_id} of sandbox {sbx.id} after step {step}",
                            level=LogLevel.DEBUG)

    def _delete_checkpoint(self, checkpoint_id: str) -> None:
        try:
            self._sbx().delete_checkpoint(checkpoint_id)
        except EmberboxError as e:
            self.logger.log(f"Could not delete checkpoint {checkpoint_id}: {e}", level=LogLevel.DEBUG)

    def _usable(self, step: int, what: str) -> _StepCheckpoint:
        """The record of a step that has a ready checkpoint, or CheckpointError saying why not."""
        if not self.checkpoints:
            raise CheckpointError(f"{what} needs checkpoints: make the executor with SandboxExecutor(checkpoints=True)")
        record = self._steps.get(step)
        if record is None:
            have = ", ".join(str(n) for n in sorted(self._steps)) or "none yet"
            raise CheckpointError(f"no checkpoint of step {step} (the steps with one: {have})")
        if record.pending and record.checkpoint_id is not None:
            try:
                checkpoint = self._sbx().wait_checkpoint(record.checkpoint_id)
            except NotFoundError as e:
                raise self._gone(record, e) from e
            record.pending = False
            if not checkpoint.ok:
                record.checkpoint_id = None
                record.error = checkpoint.error or f"the capture ended in state {checkpoint.state}"
        if record.checkpoint_id is None:
            raise CheckpointError(f"step {step} has no checkpoint: its capture failed ({record.error})")
        return record

    def _gone(self, record: _StepCheckpoint, e: NotFoundError) -> CheckpointError:
        """Forgets a step whose checkpoint the server no longer has."""
        self._steps.pop(record.step, None)
        return CheckpointError(
            f"the checkpoint of step {record.step} ({record.checkpoint_id}) is gone from the server, which deletes "
            f"a sandbox's oldest checkpoints past its bound per sandbox or to make room in the key's quota: {e}")

    def rollback(self, step: int) -> None:
        """Returns the sandbox to the end of step `step` (0: before the first step) and
        forgets the steps after it: their checkpoints are deleted, and the next step is
        numbered `step + 1`.

        Files, installed packages, processes and the Python session all come back as they
        were: the executor goes on in the context it used then, whose kernel, restored with
        the sandbox's memory, holds the variables of that step, and its list of installed
        packages is put back too. The agent's own memory of the later steps is not changed
        (drop them from `agent.memory.steps` if the model should not see them).

        Raises:
            CheckpointError: no checkpoints (`checkpoints=False`), or none usable of that step.
            KernelError: the sandbox was restored but its Python session could not be reached;
                the executor started a new, empty one (the agent sends its tools again at its
                next run) and can go on.
        """
        record = self._usable(step, "rollback")
        sbx = self._sbx()
        assert record.checkpoint_id is not None
        try:
            sbx.restore(record.checkpoint_id)
        except NotFoundError as e:
            if e.code == "checkpoint_not_found":
                raise self._gone(record, e) from e
            raise
        for later in sorted(n for n in self._steps if n > step):
            gone = self._steps.pop(later)
            if gone.checkpoint_id is not None:
                self._delete_checkpoint(gone.checkpoint_id)
        self.step = step
        self.context, self.owns_context = record.context, record.owns_context
        self.installed_packages = list(record.installed_packages)
        self.logger.log(f"Sandbox {sbx.id} rolled back to the end of step {step} ({record.checkpoint_id})",
                        level=LogLevel.INFO)
        if self.context is None:
            return
        try:
            self._attach_context()
        except KernelError as e:
            self._start_context()
            self.owns_context = True
            raise KernelError(
                f"sandbox {sbx.id} was rolled back to step {step}, but its Python session could not be reached "
                f"({e}); a new, empty session was started: variables of earlier steps must be defined again") from e

    def branch(self, step: int, n: int = 1, *, name: str | None = None,
               labels: Mapping[str, str] | None = None) -> list[SandboxExecutor]:
        """Makes `n` new sandboxes from the checkpoint of step `step` (0: before the first
        step) and returns an executor for each, to try different continuations side by side:
        `CodeAgent(tools=..., model=..., executor=e)` for each `e`.

        Each new executor owns its sandbox (cleanup() stops it, or deletes it with this
        executor's `delete_on_cleanup`), has this one's settings (`checkpoints` included,
        its own checkpoints starting with `step-{step}` at its first step) and numbers its
        steps on from `step`. Its sandbox has the step's files, packages and processes. It
        goes on in the step's Python session, which Emberbox carries into a branch; an older
        server that does not makes it start a new one instead, without the variables:
        `kept_session` tells which. This executor
        and its sandbox are not changed.

        Args:
            step: the step to branch from.
            n: how many executors (and sandboxes), 1 to 10.
            name: a name for the new sandboxes.
            labels: labels of the new sandboxes (`created_by: emberbox-smolagents` is added).

        Raises:
            CheckpointError: no checkpoints (`checkpoints=False`), or none usable of that step.
        """
        record = self._usable(step, "branch")
        sbx = self._sbx()
        assert record.checkpoint_id is not None
        all_labels = {"created_by": "emberbox-smolagents", **(labels or {})}
        try:
            boxes = sbx.branch(record.checkpoint_id, count=n, name=name, labels=all_labels)
        except NotFoundError as e:
            if e.code == "checkpoint_not_found":
                raise self._gone(record, e) from e
            raise
        made: list[SandboxExecutor] = []
        try:
            for box in boxes:
                made.append(self._branch_executor(box, record))
        except BaseException:
            for box in boxes:
                try:
                    box.delete()
                except EmberboxError as e:
                    self.logger.log_error(f"Could not delete branch sandbox {box.id}: {e}")
            raise
        return made

    def _branch_executor(self, box: Sandbox, record: _StepCheckpoint) -> SandboxExecutor:
        """An executor on a sandbox branched from `record`'s checkpoint, in the step's session if it is there."""
        settings: dict[str, Any] = {"logger": self.logger, "allow_pickle": self.allow_pickle, "sandbox": box,
                                    "timeout_seconds": self.timeout_seconds, "checkpoints": self.checkpoints}
        executor: SandboxExecutor | None = None
        if record.context is not None:
            try:
                executor = SandboxExecutor(context=record.context, **settings)
            except KernelError as e:
                self.logger.log(f"Branch sandbox {box.id} has no Python session of step {record.step} ({e}); "
                                "starting a new one", level=LogLevel.INFO)
        if executor is None:
            executor = SandboxExecutor(**settings)
        executor.owns_sandbox = True
        executor.delete_on_cleanup = self.delete_on_cleanup
        executor.owns_context = True
        executor.installed_packages = list(record.installed_packages)
        executor.step = record.step
        return executor

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

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Sends the agent's tools, as RemotePythonExecutor does, but patches `final_answer`
        only once. smolagents 1.26 patches it again at every `run()`, and a tool patched twice
        ships a `_forward` whose source still names a closure variable, so the second run's
        `final_answer(...)` fails in the sandbox with `NameError: allow_pickle_setting`. The
        first patch's source (with its setting written in) stays right for later runs."""
        final = tools.get("final_answer")
        if final is None or not _patched_final_answer(final):
            super().send_tools(tools)
            return
        setattr(self, "_patch_final_answer_with_exception", _already_patched)  # shadows the method
        try:
            super().send_tools(tools)
        finally:
            delattr(self, "_patch_final_answer_with_exception")

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
        """Removes the executor's interpreter context (if it made it) and its checkpoints;
        stops (or deletes) the sandbox instead if this executor created it."""
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
            else:
                for record in self._steps.values():
                    if record.checkpoint_id is not None:
                        self._delete_checkpoint(record.checkpoint_id)
                if self.context is not None and self.owns_context:
                    sbx.interpreter.contexts.remove(self.context)
        except EmberboxError as e:
            self.logger.log_error(f"Emberbox cleanup of {sbx.id} failed: {e}")
        finally:
            self.sandbox = None
            self.context = None
            self._steps.clear()


def _patched_final_answer(tool: Any) -> bool:
    """True if RemotePythonExecutor._patch_final_answer_with_exception has patched this tool
    (it swaps the tool's class for a `_FinalAnswerTool` subclass with the old forward as `_forward`)."""
    cls = type(tool)
    return cls.__name__ == "_FinalAnswerTool" and "_forward" in vars(cls)


def _already_patched(tool: Any) -> None:
    """Stands in for the patch of a final_answer tool patched by an earlier run."""


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
