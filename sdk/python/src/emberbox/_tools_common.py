"""What the agent tools share, sync or async: path resolution, clipping, and the shape of
their answers (see tools.py)."""
import itertools
import posixpath
import threading
from dataclasses import dataclass
from typing import Any

from ._errors import APIError
from ._types import CommandResult

MAX_LIST_ENTRIES = 1000
MAX_UNDO = 20  # undo steps remembered (the server keeps 20 checkpoints per sandbox by default)


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


@dataclass
class UndoEntry:
    """A change a tool made, and the checkpoint taken just before it (None if the capture failed)."""

    what: str
    checkpoint_id: str | None
    reason: str = ""


class UndoHistory:
    """The undo stack of one tool set (`sandbox_tools(..., undo=True)`): before each
    runtime_exec or runtime_write_file the tools take a checkpoint labelled `undo-N` and
    push it here; runtime_undo pops the newest. At most MAX_UNDO entries are kept (older
    ones are forgotten here; the server deletes old checkpoints by its own cap)."""

    def __init__(self) -> None:
        self._entries: list[UndoEntry] = []
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # smolagents may run several tool calls in threads

    def next_label(self) -> str:
        with self._lock:
            return f"undo-{next(self._numbers)}"

    def push(self, entry: UndoEntry) -> None:
        with self._lock:
            self._entries.append(entry)
            del self._entries[:-MAX_UNDO]

    def pop(self) -> UndoEntry | None:
        with self._lock:
            return self._entries.pop() if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)


def _what(tool: str, arg: str) -> str:
    """How a change is named in runtime_undo's answers: the tool and its (clipped) argument."""
    return f"{tool}({arg if len(arg) <= 200 else arg[:200] + '...'!r})"


def _undo_entry(what: str, checkpoint: Any) -> UndoEntry:
    """The entry for a finished capture: usable if it is ready, else with the reason it is not."""
    if getattr(checkpoint, "ok", False):
        return UndoEntry(what, checkpoint.id)
    return UndoEntry(what, None, getattr(checkpoint, "error", None) or
                     f"the capture ended in state {getattr(checkpoint, 'state', 'unknown')}")


def _nothing_to_undo() -> str:
    return ("Nothing to undo: no command was run and no file written with these tools since they were "
            "made, or all of those that can be undone have been.")


def _undo_failed(entry: UndoEntry, why: str) -> str:
    return (f"Could not undo {entry.what}: {why}. Calling runtime_undo again goes back to before the "
            "change made before it, which undoes both.")


def _undone(entry: UndoEntry) -> str:
    return (f"Undid {entry.what}: the sandbox is back as it was just before it (files, installed "
            "packages and running processes).")
