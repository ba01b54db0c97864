"""AsyncInterpreter: a sandbox's stateful code interpreter (`sbx.interpreter`, and
`sbx.run_code`), over asyncio. The sync Interpreter (_interpreter.py) is generated from
this module by scripts/unasync.py; the wire contract is described in _execution.py."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from . import _common as C
from . import _execution as X
from ._concurrency import async_notify
from ._errors import APIConnectionError, EmberboxError
from ._execution import Context, Execution, ExecutionError, Result
from ._http import NDJSON, OCTETS

if TYPE_CHECKING:
    from ._async_sandbox import AsyncSandbox

__all__ = ["AsyncInterpreter", "AsyncInterpreterContexts"]


class AsyncInterpreterContexts:
    """`sbx.interpreter.contexts`: interpreters with their own state, directory and
    environment. Each language's own name ("python", ...) is its default context, which
    the server starts on first use."""

    def __init__(self, interpreter: AsyncInterpreter) -> None:
        self._i = interpreter

    def _p(self, context: Context | str | None = None, suffix: str = "") -> str:
        base = f"{self._i._base}/contexts"
        return base if context is None else f"{base}/{C.seg(X.context_id(context))}{suffix}"

    async def list(self) -> list[Context]:
        answer = await self._i._s.client.json("GET", self._p())
        return [Context.from_json(c) for c in (answer or {}).get("data") or []]

    async def create(self, *, id: str | None = None, language: str | None = None,  # noqa: A002
                     cwd: str | None = None, env: Mapping[str, str] | None = None,
                     idempotency_key: str | None = None) -> Context:
        """Starts a context.

        Args:
            id: its id (the server names one otherwise).
            language: "python" (default), or another language the server runs.
            cwd: its working directory (relative paths resolve under /workspace).
            env: environment variables of the context's process.
            idempotency_key: reuse to make a retried create return the same context.
        """
        body: dict[str, Any] = {"id": id, "language": language,
                                "cwd": C.abs_path(cwd) if cwd is not None else None,
                                "env": {str(k): str(v) for k, v in env.items()} if env is not None else None}
        answer = await self._i._s.client.json("POST", self._p(), json={k: v for k, v in body.items() if v is not None},
                                              idempotency_key=idempotency_key)
        return Context.from_json(answer)

    async def restart(self, context: Context | str) -> Context:
        """Starts the context again with empty state."""
        answer = await self._i._s.client.json("POST", self._p(context, ":restart"), json={})
        return Context.from_json(answer, X.context_id(context))

    async def interrupt(self, context: Context | str) -> bool:
        """Stops the running cell, as Ctrl-C would, and keeps the state. True if a cell was running."""
        answer = await self._i._s.client.json("POST", self._p(context, ":interrupt"), json={})
        return bool((answer or {}).get("interrupted"))

    async def remove(self, context: Context | str) -> bool:
        """Stops the context and forgets it. True if it existed."""
        answer = await self._i._s.client.json("DELETE", self._p(context))
        return bool((answer or {}).get("deleted"))


class AsyncInterpreter:
    """`sbx.interpreter`: runs code in a stateful context, like a notebook."""

    def __init__(self, sbx: AsyncSandbox) -> None:
        self._s = sbx
        self.contexts = AsyncInterpreterContexts(self)

    @property
    def _base(self) -> str:
        return self._s._p("/interpreter")

    async def result(self, ref: Any) -> bytes:
        """The bytes of a result too large to travel inline (a value of `Result.refs`)."""
        r = await self._s.client.request("GET", X.result_route(self._base, ref), accept=OCTETS)
        return r.content

    async def run(
        self,
        code: str,
        *,
        context: Context | str | None = None,
        language: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_stdout: X.TextCallback | None = None,
        on_stderr: X.TextCallback | None = None,
        on_result: X.ResultCallback | None = None,
        on_error: X.ErrorCallback | None = None,
        interrupt_on_disconnect: bool | None = None,
        idempotency_key: str | None = None,
    ) -> Execution:
        """Runs a cell; see `Sandbox.run_code`. Also takes `interrupt_on_disconnect` (whether
        a dropped connection interrupts the cell; the server's default otherwise) and
        `idempotency_key` (reuse to make a retried run answer once)."""
        if env:
            if not X.env_language_ok(language, context):
                raise ValueError("env= is set through Python code, so it needs a Python context; "
                                 "for another language, make a context with env: interpreter.contexts.create(env=...)")
            setup = await self._run(X.env_set_code(env), context=context, language=language, timeout=X.ENV_CELL_TIMEOUT_S)
            if setup.error is not None:
                raise ValueError(f"could not set env= in the context: {setup.error.name}: {setup.error.value}")
        try:
            return await self._run(code, context=context, language=language, timeout=timeout, on_stdout=on_stdout,
                                   on_stderr=on_stderr, on_result=on_result, on_error=on_error,
                                   interrupt_on_disconnect=interrupt_on_disconnect, idempotency_key=idempotency_key)
        finally:
            if env:
                try:
                    await self._run(X.env_restore_code(), context=context, language=language, timeout=X.ENV_CELL_TIMEOUT_S)
                except EmberboxError:
                    pass  # the context may be gone (a lost run): nothing to restore then

    async def _run(
        self,
        code: str,
        *,
        context: Context | str | None,
        language: str | None,
        timeout: float | None,
        on_stdout: X.TextCallback | None = None,
        on_stderr: X.TextCallback | None = None,
        on_result: X.ResultCallback | None = None,
        on_error: X.ErrorCallback | None = None,
        interrupt_on_disconnect: bool | None = None,
        idempotency_key: str | None = None,
    ) -> Execution:
        streamed = any(cb is not None for cb in (on_stdout, on_stderr, on_result, on_error))
        body = X.run_body(code, language=language, context=context, timeout=timeout, stream=streamed)
        if interrupt_on_disconnect is not None:
            body["interruptOnDisconnect"] = interrupt_on_disconnect
        fetched: dict[str, bytes] = {}  # ref path -> bytes, so a result streamed and answered is fetched once
        if streamed:
            answer = await self._stream(body, X.http_timeout(timeout), idempotency_key, fetched,
                                        on_stdout, on_stderr, on_result, on_error)
        else:
            answer = await self._s.client.json("POST", f"{self._base}:run", json=body,
                                               timeout=X.http_timeout(timeout), idempotency_key=idempotency_key)
        results = [await self._resolve(r, fetched) for r in X.wire_results(answer)]
        return X.execution_from_json(answer, results)

    async def _stream(self, body: dict[str, Any], timeout: float, idempotency_key: str | None,
                      fetched: dict[str, bytes], on_stdout: X.TextCallback | None, on_stderr: X.TextCallback | None,
                      on_result: X.ResultCallback | None, on_error: X.ErrorCallback | None) -> Any:
        try:
            async with self._s.client.stream("POST", f"{self._base}:run", json=body, accept=NDJSON, timeout=timeout,
                                             idempotency_key=idempotency_key) as resp:
                async for line in resp.aiter_lines():
                    event = X.parse_event(line)
                    if event is None:
                        continue
                    kind = event["k"]
                    if kind in ("stdout", "stderr"):
                        await async_notify(on_stdout if kind == "stdout" else on_stderr, str(event.get("text") or ""))
                    elif kind == "result" and on_result is not None:
                        await async_notify(on_result, await self._resolve(event, fetched))
                    elif kind == "error" and on_error is not None:
                        await async_notify(on_error, ExecutionError.from_json(event))
                    elif kind == "execution":
                        return event.get("execution")
                    elif kind == "failure":
                        raise X.failure(event)
        except httpx.TransportError as e:
            raise APIConnectionError(f"the interpreter stream broke: {type(e).__name__}: {e}") from e
        raise X.stream_ended()

    async def _resolve(self, bundle: Mapping[str, Any], fetched: dict[str, bytes]) -> Result:
        """A wire result with the values of its refs fetched. A ref that cannot be fetched is
        left out of `data` (and stays in `refs`, for `result(ref)`)."""
        values: dict[str, Any] = {}
        for mime, ref in X.missing_refs(bundle).items():
            try:
                path = X.ref_path(ref)
                if path not in fetched:
                    fetched[path] = await self.result(ref)
            except (EmberboxError, ValueError):
                continue
            values[mime] = X.inline_value(mime, fetched[path])
        return X.result_from_json(bundle, values)
