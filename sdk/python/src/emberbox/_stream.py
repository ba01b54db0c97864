"""NDJSON output streams: parsing lines, tracking byte offsets (a gap means the
server dropped output), and assembling a CommandResult. Shared by sync and async."""
from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from ._errors import APIConnectionError, error_from_payload
from ._types import CommandResult, OutputEvent

__all__ = ["parse_line", "OutputCursor", "ExecAccumulator", "StreamBroken"]


class StreamBroken(Exception):
    """A line that is not JSON, or a stream cut mid-line: resume from the cursor."""


def parse_line(line: str | bytes) -> dict[str, Any] | None:
    """Parses one NDJSON line; None for a blank line. Raises StreamBroken for a bad one."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError as e:
        raise StreamBroken(f"bad NDJSON line: {line[:200]!r}") from e
    if not isinstance(event, dict) or "type" not in event:
        raise StreamBroken(f"NDJSON line without a type: {line[:200]!r}")
    return event


class OutputCursor:
    """Follows the cumulative byte offset across stdout and stderr.

    `feed` returns the events to deliver: duplicates (already seen bytes) are
    dropped, overlaps are trimmed, and a gap produces a synthetic `truncated`
    event first and sets `truncated`."""

    def __init__(self, start: int = 0) -> None:
        self.offset = start
        self.truncated = False
        self.dropped_bytes = 0

    def feed(self, event: dict[str, Any]) -> list[OutputEvent]:
        kind = event.get("type")
        if kind in ("stdout", "stderr"):
            if "base64" in event and event["base64"] is not None:
                raw = base64.b64decode(event["base64"])
            else:
                raw = str(event.get("data", "")).encode("utf-8")
            off = event.get("offset")
            if not isinstance(off, int):
                off = self.offset
            out: list[OutputEvent] = []
            if off > self.offset:
                gap = off - self.offset
                self.truncated = True
                self.dropped_bytes += gap
                out.append(OutputEvent("truncated", offset=self.offset,
                                       payload={"type": "truncated", "droppedBytes": gap, "resumeAt": off,
                                                "synthetic": True}))
                self.offset = off
            end = off + len(raw)
            if end <= self.offset:
                return out  # already delivered
            if off < self.offset:
                raw = raw[self.offset - off:]
                off = self.offset
            self.offset = end
            text = raw.decode("utf-8", errors="replace")
            if "base64" not in event and off == event.get("offset"):
                text = str(event.get("data", ""))
            out.append(OutputEvent(kind, data=text, raw=raw, offset=off, payload=event))
            return out
        if kind == "truncated":
            self.truncated = True
            dropped = event.get("droppedBytes")
            if isinstance(dropped, int):
                self.dropped_bytes += dropped
            resume = event.get("resumeAt")
            if isinstance(resume, int) and resume > self.offset:
                self.offset = resume
            return [OutputEvent("truncated", offset=self.offset, payload=event)]
        return [OutputEvent(str(kind), payload=event)]


Callback = Callable[[str], Any]


class ExecAccumulator:
    """Collects a streamed command's events into a CommandResult.

    `handle(event)` returns True once the stream is finished (`exit`). A
    `continue` event or a cut stream leaves `resume_cursor` for a follow-up
    read of `/processes/{process_id}/output`."""

    def __init__(self, on_stdout: Callback | None = None, on_stderr: Callback | None = None) -> None:
        self.cursor = OutputCursor()
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.process_id: str | None = None
        self.exit: dict[str, Any] | None = None
        self.server_cursor: int | None = None
        self.events: list[OutputEvent] = []

    @property
    def done(self) -> bool:
        return self.exit is not None

    @property
    def resume_cursor(self) -> int:
        c = self.cursor.offset
        if self.server_cursor is not None and self.server_cursor > c:
            return self.server_cursor
        return c

    def handle(self, event: dict[str, Any]) -> bool:
        """Consumes one parsed event. Returns True when the stream should stop
        being read (exit, or continue)."""
        kind = event["type"]
        if kind == "start":
            pid = event.get("processId")
            if pid:
                self.process_id = str(pid)
            return False
        if kind == "error":
            raise error_from_payload(event.get("error") or {}, 0)
        if kind == "continue":
            pid = event.get("processId")
            if pid:
                self.process_id = str(pid)
            cur = event.get("cursor")
            if isinstance(cur, int):
                self.server_cursor = cur
            return True
        if kind == "exit":
            self.exit = event
            return True
        for ev in self.cursor.feed(event):
            if ev.type == "truncated":
                self.events.append(ev)
            elif ev.type == "stdout":
                self.stdout += ev.raw
                if self.on_stdout is not None:
                    self.on_stdout(ev.data)
            elif ev.type == "stderr":
                self.stderr += ev.raw
                if self.on_stderr is not None:
                    self.on_stderr(ev.data)
        return False

    def result(self) -> CommandResult:
        if self.exit is None:
            raise APIConnectionError("the output stream ended without an exit event")
        e = self.exit
        truncated = self.cursor.truncated
        return CommandResult(
            exit_code=e.get("exitCode"),
            stdout=self.stdout.decode("utf-8", errors="replace"),
            stderr=self.stderr.decode("utf-8", errors="replace"),
            timed_out=bool(e.get("timedOut")),
            stdout_truncated=truncated,
            stderr_truncated=truncated,
            duration_ms=e.get("durationMs"),
            process_id=self.process_id,
            out_of_memory=e.get("outOfMemory"),
        )
