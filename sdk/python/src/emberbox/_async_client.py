"""AsyncClient: the asyncio HTTP client. The sync Client (_client.py) is generated from this
module by scripts/unasync.py."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
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

__all__ = ["AsyncClient"]


class AsyncClient(_Base):
    """The asyncio twin of `Client` (same arguments)."""

    def __init__(
        self,
        api_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(api_url, api_key, timeout, max_retries, backoff)
        self._http = httpx.AsyncClient(
            base_url=self.api_url,
            transport=transport,
            trust_env=not _is_loopback(self.api_url),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def request(
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
                resp = await self._http.request(
                    method, path, params=params, json=json, content=content, headers=hdrs,
                    timeout=self._timeout(timeout),
                )
            except httpx.TransportError as e:
                attempt += 1
                if attempt > self.max_retries:
                    raise APIConnectionError(f"{method} {path}: {type(e).__name__}: {e}") from e
                await self._sleep(retry_delay(attempt, self.backoff))
                continue
            err = self._check(resp, resp.content)
            if err is None:
                return Response(resp.status_code, resp.headers, resp.content)
            attempt += 1
            if attempt > self.max_retries or not error_is_retryable(err):
                raise err
            await self._sleep(retry_delay(attempt, self.backoff, _retry_after_s(err, resp.headers)))

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self.request(method, path, **kw)).json()

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        accept: str = NDJSON,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """Opens a streamed answer. Failures before the status line arrives are retried
        (same key); an error status raises the typed error."""
        key = self._key(method, idempotency_key)
        hdrs = self._headers(method, accept, json is not None, False, key, None)
        attempt = 0
        while True:
            req = self._http.build_request(method, path, params=params, json=json, headers=hdrs,
                                           timeout=self._timeout(timeout))
            try:
                resp = await self._http.send(req, stream=True)
            except httpx.TransportError as e:
                attempt += 1
                if attempt > self.max_retries:
                    raise APIConnectionError(f"{method} {path}: {type(e).__name__}: {e}") from e
                await self._sleep(retry_delay(attempt, self.backoff))
                continue
            if not 200 <= resp.status_code < 300:
                try:
                    body = await resp.aread()
                except httpx.TransportError:
                    body = b""
                finally:
                    await resp.aclose()
                err = self._check(resp, body)
                assert err is not None
                attempt += 1
                if attempt > self.max_retries or not error_is_retryable(err):
                    raise err
                await self._sleep(retry_delay(attempt, self.backoff, _retry_after_s(err, resp.headers)))
                continue
            try:
                yield resp
            finally:
                await resp.aclose()
            return
