"""Four agent tools bound to one sandbox: run a command, read, write and list files
(and, opt-in, a fifth that undoes the last change).

`sandbox_tools(sbx)` returns plain functions with type hints and Google-style
docstrings, so agent frameworks can wrap them as they are, e.g. in smolagents
`[tool(f) for f in sandbox_tools(sbx)]`. The model chooses commands and paths,
never the sandbox. Failures come back as text the model can act on, not as
exceptions. Given an AsyncSandbox, the same tools are coroutines.

`sandbox_tools(sbx, undo=True)` adds `runtime_undo`. "Undo" needs a state to go
back to, so with it on the tool set checkpoints the sandbox (`sbx.checkpoint`,
labels `undo-1`, `undo-2`, ...) just before each runtime_exec and
runtime_write_file call, the two tools that change it, and keeps the last 20
in a stack of its own; runtime_undo restores the newest (`sbx.restore`), deletes
it and pops it, so calling it again goes further back. A capture that fails does
not stop the change: undoing it then answers why it cannot. The four tools
answer as before; each change just takes a capture longer. The stack belongs to
the tool set: changes made some other way (another tool set, `sbx.exec` from
your code) are not undo steps, but a restore undoes them too if they came after
the checkpoint. Checkpoints are per sandbox, so this works for a
ToolCallingAgent, whose tools run here; a CodeAgent's tools run inside the
sandbox, where none of this can reach: use `SandboxExecutor(checkpoints=True)`
and its `rollback` for that.

The tools are written once, as coroutine functions, in _async_tools.py; the plain ones
in _tools.py are generated from them by scripts/unasync.py. Hints use `X | None` (not
typing.Optional) so that they survive smolagents' remote-executor code generation. Do
not add `from __future__ import annotations` to those modules: smolagents reads the
hints at runtime.
"""
from collections.abc import Callable
from typing import Any

from ._async_sandbox import AsyncSandbox
from ._async_tools import async_sandbox_tools
from ._sandbox import Sandbox
from ._tools import sandbox_tools as _sync_sandbox_tools
from ._tools_common import MAX_LIST_ENTRIES, clip, clip_head, resolve_path  # noqa: F401 - re-exported

__all__ = ["sandbox_tools", "async_sandbox_tools", "resolve_path", "clip"]


def sandbox_tools(
    sbx: Any,
    root: str = "/workspace",
    timeout_seconds: int = 300,
    max_output_chars: int = 20000,
    undo: bool = False,
) -> list[Callable[..., Any]]:
    """Returns [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]
    bound to `sbx` (coroutine functions for an AsyncSandbox), and runtime_undo last with
    `undo=True` (which checkpoints the sandbox before each runtime_exec and
    runtime_write_file call; see the module's docstring)."""
    if isinstance(sbx, AsyncSandbox):
        return async_sandbox_tools(sbx, root=root, timeout_seconds=timeout_seconds,
                                   max_output_chars=max_output_chars, undo=undo)
    if not isinstance(sbx, Sandbox):
        raise TypeError(f"sandbox_tools needs an emberbox Sandbox or AsyncSandbox, got {type(sbx).__name__}")
    return _sync_sandbox_tools(sbx, root=root, timeout_seconds=timeout_seconds, max_output_chars=max_output_chars,
                               undo=undo)
