"""Helpers shared by the conformance test modules."""
from __future__ import annotations

import time


def poll(fn, timeout_s: float, interval_s: float = 0.5):
    """Calls fn() until it returns a truthy value or timeout_s passes; returns the last value."""
    deadline = time.monotonic() + timeout_s
    value = fn()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = fn()
    return value


def ok(result, what: str) -> None:
    """Asserts that a command result exited 0, showing its output otherwise."""
    assert result.exit_code == 0, (f"{what}: exit {result.exit_code}, timed_out={result.timed_out}\n"
                                   f"stdout={result.stdout[-2000:]!r}\nstderr={result.stderr[-2000:]!r}")
