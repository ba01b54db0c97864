"""Request bodies and small helpers shared by Sandbox and AsyncSandbox."""
from __future__ import annotations

import base64
import posixpath
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
TERMINAL_STATES = frozenset({"stopped", "deleted", "failed", "error"})


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
