"""AsyncSandbox: the asyncio twin of Sandbox (same methods, awaited). The sync Sandbox
(_sandbox.py) is generated from this module by scripts/unasync.py."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from typing import Any

import httpx

from . import _common as C
from . import _execution as X
from ._async_client import AsyncClient
from ._async_interpreter import AsyncInterpreter
from ._concurrency import async_run_concurrently
from ._errors import APIConnectionError, APIError, CommandError, NotFoundError, SandboxStartError
from ._execution import Context, Execution
from ._http import NDJSON, OCTETS, retry_delay
from ._stream import ExecAccumulator, OutputCursor, StreamBroken, parse_line
from ._types import Checkpoint, CommandResult, OutputEvent, ProcessInfo, ProcessOutput

__all__ = ["AsyncSandbox", "AsyncFiles", "AsyncProcesses"]


async def _consume(resp: httpx.Response, acc: ExecAccumulator) -> None:
    async for line in resp.aiter_lines():
        event = parse_line(line)
        if event is not None and acc.handle(event):
            return


class AsyncSandbox:
    """One Emberbox sandbox (a microVM). Make one with `Sandbox.create(...)` or
    `Sandbox.connect(id)`; as a context manager it stops the sandbox on exit."""

    def __init__(self, client: AsyncClient, info: dict[str, Any], *, owns_client: bool = False,
                 delete_on_exit: bool = False) -> None:
        if "id" not in info:
            raise ValueError("sandbox info without an id")
        self.client = client
        self.info: dict[str, Any] = dict(info)
        self._owns_client = owns_client
        self._delete_on_exit = delete_on_exit
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.interpreter = AsyncInterpreter(self)

    # -- identity -----------------------------------------------------------
    @property
    def id(self) -> str:
        return str(self.info["id"])

    @property
    def state(self) -> str:
        return str(self.info.get("state") or "unknown")

    @property
    def ends_at(self) -> str | None:
        return self.info.get("endsAt") or self.info.get("expiresAt")

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, state={self.state!r})"

    def _p(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{C.seg(self.id)}{suffix}"

    # -- lifecycle ----------------------------------------------------------
    @staticmethod
    def _client(client: AsyncClient | None, api_url: str | None, api_key: str | None) -> tuple[AsyncClient, bool]:
        if client is not None:
            return client, False
        return AsyncClient(api_url, api_key), True

    @classmethod
    async def create(
        cls,
        *,
        timeout_seconds: int | None = None,
        on_lease_end: str | None = None,
        vcpu: int | None = None,
        memory_mib: int | None = None,
        disk_mib: int | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        client: AsyncClient | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
        boot_timeout: float = C.BOOT_TIMEOUT_S,
        delete_on_exit: bool = False,
        idempotency_key: str | None = None,
    ) -> AsyncSandbox:
        """Creates a sandbox and waits until it is running.

        Args:
            timeout_seconds: the lease; then `on_lease_end` (`"stop"` or `"delete"`) applies.
            on_lease_end: what happens when the lease ends.
            vcpu: virtual CPUs (default 2).
            memory_mib: memory in MiB (default 4096).
            disk_mib: disk in MiB (default 4096).
            env: environment variables of every command.
            labels: key/value labels, usable as list filters.
            name: an optional unique name.
            client: a AsyncClient to use; otherwise one is made from the arguments or environment.
            api_url: server origin when no client is given.
            api_key: API key when no client is given.
            extra: more create fields, camelCase, sent as they are.
            boot_timeout: seconds to wait for `running`.
            delete_on_exit: delete (instead of stop) at the end of a `with` block.
            idempotency_key: reuse to make a retried create return the same sandbox.
        """
        c, owned = cls._client(client, api_url, api_key)
        body = C.create_body(timeout_seconds=timeout_seconds, on_lease_end=on_lease_end, vcpu=vcpu,
                             memory_mib=memory_mib, disk_mib=disk_mib, env=env, labels=labels, name=name,
                             extra=extra)
        try:
            info = await c.json("POST", "/v1/sandboxes", json=body, headers={"Prefer": f"wait={C.CREATE_WAIT_S}"},
                                timeout=C.CREATE_WAIT_S + 60, idempotency_key=idempotency_key)
            sbx = cls(c, info, owns_client=owned, delete_on_exit=delete_on_exit)
            await sbx._wait_running(boot_timeout)
        except BaseException:
            if owned:
                await c.aclose()
            raise
        return sbx

    async def _wait_running(self, boot_timeout: float) -> None:
        deadline = time.monotonic() + boot_timeout
        while self.state != "running":
            if self.state in C.TERMINAL_STATES:
                raise SandboxStartError(
                    f"sandbox {self.id} is {self.state} (stopReason={self.info.get('stopReason')!r})", self.info)
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxStartError(f"sandbox {self.id} is still {self.state} after {boot_timeout:.0f} s",
                                        self.info)
            await self.wait_for("running", timeout_seconds=min(60, max(1, int(left))))

    @classmethod
    async def connect(cls, sandbox_id: str, *, client: AsyncClient | None = None, api_url: str | None = None,
                      api_key: str | None = None) -> AsyncSandbox:
        """Attaches to an existing sandbox by id (a `with` block stops it at the end)."""
        c, owned = cls._client(client, api_url, api_key)
        try:
            info = await c.json("GET", f"/v1/sandboxes/{C.seg(sandbox_id)}")
        except BaseException:
            if owned:
                await c.aclose()
            raise
        return cls(c, info, owns_client=owned)

    @classmethod
    async def list(
        cls,
        *,
        state: str | Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        include_stopped: bool = False,
        limit: int | None = None,
        client: AsyncClient | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
    ) -> list[AsyncSandbox]:
        """Lists this key's sandboxes (all pages, or at most `limit`)."""
        c, owned = cls._client(client, api_url, api_key)
        out: list[AsyncSandbox] = []
        cursor: str | None = None
        while True:
            page = await c.json("GET", "/v1/sandboxes",
                                params=C.list_params(state, labels, name, include_stopped,
                                                     min(limit, 100) if limit else None, cursor))
            for info in page.get("data") or []:
                out.append(cls(c, info, owns_client=False))
            cursor = page.get("nextCursor")
            if not cursor or (limit and len(out) >= limit):
                break
        return out[:limit] if limit else out

    async def refresh(self) -> AsyncSandbox:
        self.info = await self.client.json("GET", self._p())
        return self

    async def wait_for(self, state: str, timeout_seconds: int = 60) -> AsyncSandbox:
        """Waits on the server (at most timeout_seconds) for the sandbox to reach `state`."""
        self.info = await self.client.json("GET", self._p(), params={"waitFor": state, "timeoutSeconds": timeout_seconds},
                                           timeout=timeout_seconds + 30)
        return self

    async def extend(self, seconds: int) -> AsyncSandbox:
        """Moves the lease to now + seconds."""
        self.info = await self.client.json("POST", self._p(":extend"), json={"seconds": int(seconds)})
        return self

    async def stop(self, wait: bool = True) -> AsyncSandbox:
        headers = {"Prefer": "wait=60"} if wait else None
        self.info = await self.client.json("POST", self._p(":stop"), json={}, headers=headers, timeout=120)
        return self

    async def delete(self) -> dict[str, Any]:
        """Deletes the sandbox and its disk (a second delete answers the same)."""
        answer = await self.client.json("DELETE", self._p(), timeout=120) or {}
        self.info.update({"state": answer.get("state", "deleted")})
        return answer

    async def close(self) -> None:
        """Closes the HTTP client if this sandbox made it."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._delete_on_exit:
                await self.delete()
            elif self.state not in ("stopped", "deleted"):
                await self.stop(wait=False)
        except (APIConnectionError, NotFoundError):
            pass
        except Exception:  # noqa: BLE001 - ending a block must not hide the block's own error
            pass
        finally:
            await self.close()

    # -- checkpoints ----------------------------------------------------------
    async def checkpoint(self, label: str | None = None, *, wait: bool = True,
                         timeout: float = C.CHECKPOINT_TIMEOUT_S) -> Checkpoint:
        """Captures the sandbox as it is now (memory, processes and disk) and returns the
        checkpoint once the capture is over. A capture that fails comes back with
        `state == "failed"` and `error` set rather than raising: check `checkpoint.ok`.

        With `wait=False` the server answers at once with the checkpoint `capturing` and
        captures in the background (the sandbox's next call waits for the copy): an agent
        loop checkpoints after a step and the copy overlaps with the model's thinking.
        `wait_checkpoint` waits for such a checkpoint to be ready.

        A paused sandbox is woken for the capture and paused again. The server keeps a
        bounded number of checkpoints per sandbox (20 by default) and deletes the oldest
        beyond it; deleting the sandbox deletes its checkpoints.

        Args:
            label: an optional label of up to 63 characters, such as "step-2".
            wait: wait for the capture to be over (default), or answer at once.
            timeout: seconds to wait for the answer.

        Raises:
            RateLimitError: 429 `quota_exceeded`, when the key's checkpoints use up its space
                (after the client's retries, as for any 429).
        """
        answer = await self.client.json("POST", self._p("/checkpoints"), json=C.checkpoint_body(label, wait),
                                        timeout=timeout)
        return Checkpoint.from_json(answer)

    async def wait_checkpoint(self, checkpoint_id: Checkpoint | str, *,
                              timeout: float = C.CHECKPOINT_TIMEOUT_S) -> Checkpoint:
        """Waits until a checkpoint taken with `wait=False` is no longer capturing and
        returns it (`ok` when ready, `state == "failed"` when its capture failed).

        Raises:
            TimeoutError: it is still capturing after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            checkpoint = await self.get_checkpoint(checkpoint_id)
            if checkpoint.state != "capturing":
                return checkpoint
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint {checkpoint.id} still capturing after {timeout:.0f} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def checkpoints(self) -> list[Checkpoint]:
        """This sandbox's checkpoints, oldest first."""
        answer = await self.client.json("GET", self._p("/checkpoints")) or {}
        return [Checkpoint.from_json(d) for d in answer.get("checkpoints") or []]

    async def get_checkpoint(self, checkpoint_id: Checkpoint | str) -> Checkpoint:
        """One checkpoint of this sandbox (NotFoundError `checkpoint_not_found` if there is none)."""
        cid = C.checkpoint_id(checkpoint_id)
        return Checkpoint.from_json(await self.client.json("GET", self._p(f"/checkpoints/{C.seg(cid)}")))

    async def restore(self, checkpoint_id: Checkpoint | str, keep: bool = False, *,
                      timeout: float = C.CHECKPOINT_TIMEOUT_S) -> AsyncSandbox:
        """Returns the sandbox to a checkpoint: the same sandbox (same id) runs again with the
        memory, processes, servers and files of that moment. Answers (and refreshes `info`)
        once it runs again.

        Args:
            checkpoint_id: a checkpoint of this sandbox, or its id.
            keep: first take a checkpoint of the present state (labelled "before-restore"),
                so that the work since the checkpoint is not lost.
            timeout: seconds to wait for the answer.
        """
        cid = C.checkpoint_id(checkpoint_id)
        self.info = await self.client.json("POST", self._p(f"/checkpoints/{C.seg(cid)}:restore"),
                                           json={"keep": bool(keep)}, timeout=timeout)
        if self.state != "running":
            await self._wait_running(timeout)
        return self

    async def branch(self, checkpoint_id: Checkpoint | str, count: int = 1, name: str | None = None,
                     labels: Mapping[str, str] | None = None, *,
                     timeout: float = C.CHECKPOINT_TIMEOUT_S) -> list[AsyncSandbox]:
        """Makes `count` new sandboxes from a checkpoint of this one, each running in the
        checkpoint's state (as `:fork` does from the present). They use this sandbox's
        client and do not close it: keep it open while you use them.

        Args:
            checkpoint_id: a checkpoint of this sandbox, or its id.
            count: how many sandboxes, 1 to 10.
            name: a name for the new sandboxes.
            labels: labels of the new sandboxes.
            timeout: seconds to wait for the answer (and for each new sandbox to run).
        """
        cid = C.checkpoint_id(checkpoint_id)
        answer = await self.client.json("POST", self._p(f"/checkpoints/{C.seg(cid)}:branch"),
                                        json=C.branch_body(count, name, labels), timeout=timeout) or {}
        boxes = [type(self)(self.client, info) for info in answer.get("sandboxes") or []]
        for box in boxes:
            if box.state != "running":
                await box._wait_running(timeout)
        return boxes

    async def delete_checkpoint(self, checkpoint_id: Checkpoint | str) -> dict[str, Any]:
        """Deletes a checkpoint of this sandbox; answers `{"id", "state": "deleted"}`."""
        cid = C.checkpoint_id(checkpoint_id)
        return await self.client.json("DELETE", self._p(f"/checkpoints/{C.seg(cid)}"), timeout=120) or {}

    # -- commands -----------------------------------------------------------
    async def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        on_stdout: C.OutputCallback | None = None,
        on_stderr: C.OutputCallback | None = None,
        user: str | None = None,
        stream: bool | None = None,
        check: bool = False,
    ) -> CommandResult:
        """Runs a command (a string runs under `bash -c`; a list is an argv) and waits for it.

        Args:
            command: shell string or argv list.
            cwd: working directory (relative paths resolve under /workspace).
            env: extra environment variables.
            stdin: text or bytes fed to the command.
            timeout: seconds; then the command's process group is killed and `timed_out` is set.
            on_stdout: called with each piece of stdout text as it arrives (streams the command).
            on_stderr: called with each piece of stderr text as it arrives (streams the command).
            user: "sandbox" (default) or "root".
            stream: force streaming on or off; by default a callback or a timeout over 60 s streams.
            check: raise CommandError unless the command exits 0 in time.
        """
        body = C.command_body(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, user=user)
        http_timeout = C.http_timeout_for(timeout)
        if C.wants_stream(timeout, on_stdout is not None or on_stderr is not None, stream):
            result = await self._exec_streamed(body, http_timeout, on_stdout, on_stderr)
        else:
            result = CommandResult.from_json(
                await self.client.json("POST", self._p(":exec"), json=body, timeout=http_timeout) or {})
        if check and not result.ok:
            raise CommandError(
                f"command {'timed out' if result.timed_out else f'exited {result.exit_code}'}: "
                f"{result.stderr[-500:] or result.stdout[-500:]}", result)
        return result

    async def _exec_streamed(self, body: dict[str, Any], http_timeout: float, on_stdout: C.OutputCallback | None,
                             on_stderr: C.OutputCallback | None) -> CommandResult:
        acc = ExecAccumulator(on_stdout, on_stderr)
        try:
            async with self.client.stream("POST", self._p(":exec"), json={**body, "stream": True},
                                          timeout=http_timeout, idempotency_key=str(uuid.uuid4())) as resp:
                await _consume(resp, acc)
        except (httpx.TransportError, StreamBroken) as e:
            if acc.process_id is None:
                raise APIConnectionError(f"exec stream failed before it started: {e}") from e
        if not acc.done:
            await self._follow(acc, http_timeout)
        return acc.result()

    async def _follow(self, acc: ExecAccumulator, http_timeout: float) -> None:
        if acc.process_id is None:
            raise APIConnectionError("exec stream ended before the command started")
        idle = 0
        while not acc.done:
            before = acc.cursor.offset
            params = {"cursor": acc.resume_cursor, "follow": "true"}
            acc.server_cursor = None
            try:
                async with self.client.stream("GET", self.processes._p(acc.process_id, "/output"), params=params,
                                              timeout=http_timeout) as resp:
                    await _consume(resp, acc)
            except (httpx.TransportError, StreamBroken):
                pass
            if acc.done:
                return
            idle = idle + 1 if acc.cursor.offset == before else 0
            if idle >= 4:
                raise APIConnectionError(
                    f"lost the output of {acc.process_id}: 4 reads in a row ended with nothing new")
            await asyncio.sleep(retry_delay(idle, self.client.backoff) if idle else 0)


    # -- code interpreter ------------------------------------------------------
    async def run_code(
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
    ) -> Execution:
        """Runs code in a stateful interpreter context (an IPython kernel for Python):
        variables, imports and functions persist between runs of the same context.

        An exception in the code is `execution.error`, not raised; a cell that runs out of
        time is interrupted (state kept) and comes back with `status == "timeout"`.

        Args:
            code: the cell.
            context: a Context (or its id) from `interpreter.contexts.create`; by default the
                language's own context.
            language: "python" (default) or another language the server runs.
            timeout: seconds the cell may run (the server's default, 60 s, if None; 0 for no limit).
            env: environment variables for this run only (Python: set in os.environ during
                the run, then put back; inherited by its child processes).
            on_stdout: called with each piece of stdout as it is printed (streams the run).
            on_stderr: called with each piece of stderr as it is printed.
            on_result: called with each Result (display() calls and the cell's value) as it comes.
            on_error: called with the ExecutionError if the cell raises.

        Returns:
            The Execution: `results` (MIME bundles: `text`, `png`, `html`, ... and
            `is_main_result`), `logs.stdout` / `logs.stderr`, `error`, `execution_count`.
        """
        return await self.interpreter.run(code, context=context, language=language, timeout=timeout, env=env,
                                          on_stdout=on_stdout, on_stderr=on_stderr, on_result=on_result,
                                          on_error=on_error)

class AsyncFiles:
    """`sbx.files`: read, write, list, stat, mkdir and remove. Relative paths resolve under /workspace."""

    def __init__(self, sbx: AsyncSandbox) -> None:
        self._s = sbx

    def _p(self, suffix: str) -> str:
        return self._s._p(suffix)

    async def read(self, path: str) -> bytes:
        """The file's bytes (NotFoundError / FileNotFoundInSandboxError when missing)."""
        p = C.abs_path(path)
        for attempt in range(3):
            r = await self._s.client.request("GET", self._p("/files/content"), params={"path": p}, accept=OCTETS)
            want = r.headers.get("x-content-length")
            if want is None or not want.isdigit() or int(want) == len(r.content):
                return r.content
            await asyncio.sleep(0.2 * (attempt + 1))
        raise APIConnectionError(f"read of {p} came back short twice")

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "replace") -> str:
        return (await self.read(path)).decode(encoding, errors=errors)

    async def write(self, path: str, data: str | bytes, mode: str | int | None = None) -> dict[str, Any]:
        """Creates or replaces a file (parents are made); returns `{"path", "size"}`.

        Up to 1 MiB goes in one request. A larger file under /workspace goes up as a
        chunked upload: begin, chunks (a few at a time, each retried with its own
        Idempotency-Key), then a commit that checks the sha256 and writes the file at
        once; any failure (or cancellation) aborts the upload. A larger file outside
        /workspace (which the server's uploads refuse) goes up as 1 MiB part files that
        a command in the sandbox joins.

        Args:
            path: the file (relative paths resolve under /workspace).
            data: text (written as UTF-8) or bytes.
            mode: permission bits, as an octal string ("755") or an int (0o755).
        """
        p = C.abs_path(path)
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        m = C.mode_str(mode)
        if len(raw) <= C.MAX_PUT_BYTES:
            await self._s.client.request("PUT", self._p("/files/content"), params=C.write_params(p, m), content=raw)
        elif C.uploadable(p):
            await self._upload(C.Upload(self._s._p(), p, raw, m))
        else:
            await self._write_parts(p, raw, m)
        return C.write_result(p, len(raw))

    async def _upload(self, up: C.Upload) -> dict[str, Any]:
        client = self._s.client
        while True:
            try:
                up.begin(await client.json("POST", up.base, json=up.begin_body()))
                break
            except APIError as e:
                if not up.retry_begin_without_mode(e):
                    raise
        try:
            await self._send_chunks(up)
            entry = await self._commit(up)
        except BaseException:
            await self._abort(up)
            raise
        if up.needs_chmod():
            entry = await self._s.client.json("POST", self._p("/files:chmod"), json=up.chmod_body())
        return entry or {}

    async def _send_chunks(self, up: C.Upload) -> None:
        await async_run_concurrently(partial(self._put_chunk, up), up.offsets(), C.UPLOAD_CONCURRENCY,
                                     "emberbox-upload")

    async def _put_chunk(self, up: C.Upload, offset: int) -> None:
        # One key per chunk: the client's retries of it reuse it, and the server
        # takes a chunk sent twice as once.
        await self._s.client.request("PUT", up.chunk_path, params={"offset": offset}, content=up.chunk(offset))

    async def _commit(self, up: C.Upload) -> dict[str, Any]:
        client = self._s.client
        key = str(uuid.uuid4())
        waits = 0
        while True:
            try:
                return await client.json("POST", up.commit_path, json={}, idempotency_key=key,
                                         timeout=up.commit_timeout(client.timeout)) or {}
            except APIError as e:
                wait = up.commit_busy(e)
                waits += 1
                if wait is None or waits > C.UPLOAD_COMMIT_WAITS:
                    raise
                await asyncio.sleep(wait)

    async def _abort(self, up: C.Upload) -> None:
        try:
            await self._s.client.request("POST", up.abort_path, json={}, timeout=30)
        except Exception:  # noqa: BLE001 - best effort; the upload expires on the server anyway
            pass

    async def _write_parts(self, p: str, raw: bytes, mode: str | None) -> None:
        parts = C.part_paths(p, len(raw))
        sent: list[str] = []
        try:
            for part, off in parts:
                await self._s.client.request("PUT", self._p("/files/content"), params={"path": part},
                                             content=raw[off:off + C.MAX_PUT_BYTES])
                sent.append(part)
            r = await self._s.exec(C.assemble_script(sent, p), timeout=300)
            if not r.ok:
                raise CommandError(f"could not assemble {p}: {r.stderr.strip()}", r)
        except BaseException:
            if sent:
                try:
                    await self._s.exec(C.remove_parts_argv(p, sent), timeout=60)
                except Exception:  # noqa: BLE001 - best effort
                    pass
            raise
        if mode is not None:
            await self._s.client.request("POST", self._p("/files:chmod"), json={"path": p, "mode": mode})

    async def list(self, path: str = C.WORKSPACE, *, depth: int | None = None, hidden: bool | None = None,
                   limit: int | None = None) -> list[dict[str, Any]]:
        """Entries `{name, path, type, size, mode, modifiedAt, ...}` under path."""
        params: dict[str, Any] = {"path": C.abs_path(path)}
        if depth is not None:
            params["depth"] = depth
        if hidden is not None:
            params["hidden"] = "true" if hidden else "false"
        if limit is not None:
            params["limit"] = limit
        return list((await self._s.client.json("GET", self._p("/files/list"), params=params)).get("data") or [])

    async def stat(self, path: str) -> dict[str, Any]:
        """The entry, with `exists: true`, or `{"exists": false}`."""
        return await self._s.client.json("GET", self._p("/files/stat"), params={"path": C.abs_path(path)}) or {}

    async def exists(self, path: str) -> bool:
        return bool((await self.stat(path)).get("exists"))

    async def mkdir(self, path: str, parents: bool = True) -> None:
        await self._s.client.request("POST", self._p("/files:mkdir"), json={"path": C.abs_path(path), "parents": parents})

    async def remove(self, path: str, recursive: bool = False) -> bool:
        """Removes a file (or a tree with recursive=True); True if something was removed."""
        r = await self._s.client.json("POST", self._p("/files:remove"),
                                      json={"path": C.abs_path(path), "recursive": recursive}) or {}
        return bool(r.get("removed"))


class AsyncProcesses:
    """`sbx.processes`: background processes that outlive the request (servers, long jobs)."""

    def __init__(self, sbx: AsyncSandbox) -> None:
        self._s = sbx

    def _p(self, pid: str, suffix: str = "") -> str:
        return self._s._p(f"/processes/{C.seg(pid)}{suffix}")

    async def spawn(self, command: str | Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
                    stdin: str | bytes | None = None, timeout: float | None = None, user: str | None = None
                    ) -> ProcessInfo:
        """Starts a process and returns at once (no time limit unless `timeout` is given)."""
        body = C.command_body(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, user=user)
        return ProcessInfo.from_json(await self._s.client.json("POST", self._s._p("/processes"), json=body))

    async def list(self) -> list[ProcessInfo]:
        page = await self._s.client.json("GET", self._s._p("/processes")) or {}
        return [ProcessInfo.from_json(d) for d in page.get("data") or []]

    async def get(self, pid: str) -> ProcessInfo:
        return ProcessInfo.from_json(await self._s.client.json("GET", self._p(pid)))

    async def signal(self, pid: str, signal: str | int = "SIGTERM") -> None:
        await self._s.client.request("POST", self._p(pid, ":signal"), json={"signal": C.signal_name(signal)})

    async def kill(self, pid: str) -> None:
        await self.signal(pid, "SIGKILL")

    async def output(self, pid: str, *, cursor: int = 0, follow: bool = False, wait_ms: int | None = None
                     ) -> ProcessOutput:
        """Output since `cursor` (a byte offset across both streams). With follow=True,
        waits for the process to end; pass `next_cursor` back to read on."""
        if follow:
            acc = ExecAccumulator()
            acc.cursor = OutputCursor(cursor)
            acc.process_id = pid
            await self._s._follow(acc, self._s.client.timeout)
            res = acc.result()
            return ProcessOutput(res.stdout, res.stderr, acc.cursor.offset, True, res.exit_code,
                                 (acc.exit or {}).get("state"), res.timed_out, acc.cursor.truncated)
        params: dict[str, Any] = {"cursor": cursor}
        if wait_ms is not None:
            params["waitMs"] = wait_ms
        events: list[dict[str, Any]] = []
        async with self._s.client.stream("GET", self._p(pid, "/output"), params=params, accept=NDJSON) as resp:
            async for line in resp.aiter_lines():
                event = parse_line(line)
                if event is not None:
                    events.append(event)
        return C.collect_output(events, cursor)

    async def stream(self, pid: str, *, cursor: int = 0) -> AsyncIterator[OutputEvent]:
        """Yields output events until the process exits (resuming cut streams)."""
        cur = OutputCursor(cursor)
        idle = 0
        while True:
            before = cur.offset
            try:
                async with self._s.client.stream("GET", self._p(pid, "/output"),
                                                 params={"cursor": cur.offset, "follow": "true"}) as resp:
                    async for line in resp.aiter_lines():
                        event = parse_line(line)
                        if event is None:
                            continue
                        if event["type"] == "error":
                            from ._errors import error_from_payload

                            raise error_from_payload(event.get("error") or {}, 0)
                        if event["type"] == "exit":
                            yield OutputEvent("exit", payload=event)
                            return
                        if event["type"] == "continue":
                            break
                        for ev in cur.feed(event):
                            yield ev
            except (httpx.TransportError, StreamBroken):
                pass
            idle = idle + 1 if cur.offset == before else 0
            if idle >= 4:
                raise APIConnectionError(f"lost the output of {pid}")
            await asyncio.sleep(retry_delay(idle, self._s.client.backoff) if idle else 0)

    async def wait(self, pid: str, *, cursor: int = 0) -> CommandResult:
        """Waits for the process to end; returns its output from `cursor` on and its exit."""
        out = await self.output(pid, cursor=cursor, follow=True)
        return CommandResult(exit_code=out.exit_code, stdout=out.stdout, stderr=out.stderr, timed_out=out.timed_out,
                             stdout_truncated=out.truncated, stderr_truncated=out.truncated, process_id=pid)
