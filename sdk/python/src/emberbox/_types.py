"""Result types."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CommandResult", "ProcessInfo", "ProcessOutput", "OutputEvent", "Checkpoint"]


@dataclass
class CommandResult:
    """What a command did. A timeout is a result (`timed_out=True`, `exit_code=None`), not an error."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int | None = None
    process_id: str | None = None
    out_of_memory: Any = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CommandResult:
        return cls(
            exit_code=d.get("exitCode"),
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            timed_out=bool(d.get("timedOut")),
            stdout_truncated=bool(d.get("stdoutTruncated")),
            stderr_truncated=bool(d.get("stderrTruncated")),
            duration_ms=d.get("durationMs"),
            process_id=d.get("processId"),
            out_of_memory=d.get("outOfMemory"),
        )


@dataclass
class OutputEvent:
    """One event of a streamed command or a process's output (`type` is stdout, stderr,
    exit, truncated, ...). `data` holds the text of stdout/stderr events and `raw` their bytes."""

    type: str
    data: str = ""
    raw: bytes = b""
    offset: int | None = None
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProcessInfo:
    """A background process started with `processes.spawn`."""

    id: str
    state: str = "unknown"
    exit_code: int | None = None
    command: str | None = None
    pid: int | None = None
    output_bytes: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcessInfo:
        return cls(
            id=str(d["id"]),
            state=str(d.get("state") or "unknown"),
            exit_code=d.get("exitCode"),
            command=d.get("command"),
            pid=d.get("pid"),
            output_bytes=d.get("outputBytes"),
            info=dict(d),
        )


@dataclass
class ProcessOutput:
    """Output read from a process: the text since `cursor`, where to continue next
    time (`next_cursor`), and the exit, if the process has ended."""

    stdout: str
    stderr: str
    next_cursor: int
    exited: bool
    exit_code: int | None = None
    state: str | None = None
    timed_out: bool = False
    truncated: bool = False


@dataclass
class Checkpoint:
    """A checkpoint of a sandbox: its memory, processes and disk at one moment, which
    `Sandbox.restore` returns it to and `Sandbox.branch` copies into new sandboxes.

    `state` is "ready" (usable), "failed" (the capture failed: `error` says why) or, only
    while a capture is under way, "capturing". Times are RFC 3339 text as the server sends
    them; `info` is the whole answer (with `shape`: the sandbox's vcpu, memoryMiB, diskMiB).
    """

    id: str
    sandbox_id: str
    label: str | None = None
    state: str = "unknown"
    size_bytes: int | None = None
    created_at: str | None = None
    ready_at: str | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """True if the checkpoint is ready to restore or branch from."""
        return self.state == "ready"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Checkpoint:
        size = d.get("sizeBytes")
        return cls(
            id=str(d["id"]),
            sandbox_id=str(d.get("sandboxId") or ""),
            label=d.get("label"),
            state=str(d.get("state") or "unknown"),
            size_bytes=int(size) if isinstance(size, (int, float)) and not isinstance(size, bool) else None,
            created_at=d.get("createdAt"),
            ready_at=d.get("readyAt"),
            error=d.get("error") or None,
            info=dict(d),
        )
