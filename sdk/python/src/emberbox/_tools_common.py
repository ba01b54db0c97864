"""What the agent tools share, sync or async: path resolution, clipping, and the shape of
their answers (see tools.py)."""
import posixpath
from typing import Any

from ._errors import APIError
from ._types import CommandResult

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
