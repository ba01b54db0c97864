"""Helpers shared by the conformance test modules."""
from __future__ import annotations

import time
from urllib.parse import urlsplit


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


def loopback(url: str) -> tuple[str, dict]:
    """A preview's host is under localhost, which browsers resolve to the
    loopback address and this machine's resolver may not: the URL to send
    the request to instead, and the preview's Host header to send with it.
    With a real --preview-domain the URL is used as it is."""
    u = urlsplit(url)
    if not (u.hostname or "").endswith(".localhost"):
        return url, {}
    return u._replace(netloc=f"127.0.0.1:{u.port}").geturl(), {"Host": u.netloc}


def delete_quietly(box) -> None:
    """Deletes a sandbox at the end of a test; a failure is printed, never
    raised over the test's own result."""
    try:
        box.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {box.id} failed: {e}")
