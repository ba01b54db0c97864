"""Four agent tools bound to one sandbox: run a command, read, write and list files.

`sandbox_tools(sbx)` returns plain functions with type hints and Google-style
docstrings, so agent frameworks can wrap them as they are, e.g. in smolagents
`[tool(f) for f in sandbox_tools(sbx)]`. The model chooses commands and paths,
never the sandbox. Failures come back as text the model can act on, not as
exceptions. Given an AsyncSandbox, the same four tools are coroutines.

Hints use `X | None` (not typing.Optional) so that they survive smolagents'
remote-executor code generation. Do not add `from __future__ import
annotations` here: smolagents reads the hints at runtime.
"""
import posixpath
from collections.abc import Callable
from typing import Any

from ._async_sandbox import AsyncSandbox
from ._errors import APIError, EmberboxError
from ._sandbox import Sandbox
from ._types import CommandResult

__all__ = ["sandbox_tools", "async_sandbox_tools", "resolve_path", "clip"]

MAX_LIST_ENTRIES = 1000


def resolve_path(path: str | None, root: str = "/workspace") -> str:
    """Absolute paths are normalised; relative ones (and "~/...") resolve under root."""
    p = (path or ".").strip() or "."
    if p == "~" or p.startswith("~/"):
        p = p[2:] or "."
    return posixpath.normpath(posixpath.join(root, p))


def clip(text: str, limit: int) -> str:
    """Keeps the last `limit` characters, saying how many earlier ones were left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"[{len(text) - limit} earlier characters omitted]\n" + text[-limit:]


def clip_head(text: str, limit: int) -> str:
    """Keeps the first `limit` characters, saying how many later ones were left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[:limit] + f"\n[{len(text) - limit} more characters not shown]"


def _describe(e: Exception) -> str:
    if isinstance(e, APIError):
        msg = f"{e.code}: {e.message}"
        return msg + (f" ({e.hint})" if e.hint else "")
    return f"{type(e).__name__}: {e}"


def _exec_dict(r: CommandResult, limit: int) -> dict:
    stderr = clip(r.stderr, limit)
    if r.truncated:
        stderr += "\n[the sandbox dropped some output of this command]"
    return {"exit_code": r.exit_code, "stdout": clip(r.stdout, limit), "stderr": stderr, "timed_out": r.timed_out}


def _exec_error(e: Exception) -> dict:
    return {"exit_code": None, "stdout": "", "stderr": f"Could not run the command: {_describe(e)}",
            "timed_out": False}


def _entries(raw: list[dict[str, Any]]) -> list:
    out: list = []
    for e in raw[:MAX_LIST_ENTRIES]:
        kind = e.get("type") or "other"
        out.append({"path": e.get("path"), "type": kind if kind in ("file", "directory", "symlink") else "other",
                    "size": e.get("size", 0)})
    if len(raw) > MAX_LIST_ENTRIES:
        out.append({"note": f"{len(raw) - MAX_LIST_ENTRIES} more entries not shown"})
    return out


def _depth(depth: int | None) -> int:
    try:
        return max(1, min(10, int(depth or 1)))
    except (TypeError, ValueError):
        return 1


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
    default_timeout = timeout_seconds
    limit = max_output_chars

    def runtime_exec(command: str, cwd: str | None = None, timeout_seconds: int | None = None) -> dict:
        """Runs a bash command in the sandbox (a Linux machine with python3, pip, node, go, gcc and
        passwordless sudo) and returns its exit code, stdout and stderr. Files, installed packages
        and the working tree persist between calls.

        Args:
            command: The command, run under `bash -c`, e.g. `pytest -q` or `ls -la && cat setup.py`.
            cwd: Working directory; relative paths resolve under /workspace (the default).
            timeout_seconds: Stop the command after this many seconds and report timed_out (default 300).

        Returns:
            A dict with exit_code (None if it did not exit by itself), stdout, stderr and timed_out.
        """
        try:
            r = sbx.exec(command, cwd=resolve_path(cwd, root),
                         timeout=float(timeout_seconds or default_timeout), stream=True)
        except (EmberboxError, ValueError) as e:
            return _exec_error(e)
        return _exec_dict(r, limit)

    def runtime_read_file(path: str) -> str:
        """Reads a text file from the sandbox.

        Args:
            path: File path; relative paths resolve under /workspace.

        Returns:
            The file's text, or a message saying why it could not be read.
        """
        p = resolve_path(path, root)
        try:
            data = sbx.files.read(p)
        except APIError as e:
            if e.status == 404:
                return f"No such file: {p}"
            return f"Could not read {p}: {_describe(e)}"
        except EmberboxError as e:
            return f"Could not read {p}: {_describe(e)}"
        return clip_head(data.decode("utf-8", errors="replace"), limit)

    def runtime_write_file(path: str, content: str) -> str:
        """Creates or replaces a text file in the sandbox, making parent directories as needed.

        Args:
            path: File path; relative paths resolve under /workspace.
            content: The complete new text of the file.

        Returns:
            A confirmation with the number of bytes written, or a message saying why it failed.
        """
        p = resolve_path(path, root)
        try:
            info = sbx.files.write(p, content)
        except EmberboxError as e:
            return f"Could not write {p}: {_describe(e)}"
        return f"Wrote {info['size']} bytes to {p}"

    def runtime_list_files(path: str = ".", depth: int = 1) -> list:
        """Lists a directory in the sandbox with each entry's path, type and size.

        Args:
            path: Directory; relative paths resolve under /workspace.
            depth: How many levels to descend; 1 lists direct children only (at most 10).

        Returns:
            A list of {path, type, size} dicts (type is file, directory, symlink or other).
        """
        p = resolve_path(path, root)
        try:
            return _entries(sbx.files.list(p, depth=_depth(depth), hidden=True))
        except EmberboxError as e:
            return [{"error": f"Could not list {p}: {_describe(e)}"}]

    return [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]


def async_sandbox_tools(
    sbx: AsyncSandbox,
    root: str = "/workspace",
    timeout_seconds: int = 300,
    max_output_chars: int = 20000,
) -> list[Callable[..., Any]]:
    """The four tools as coroutine functions bound to an AsyncSandbox."""
    default_timeout = timeout_seconds
    limit = max_output_chars

    async def runtime_exec(command: str, cwd: str | None = None, timeout_seconds: int | None = None) -> dict:
        """Runs a bash command in the sandbox (a Linux machine with python3, pip, node, go, gcc and
        passwordless sudo) and returns its exit code, stdout and stderr. Files, installed packages
        and the working tree persist between calls.

        Args:
            command: The command, run under `bash -c`, e.g. `pytest -q` or `ls -la && cat setup.py`.
            cwd: Working directory; relative paths resolve under /workspace (the default).
            timeout_seconds: Stop the command after this many seconds and report timed_out (default 300).

        Returns:
            A dict with exit_code (None if it did not exit by itself), stdout, stderr and timed_out.
        """
        try:
            r = await sbx.exec(command, cwd=resolve_path(cwd, root),
                               timeout=float(timeout_seconds or default_timeout), stream=True)
        except (EmberboxError, ValueError) as e:
            return _exec_error(e)
        return _exec_dict(r, limit)

    async def runtime_read_file(path: str) -> str:
        """Reads a text file from the sandbox.

        Args:
            path: File path; relative paths resolve under /workspace.

        Returns:
            The file's text, or a message saying why it could not be read.
        """
        p = resolve_path(path, root)
        try:
            data = await sbx.files.read(p)
        except APIError as e:
            if e.status == 404:
                return f"No such file: {p}"
            return f"Could not read {p}: {_describe(e)}"
        except EmberboxError as e:
            return f"Could not read {p}: {_describe(e)}"
        return clip_head(data.decode("utf-8", errors="replace"), limit)

    async def runtime_write_file(path: str, content: str) -> str:
        """Creates or replaces a text file in the sandbox, making parent directories as needed.

        Args:
            path: File path; relative paths resolve under /workspace.
            content: The complete new text of the file.

        Returns:
            A confirmation with the number of bytes written, or a message saying why it failed.
        """
        p = resolve_path(path, root)
        try:
            info = await sbx.files.write(p, content)
        except EmberboxError as e:
            return f"Could not write {p}: {_describe(e)}"
        return f"Wrote {info['size']} bytes to {p}"

    async def runtime_list_files(path: str = ".", depth: int = 1) -> list:
        """Lists a directory in the sandbox with each entry's path, type and size.

        Args:
            path: Directory; relative paths resolve under /workspace.
            depth: How many levels to descend; 1 lists direct children only (at most 10).

        Returns:
            A list of {path, type, size} dicts (type is file, directory, symlink or other).
        """
        p = resolve_path(path, root)
        try:
            return _entries(await sbx.files.list(p, depth=_depth(depth), hidden=True))
        except EmberboxError as e:
            return [{"error": f"Could not list {p}: {_describe(e)}"}]

    return [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]
