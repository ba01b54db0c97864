# Generated from _async_tools.py by scripts/unasync.py: do not edit by hand.
# Edit _async_tools.py, then regenerate: python3 sdk/python/scripts/unasync.py
"""The four agent tools as plain functions bound to a Sandbox (see tools.py).

Do not add `from __future__ import annotations` here: smolagents reads the tools' hints
at runtime.
"""
from collections.abc import Callable
from typing import Any

from ._errors import APIError, EmberboxError
from ._sandbox import Sandbox
from ._tools_common import (
    UndoEntry,
    UndoHistory,
    _depth,
    _describe,
    _entries,
    _exec_dict,
    _exec_error,
    _nothing_to_undo,
    _undo_entry,
    _undo_failed,
    _undone,
    _what,
    clip_head,
    resolve_path,
)

__all__ = ["sandbox_tools"]


def sandbox_tools(
    sbx: Sandbox,
    root: str = "/workspace",
    timeout_seconds: int = 300,
    max_output_chars: int = 20000,
    undo: bool = False,
) -> list[Callable[..., Any]]:
    """The four tools as plain functions bound to a Sandbox, and runtime_undo fifth with
    undo=True (`tools.sandbox_tools` checks the type of the sandbox and calls this one for a
    Sandbox)."""
    default_timeout = timeout_seconds
    limit = max_output_chars
    history = UndoHistory()

    def remember(what: str) -> None:
        """With undo on, checkpoints the sandbox before a change; a failed capture is
        remembered with its reason (and the change goes ahead)."""
        if not undo:
            return
        try:
            checkpoint = sbx.checkpoint(history.next_label())
        except EmberboxError as e:
            history.push(UndoEntry(what, None, _describe(e)))
            return
        history.push(_undo_entry(what, checkpoint))

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
        remember(_what("runtime_exec", command))
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
        remember(_what("runtime_write_file", p))
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

    def runtime_undo() -> str:
        """Puts the sandbox back as it was just before the last command run with runtime_exec or
        file written with runtime_write_file: files, installed packages and running processes
        return to that moment. Call it again to undo the change before that one too.

        Returns:
            What was undone, or a message saying why nothing could be undone.
        """
        entry = history.pop()
        if entry is None:
            return _nothing_to_undo()
        if entry.checkpoint_id is None:
            return _undo_failed(entry, f"no checkpoint could be taken before it ({entry.reason})")
        try:
            sbx.restore(entry.checkpoint_id)
        except EmberboxError as e:
            return _undo_failed(entry, _describe(e))
        try:
            sbx.delete_checkpoint(entry.checkpoint_id)  # used up: free its space
        except EmberboxError:
            pass
        return _undone(entry)

    tools: list[Callable[..., Any]] = [runtime_exec, runtime_read_file, runtime_write_file, runtime_list_files]
    return tools + [runtime_undo] if undo else tools
