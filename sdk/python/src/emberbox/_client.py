# Generated from _async_client.py by scripts/unasync.py: do not edit by hand.
# Edit _async_client.py, then regenerate: python3 sdk/python/scripts/unasync.py
"""Client: the synchronous HTTP client, with retries under one idempotency key per call."""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from ._errors import APIConnectionError
from ._http import (
    DEFAULT_TIMEOUT_S,
    JSON,
    NDJSON,
    Response,
    _Base,
    _is_loopback,
    _retry_after_s,
    error_is_retryable,
    retry_delay,
)

__all__ = ["Client"]


class Client(_Base):
    """A synchronous connection to an Emberbox server.

    Args:
        api_url: server origin; defaults to EMBERBOX_API_URL, RUNTIME_API_URL, then http://127.0.0.1:8080.
        api_key: bearer key; defaults to EMBERBOX_API_KEY, then RUNTIME_API_KEY.
        timeout: default read timeout of a call, in seconds.
        max_retries: retries of transport errors and 429/502/503/504 answers (same idempotency key).
        backoff: base of the exponential backoff, in seconds.
        transport: an httpx transport (tests pass httpx.MockTransport).
    """

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(api_url, api_key, timeout, max_retries, backoff)
        self._http = httpx.Client(
            base_url=self.api_url,
            transport=transport,
            trust_env=not _is_loopback(self.api_url),
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        json: Any = None,
        content: bytes | None = None,
        accept: str = JSON,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        """Sends one call, retrying transient failures with the same Idempotency-Key."""
        key = self._key(method, idempotency_key)
        hdrs = self._headers(method, accept, json is not None, content is not None, key, headers)
        attempt = 0
        while True:
            try:
                resp = self._http.request(
                    method, path, params=params, json=json, content=content, headers=hdrs,
                    timeout=self._timeout(timeout),
                )
            except httpx.TransportError as e:
                attempt += 1
                if attempt > self.max_retries:
                    raise APIConnectionError(f"{method} {path}: {type(e).__name__}: {e}") from e
                self._sleep(retry_delay(attempt, self.backoff))
                continue
            err = self._check(resp, resp.content)
            if err is None:
                return Response(resp.status_code, resp.headers, resp.content)
            attempt += 1
            if attempt > self.max_retries or not error_is_retryable(err):
                raise err
            self._sleep(retry_delay(attempt, self.backoff, _retry_after_s(err, resp.headers)))

    def json(self, method: str, path: str, **kw: Any) -> Any:
        return self.request(method, path, **kw).json()

    @contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        accept: str = NDJSON,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Iterator[httpx.Response]:
        """Opens a streamed answer. Failures before the status line arrives are retried
        (same key); an error status raises the typed error."""
        key = self._key(method, idempotency_key)
        hdrs = self._headers(method, accept, json is not None, False, key, None)
        attempt = 0
        while True:
            req = self._http.build_request(method, path, params=params, json=json, headers=hdrs,
                                           timeout=self._timeout(timeout))
            try:
                resp = self._http.send(req, stream=True)
            except httpx.TransportError as e:
                attempt += 1
                if attempt > self.max_retries:
                    raise APIConnectionError(f"{method} {path}: {type(e).__name__}: {e}") from e
                self._sleep(retry_delay(attempt, self.backoff))
                continue
            if not 200 <= resp.status_code < 300:
                try:
                    body = resp.read()
                except httpx.TransportError:
                    body = b""
                finally:
                    resp.close()
                err = self._check(resp, body)
                assert err is not None
                attempt += 1
                if attempt > self.max_retries or not error_is_retryable(err):
                    raise err
                self._sleep(retry_delay(attempt, self.backoff, _retry_after_s(err, resp.headers)))
                continue
            try:
                yield resp
            finally:
                resp.close()
            return
