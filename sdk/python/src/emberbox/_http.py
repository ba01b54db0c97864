"""HTTP transport: configuration, headers, the retry rules with one idempotency key
per call, and the answer type shared by the clients built on httpx (AsyncClient in
_async_client.py, and Client in _client.py, generated from it)."""
from __future__ import annotations

import os
import random
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from ._errors import APIError, ConfigurationError, error_from_response
from ._version import __version__

__all__ = ["resolve_config", "DEFAULT_API_URL"]

DEFAULT_API_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 300.0
NDJSON = "application/x-ndjson"
OCTETS = "application/octet-stream"
JSON = "application/json"

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Codes that mean "this will not work however often you ask": never retried.
DELIBERATE_CODES = frozenset({
    "unavailable", "unsupported", "not_implemented", "fork_unavailable", "previews_unavailable",
    "resize_unavailable", "snapshots_unavailable", "checkpoints_unavailable",
})
MAX_RETRY_AFTER_S = 60.0


def resolve_config(api_url: str | None = None, api_key: str | None = None) -> tuple[str, str]:
    """Returns (api_url, api_key) from the arguments, then EMBERBOX_API_URL/KEY,
    then RUNTIME_API_URL/KEY; the URL defaults to http://127.0.0.1:8080."""
    url = api_url or os.environ.get("EMBERBOX_API_URL") or os.environ.get("RUNTIME_API_URL") or DEFAULT_API_URL
    key = api_key or os.environ.get("EMBERBOX_API_KEY") or os.environ.get("RUNTIME_API_KEY") or ""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(f"API URL must be http(s)://host[:port], got {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigurationError(f"API URL must be an origin (the API lives at /v1 on it), got {url!r}")
    key = key.strip()
    if not key:
        raise ConfigurationError(
            "No API key: pass api_key=..., or set EMBERBOX_API_KEY (or RUNTIME_API_KEY). "
            "The server writes its admin key to <data-dir>/admin.key."
        )
    if any(c.isspace() for c in key):
        raise ConfigurationError("The API key contains whitespace")
    return url, key


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def error_is_retryable(err: APIError) -> bool:
    """The retry rule for an error answer: 429/502/503/504 unless the answer says
    otherwise (`retryable`), and never for deliberate refusals."""
    if err.code in DELIBERATE_CODES:
        return False
    if err.retryable is not None:
        return err.retryable
    return err.status in RETRY_STATUSES


def retry_delay(attempt: int, base: float, retry_after_s: float | None = None, cap: float = 8.0) -> float:
    """Seconds to wait before retry number `attempt` (1-based)."""
    if retry_after_s is not None and 0 <= retry_after_s <= MAX_RETRY_AFTER_S:
        return retry_after_s
    if base <= 0:
        return 0.0
    return min(cap, base * (2 ** (attempt - 1))) * (0.75 + random.random() * 0.5)


def _retry_after_s(err: APIError, headers: httpx.Headers | None) -> float | None:
    if err.retry_after_ms is not None:
        return err.retry_after_ms / 1000.0
    if headers is not None:
        value = headers.get("retry-after")
        if value:
            try:
                return float(value)
            except ValueError:
                return None
    return None


class _Base:
    def __init__(
        self,
        api_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        backoff: float,
    ) -> None:
        self.api_url, self.api_key = resolve_config(api_url, api_key)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)

    def _headers(
        self, method: str, accept: str, has_json: bool, has_content: bool, key: str | None, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        h = {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": accept,
            "User-Agent": f"emberbox-python/{__version__}",
            "X-Runtime-Client": f"emberbox-python/{__version__}",
        }
        if has_json:
            h["Content-Type"] = JSON
        elif has_content:
            h["Content-Type"] = OCTETS
        if method != "GET" and key:
            h["Idempotency-Key"] = key
        if extra:
            h.update(extra)
        return h

    def _timeout(self, seconds: float | None) -> httpx.Timeout:
        read = self.timeout if seconds is None else float(seconds)
        return httpx.Timeout(connect=15.0, read=read, write=60.0, pool=60.0)

    @staticmethod
    def _key(method: str, idempotency_key: str | None) -> str | None:
        if method == "GET":
            return None
        return idempotency_key or str(uuid.uuid4())

    def _check(self, resp: httpx.Response, body: bytes) -> APIError | None:
        if 200 <= resp.status_code < 300:
            # A late answer may carry an error in a 2xx body.
            if resp.headers.get("runtime-late-answer") == "true" and body.startswith(b'{"error"'):
                err = error_from_response(500, body, resp.headers.get("x-request-id", ""))
                return err
            return None
        return error_from_response(resp.status_code, body, resp.headers.get("x-request-id", ""))


class Response:
    """A read answer: status, headers and the whole body."""

    def __init__(self, status: int, headers: httpx.Headers, content: bytes) -> None:
        self.status = status
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        import json

        if not self.content.strip():
            return None
        return json.loads(self.content)
