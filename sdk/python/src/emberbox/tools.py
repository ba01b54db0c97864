"""Four agent tools bound to one sandbox: run a command, read, write and list files.

`sandbox_tools(sbx)` returns plain functions with type hints and Google-style
docstrings, so agent frameworks can wrap them as they are, e.g. in smolagents
`[tool(f) for f in sandbox_tools(sbx)]`. The model chooses commands and paths,
never the sandbox. Failures come back as text the model can act on, not as
exceptions. Given an AsyncSandbox, the same four tools are coroutines.

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
) -> list[Callable[..., Any]]:
    """Returns [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]
    bound to `sbx` (coroutine functions for an AsyncSandbox)."""
    if isinstance(sbx, AsyncSandbox):
        return async_sandbox_tools(sbx, root=root, timeout_seconds=timeout_seconds,
                                   max_output_chars=max_output_chars)
    if not isinstance(sbx, Sandbox):
        raise TypeError(f"sandbox_tools needs an emberbox Sandbox or AsyncSandbox, got {type(sbx).__name__}")
    return _sync_sandbox_tools(sbx, root=root, timeout_seconds=timeout_seconds, max_output_chars=max_output_chars)
