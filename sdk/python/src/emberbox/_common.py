"""Request bodies and small helpers shared by Sandbox and AsyncSandbox."""
from __future__ import annotations

import base64
import hashlib
import posixpath
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ._types import ProcessOutput

OutputCallback = Callable[[str], object]

WORKSPACE = "/workspace"
STREAM_ABOVE_S = 60.0  # a longer timeout (or a callback) streams the command
CREATE_WAIT_S = 60
BOOT_TIMEOUT_S = 300.0
MAX_PUT_BYTES = 1 << 20
UPLOAD_CONCURRENCY = 4  # chunks of one upload in flight at once
UPLOAD_COMMIT_WAITS = 30  # times a commit waits out `upload_committing` / `idempotency_in_progress`
TERMINAL_STATES = frozenset({"stopped", "deleted", "failed", "error"})
CHECKPOINT_TIMEOUT_S = 900.0  # a capture, restore or branch answers when it is over; allow slow hosts
MAX_BRANCH_COUNT = 10


def seg(value: str) -> str:
    """Quotes an id for use as one path segment."""
    return quote(str(value), safe="")


def abs_path(path: str, root: str = WORKSPACE) -> str:
    """Resolves a path: absolute paths are normalised, relative ones resolve under root."""
    p = str(path or ".")
    return posixpath.normpath(posixpath.join(root, p))


def create_body(
    *,
    timeout_seconds: int | None,
    on_lease_end: str | None,
    vcpu: int | None,
    memory_mib: int | None,
    disk_mib: int | None,
    env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    name: str | None,
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "timeoutSeconds": timeout_seconds,
        "onLeaseEnd": on_lease_end,
        "vcpu": vcpu,
        "memoryMiB": memory_mib,
        "diskMiB": disk_mib,
        "env": dict(env) if env is not None else None,
        "labels": dict(labels) if labels is not None else None,
        "name": name,
    }
    if extra:
        body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def checkpoint_id(checkpoint: Any) -> str:
    """The id of a Checkpoint, or the id given as text."""
    cid = checkpoint if isinstance(checkpoint, str) else getattr(checkpoint, "id", None)
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"expected a Checkpoint or a checkpoint id, got {checkpoint!r}")
    return cid


def checkpoint_body(label: str | None, wait: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {} if label is None else {"label": str(label)}
    if not wait:
        body["wait"] = False
    return body


def branch_body(count: int, name: str | None, labels: Mapping[str, str] | None) -> dict[str, Any]:
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_BRANCH_COUNT:
        raise ValueError(f"count must be an int from 1 to {MAX_BRANCH_COUNT}, got {count!r}")
    body: dict[str, Any] = {"count": count}
    if name is not None:
        body["name"] = name
    if labels is not None:
        body["labels"] = {str(k): str(v) for k, v in labels.items()}
    return body


def list_params(
    state: str | Sequence[str] | None,
    labels: Mapping[str, str] | None,
    name: str | None,
    include_stopped: bool,
    limit: int | None,
    cursor: str | None,
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = []
    if state:
        for s in [state] if isinstance(state, str) else state:
            params.append(("state", s))
    for k, v in (labels or {}).items():
        params.append(("label", f"{k}:{v}"))
    if name:
        params.append(("name", name))
    if include_stopped:
        params.append(("includeStopped", "true"))
    if limit:
        params.append(("limit", str(limit)))
    if cursor:
        params.append(("cursor", cursor))
    return params


def command_body(
    command: str | Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: str | bytes | None,
    timeout: float | None,
    user: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if isinstance(command, str):
        body["command"] = command
    else:
        argv = [str(a) for a in command]
        if not argv:
            raise ValueError("argv must not be empty")
        body["argv"] = argv
    if cwd is not None:
        body["cwd"] = abs_path(cwd)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if isinstance(stdin, bytes):
        body["stdinBase64"] = base64.b64encode(stdin).decode("ascii")
    elif stdin is not None:
        body["stdin"] = stdin
    if timeout is not None:
        body["timeoutMs"] = max(1, int(round(float(timeout) * 1000)))
    if user is not None:
        body["user"] = user
    return body


def wants_stream(timeout: float | None, has_callback: bool, stream: bool | None) -> bool:
    if stream is not None:
        return stream
    return has_callback or (timeout or 0) > STREAM_ABOVE_S


def http_timeout_for(timeout: float | None) -> float:
    return (timeout if timeout is not None else 60.0) + 60.0


def signal_name(sig: str | int) -> str:
    if isinstance(sig, int):
        import signal as _signal

        return _signal.Signals(sig).name
    s = str(sig).upper()
    return s if s.startswith("SIG") else "SIG" + s


def collect_output(events: list[dict[str, Any]], cursor: int) -> ProcessOutput:
    """Folds a finished read of `/output` into a ProcessOutput."""
    from ._stream import OutputCursor

    cur = OutputCursor(cursor)
    out, err = bytearray(), bytearray()
    exit_ev: dict[str, Any] | None = None
    for event in events:
        if event.get("type") == "exit":
            exit_ev = event
            continue
        for ev in cur.feed(event):
            if ev.type == "stdout":
                out += ev.raw
            elif ev.type == "stderr":
                err += ev.raw
    return ProcessOutput(
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        next_cursor=cur.offset,
        exited=exit_ev is not None,
        exit_code=(exit_ev or {}).get("exitCode"),
        state=(exit_ev or {}).get("state"),
        timed_out=bool((exit_ev or {}).get("timedOut")),
        truncated=cur.truncated,
    )


def assemble_script(parts: list[str], target: str) -> list[str]:
    """argv that concatenates uploaded parts into target atomically, then removes them."""
    script = 'set -e; t="$1"; shift; tmp="$t.emberbox-part"; cat -- "$@" > "$tmp"; mv -f -- "$tmp" "$t"; rm -f -- "$@"'
    return ["sh", "-c", script, "sh", target, *parts]


def remove_parts_argv(target: str, parts: list[str]) -> list[str]:
    """argv that removes the parts (and half-joined file) of a failed large write outside /workspace."""
    return ["rm", "-f", "--", f"{target}.emberbox-part", *parts]


# --- writes ------------------------------------------------------------------
#
# files.write picks one of three ways, by size and place:
#   * up to 1 MiB: one `PUT …/files/content` (any path);
#   * over 1 MiB under /workspace: the chunked-upload trio (begin, chunks,
#     commit; abort on failure), see `Upload`;
#   * over 1 MiB elsewhere: the server's uploads take only /workspace paths, so
#     the file goes up as 1 MiB part files next to the target, which a command
#     in the guest joins (`assemble_script`). This needs the sandbox user to be
#     allowed to write there, as any write does.


def mode_str(mode: str | int | None) -> str | None:
    """The octal permission string sent to the server ("755"); ints are taken as the bits (0o755)."""
    if mode is None:
        return None
    s = mode if isinstance(mode, str) else format(int(mode), "o")
    if not s or len(s) > 4 or any(c not in "01234567" for c in s):
        raise ValueError(f'mode must be octal permission bits such as "644" or 0o644, got {mode!r}')
    return s


def write_params(path: str, mode: str | None) -> dict[str, str]:
    params = {"path": path}
    if mode is not None:
        params["mode"] = mode
    return params


def uploadable(path: str) -> bool:
    """True if the server's chunked uploads take this (absolute, normalised) path."""
    return path.startswith(WORKSPACE + "/")


def write_result(path: str, size: int) -> dict[str, Any]:
    return {"path": path, "size": size}


class Upload:
    """The I/O-free half of a chunked upload, shared by Files and AsyncFiles:
    request bodies, chunk offsets and slices, and what to do with the answers.

        POST …/uploads                      begin_body()  → begin(answer)
        PUT  …/uploads/{id}?offset=N        chunk(N) for N in offsets()
        POST …/uploads/{id}:commit          {}            → needs_chmod()
        POST …/uploads/{id}:abort           {}            on any failure before the commit answers
    """

    def __init__(self, sandbox_path: str, path: str, data: bytes, mode: str | None) -> None:
        self.base = f"{sandbox_path}/uploads"
        self.path = path
        self.data = data
        self.mode = mode
        self.send_mode = mode is not None  # dropped if the guest cannot apply it at commit
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.upload_id: str | None = None
        self.chunk_bytes = 0
        self.granted_mode: str | None = None  # the mode the commit applies, from begin's answer

    # begin
    def begin_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"path": self.path, "size": len(self.data), "sha256": self.sha256}
        if self.send_mode and self.mode is not None:
            body["mode"] = self.mode
        return body

    def retry_begin_without_mode(self, err: Exception) -> bool:
        """A guest too old to set modes at commit: begin again without one and chmod afterwards."""
        if self.send_mode and self.mode is not None and getattr(err, "code", "") == "guest_upgrade_required":
            self.send_mode = False
            return True
        return False

    def begin(self, answer: Any) -> None:
        from ._errors import APIError

        a = answer if isinstance(answer, dict) else {}
        uid, cb = a.get("uploadId"), a.get("chunkBytes")
        if not isinstance(uid, str) or not uid or isinstance(cb, bool) or not isinstance(cb, int) or cb <= 0:
            raise APIError(f"begin upload of {self.path}: the answer lacks uploadId or chunkBytes: {answer!r}",
                           code="bad_answer")
        self.upload_id, self.chunk_bytes = uid, cb
        m = a.get("mode")
        self.granted_mode = m if isinstance(m, str) and m else None

    # chunks
    @property
    def chunk_path(self) -> str:
        assert self.upload_id is not None
        return f"{self.base}/{seg(self.upload_id)}"

    def offsets(self) -> range:
        return range(0, len(self.data), self.chunk_bytes)

    def chunk(self, offset: int) -> bytes:
        return self.data[offset:offset + self.chunk_bytes]

    # commit / abort
    @property
    def commit_path(self) -> str:
        return self.chunk_path + ":commit"

    @property
    def abort_path(self) -> str:
        return self.chunk_path + ":abort"

    def commit_timeout(self, base: float) -> float:
        """The commit checks the sha256 and streams the file into the guest: allow 1 s per 2 MiB more."""
        return base + len(self.data) / (2 << 20)

    @staticmethod
    def commit_busy(err: Exception) -> float | None:
        """Seconds to wait before asking again when the commit answer says it is still running."""
        if getattr(err, "code", "") in ("upload_committing", "idempotency_in_progress"):
            ms = getattr(err, "retry_after_ms", None)
            return min(5.0, ms / 1000.0) if isinstance(ms, int) and ms >= 0 else 1.0
        return None

    def needs_chmod(self) -> bool:
        """True if a mode was asked for and the commit does not apply exactly it."""
        if self.mode is None:
            return False
        try:
            return self.granted_mode is None or int(self.granted_mode, 8) != int(self.mode, 8)
        except ValueError:
            return True

    def chmod_body(self) -> dict[str, Any]:
        return {"path": self.path, "mode": self.mode}


def part_paths(path: str, size: int) -> list[tuple[str, int]]:
    """(part path, offset) of each MAX_PUT_BYTES part of a large write outside /workspace."""
    tag = uuid.uuid4().hex[:12]
    return [(f"{path}.emberbox-{tag}-{i // MAX_PUT_BYTES:05d}", i) for i in range(0, size, MAX_PUT_BYTES)]
