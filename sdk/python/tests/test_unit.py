"""Unit tests: no server. HTTP is faked with httpx.MockTransport."""
from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

import emberbox
from emberbox import (
    APIConnectionError,
    AsyncClient,
    AsyncSandbox,
    AuthenticationError,
    Client,
    ConfigurationError,
    ConflictError,
    FileNotFoundInSandboxError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    Sandbox,
    SandboxNotRunningError,
    ServiceUnavailableError,
)
from emberbox._errors import APIError, error_from_payload, error_from_response
from emberbox._stream import ExecAccumulator, OutputCursor, StreamBroken, parse_line
from emberbox.tools import clip, resolve_path, sandbox_tools

URL = "http://127.0.0.1:9"
SBX = {"id": "sbx_1", "state": "running"}


def err_body(status: int, code: str, **extra) -> bytes:
    return json.dumps({"error": {"code": code, "status": status, "message": f"m-{code}", "hint": "h",
                                 "requestId": "req_1", **extra}}).encode()


def client(handler, **kw) -> Client:
    return Client(URL, "k", transport=httpx.MockTransport(handler), backoff=0, **kw)


def ndjson(*events) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


# --- configuration -----------------------------------------------------------
def test_config_from_env_with_runtime_fallback(monkeypatch):
    for v in ("EMBERBOX_API_URL", "EMBERBOX_API_KEY", "RUNTIME_API_URL", "RUNTIME_API_KEY"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ConfigurationError):
        Client()
    monkeypatch.setenv("RUNTIME_API_URL", "http://127.0.0.1:1234/")
    monkeypatch.setenv("RUNTIME_API_KEY", "rk")
    c = Client()
    assert (c.api_url, c.api_key) == ("http://127.0.0.1:1234", "rk")
    monkeypatch.setenv("EMBERBOX_API_URL", "http://127.0.0.1:5678")
    monkeypatch.setenv("EMBERBOX_API_KEY", "ek")
    c = Client()
    assert (c.api_url, c.api_key) == ("http://127.0.0.1:5678", "ek")
    c = Client("http://localhost:1", "arg")
    assert (c.api_url, c.api_key) == ("http://localhost:1", "arg")
    with pytest.raises(ConfigurationError):
        Client("http://127.0.0.1:1/v1", "k")
    with pytest.raises(ConfigurationError):
        Client("ftp://x", "k")


# --- error mapping -----------------------------------------------------------
@pytest.mark.parametrize("status,code,cls", [
    (400, "invalid_request", InvalidRequestError),
    (401, "unauthorized", AuthenticationError),
    (403, "permission_denied", PermissionDeniedError),
    (404, "not_found", NotFoundError),
    (404, "file_not_found", FileNotFoundInSandboxError),
    (409, "is_a_directory", ConflictError),
    (409, "not_running", SandboxNotRunningError),
    (409, "sandbox_stopped", SandboxNotRunningError),
    (413, "too_large", InvalidRequestError),
    (422, "idempotency_key_reused", InvalidRequestError),
    (429, "rate_limited", RateLimitError),
    (500, "internal", ServiceUnavailableError),
    (503, "busy", ServiceUnavailableError),
])
def test_error_mapping_by_status_and_code(status, code, cls):
    e = error_from_response(status, err_body(status, code))
    assert type(e) is cls
    assert (e.status, e.code, e.message, e.hint, e.request_id) == (status, code, f"m-{code}", "h", "req_1")
    assert code in str(e)


def test_error_mapping_non_json_and_stream_event():
    e = error_from_response(502, b"<html>bad gateway</html>")
    assert isinstance(e, ServiceUnavailableError) and e.code == "request_failed" and "bad gateway" in e.message
    # an `error` event in a stream may carry no usable status: the code decides
    e = error_from_payload({"code": "file_not_found", "message": "x"})
    assert isinstance(e, FileNotFoundInSandboxError)
    e = error_from_payload({"code": "whatever", "message": "x"})
    assert type(e) is APIError


def test_errors_raised_through_client():
    c = client(lambda req: httpx.Response(404, content=err_body(404, "not_found")))
    with pytest.raises(NotFoundError) as ei:
        c.json("GET", "/v1/sandboxes/nope")
    assert ei.value.request_id == "req_1"


# --- retries -----------------------------------------------------------------
def test_retries_429_503_and_transport_errors_with_same_key():
    seen: list[httpx.Request] = []
    answers = [
        lambda: httpx.Response(429, content=err_body(429, "rate_limited", retryAfterMs=0)),
        lambda: httpx.Response(503, content=err_body(503, "busy"), headers={"retry-after": "0"}),
        "connect",
        "read",
        lambda: httpx.Response(200, json={"id": "sbx_1", "state": "running"}),
    ]

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        a = answers.pop(0)
        if a == "connect":
            raise httpx.ConnectError("refused", request=req)
        if a == "read":
            raise httpx.ReadTimeout("slow", request=req)
        return a()

    c = client(handler, max_retries=4)
    info = c.json("POST", "/v1/sandboxes", json={})
    assert info["id"] == "sbx_1"
    keys = {r.headers["Idempotency-Key"] for r in seen}
    assert len(seen) == 5 and len(keys) == 1 and next(iter(keys))
    assert all(r.content == b"{}" for r in seen)


def test_retries_give_up_after_max_and_keep_the_error():
    calls = []

    def handler(req):
        calls.append(req.headers.get("Idempotency-Key"))
        return httpx.Response(503, content=err_body(503, "busy"))

    with pytest.raises(ServiceUnavailableError):
        client(handler, max_retries=2).json("POST", "/v1/x", json={})
    assert len(calls) == 3 and len(set(calls)) == 1

    def down(req):
        raise httpx.ConnectError("refused", request=req)

    with pytest.raises(APIConnectionError):
        client(down, max_retries=1).json("GET", "/v1/x")


@pytest.mark.parametrize("status,body", [
    (500, err_body(500, "internal")),                              # 500 is not retried
    (503, err_body(503, "unavailable")),                           # deliberate
    (503, err_body(503, "busy", retryable=False)),                 # the answer says no
    (409, err_body(409, "not_running")),
    (400, err_body(400, "invalid_request")),
])
def test_not_retried(status, body):
    calls = []

    def handler(req):
        calls.append(1)
        return httpx.Response(status, content=body)

    with pytest.raises(APIError):
        client(handler).json("POST", "/v1/x", json={})
    assert len(calls) == 1


def test_500_retried_when_answer_says_retryable():
    answers = [httpx.Response(500, content=err_body(500, "x", retryable=True)), httpx.Response(200, json={"ok": 1})]
    assert client(lambda req: answers.pop(0)).json("POST", "/v1/x", json={}) == {"ok": 1}


def test_get_has_no_idempotency_key_and_headers():
    seen = []

    def handler(req):
        seen.append(req)
        return httpx.Response(200, json={"data": []})

    c = client(handler)
    c.json("GET", "/v1/sandboxes")
    c.json("DELETE", "/v1/sandboxes/x")
    assert "Idempotency-Key" not in seen[0].headers
    assert seen[1].headers["Idempotency-Key"]
    assert seen[0].headers["Authorization"] == "Bearer k"


def test_async_retries_same_key():
    seen = []
    answers = [httpx.Response(429, content=err_body(429, "rate_limited")), httpx.Response(200, json=SBX)]

    def handler(req):
        seen.append(req.headers["Idempotency-Key"])
        return answers.pop(0)

    async def go():
        c = AsyncClient(URL, "k", transport=httpx.MockTransport(handler), backoff=0)
        try:
            return await c.json("POST", "/v1/sandboxes", json={})
        finally:
            await c.aclose()

    assert asyncio.run(go()) == SBX
    assert len(seen) == 2 and seen[0] == seen[1]


# --- stream parsing ----------------------------------------------------------
def test_parse_line():
    assert parse_line(b"  \n") is None
    assert parse_line('{"type":"start","processId":"p"}') == {"type": "start", "processId": "p"}
    with pytest.raises(StreamBroken):
        parse_line('{"type":"std')
    with pytest.raises(StreamBroken):
        parse_line('{"no":"type"}')


def test_cursor_offsets_gap_duplicates_and_base64():
    cur = OutputCursor()
    ev = cur.feed({"type": "stdout", "data": "héllo", "offset": 0})
    assert [e.data for e in ev] == ["héllo"] and cur.offset == 6  # bytes, not characters
    assert cur.feed({"type": "stdout", "data": "héllo", "offset": 0}) == []  # duplicate dropped
    ev = cur.feed({"type": "stderr", "data": "\ufffd", "base64": base64.b64encode(b"\xff\xfe").decode(),
                   "offset": 6})
    assert ev[0].raw == b"\xff\xfe" and cur.offset == 8 and not cur.truncated
    ev = cur.feed({"type": "stdout", "data": "abc", "offset": 10})  # 2 bytes missing
    assert [e.type for e in ev] == ["truncated", "stdout"]
    assert cur.truncated and cur.dropped_bytes == 2 and cur.offset == 13
    ev = cur.feed({"type": "stdout", "data": "cdef", "offset": 12})  # overlap trimmed
    assert ev[0].raw == b"def" and cur.offset == 16


def test_accumulator_result_and_flags():
    acc = ExecAccumulator()
    got = []
    acc.on_stdout = got.append
    for e in [{"type": "start", "processId": "proc_1"},
              {"type": "stdout", "data": "a\n", "offset": 0},
              {"type": "stderr", "data": "e\n", "offset": 2},
              {"type": "stdout", "data": "z\n", "offset": 9}]:
        assert acc.handle(e) is False
    assert acc.handle({"type": "exit", "exitCode": 1, "timedOut": False, "durationMs": 5}) is True
    r = acc.result()
    assert (r.exit_code, r.stdout, r.stderr, r.process_id) == (1, "a\nz\n", "e\n", "proc_1")
    assert r.stdout_truncated and r.stderr_truncated
    assert got == ["a\n", "z\n"]


def _stream_sandbox(handler) -> Sandbox:
    return Sandbox(client(handler), dict(SBX))


def test_streamed_exec_over_http_with_continue_and_cut():
    requests = []

    def handler(req: httpx.Request) -> httpx.Response:
        requests.append(req)
        if req.url.path.endswith(":exec"):
            body = json.loads(req.content)
            assert body["stream"] is True and body["timeoutMs"] == 300000 and req.headers["Accept"] == "application/x-ndjson"
            return httpx.Response(200, content=ndjson(
                {"type": "start", "processId": "proc_9"},
                {"type": "stdout", "data": "one\n", "offset": 0},
                {"type": "continue", "processId": "proc_9", "cursor": 4}))
        assert req.url.path == "/v1/sandboxes/sbx_1/processes/proc_9/output"
        cursor = int(req.url.params["cursor"])
        assert req.url.params["follow"] == "true"
        if cursor == 4 and len(requests) == 2:  # ends without exit: the client must read on
            return httpx.Response(200, content=ndjson({"type": "stderr", "data": "two\n", "offset": 4}))
        assert cursor == 8
        return httpx.Response(200, content=ndjson({"type": "stdout", "data": "3\n", "offset": 8},
                                                  {"type": "exit", "exitCode": 0, "timedOut": False}))

    out = []
    r = _stream_sandbox(handler).exec("x", timeout=300, on_stdout=out.append)
    assert (r.exit_code, r.stdout, r.stderr, r.truncated) == (0, "one\n3\n", "two\n", False)
    assert out == ["one\n", "3\n"]
    assert len(requests) == 3


def test_streamed_exec_gap_sets_truncated_and_error_event_raises():
    def handler(req):
        return httpx.Response(200, content=ndjson(
            {"type": "start", "processId": "p"},
            {"type": "stdout", "data": "a", "offset": 0},
            {"type": "stdout", "data": "b", "offset": 5},
            {"type": "exit", "exitCode": 0}))

    r = _stream_sandbox(handler).exec("x", stream=True)
    assert r.stdout == "ab" and r.stdout_truncated and r.stderr_truncated

    def failing(req):
        return httpx.Response(200, content=ndjson(
            {"type": "start", "processId": "p"},
            {"type": "error", "error": {"code": "sandbox_stopped", "status": 409, "message": "gone"}}))

    with pytest.raises(SandboxNotRunningError):
        _stream_sandbox(failing).exec("x", stream=True)


def test_exec_request_body_and_non_streamed():
    seen = []

    def handler(req):
        seen.append(json.loads(req.content))
        return httpx.Response(200, json={"exitCode": 0, "stdout": "ok", "stderr": "", "timedOut": False})

    s = _stream_sandbox(handler)
    r = s.exec(["cat"], cwd="proj", env={"A": "1"}, stdin=b"\x00\x01", timeout=5)
    assert r.ok and r.stdout == "ok"
    assert seen[0] == {"argv": ["cat"], "cwd": "/workspace/proj", "env": {"A": "1"},
                       "stdinBase64": "AAE=", "timeoutMs": 5000}
    s.exec("echo hi", stdin="text")
    assert seen[1] == {"command": "echo hi", "stdin": "text"}


# --- file writes and chunked uploads -----------------------------------------
MiB = 1 << 20
UP = "/v1/sandboxes/sbx_1/uploads"


class FakeUploads:
    """The upload routes of one sandbox, as a MockTransport handler. `fail` maps a
    chunk offset to the answers it gives before it takes the chunk."""

    def __init__(self, *, chunk_bytes=MiB, grant_mode=True, fail=None, commit=None, begin=None):
        import threading

        self.lock = threading.Lock()
        self.chunk_bytes = chunk_bytes
        self.grant_mode = grant_mode
        self.fail = {k: list(v) for k, v in (fail or {}).items()}
        self.commit = list(commit or [])
        self.begin = list(begin or [])
        self.log: list[tuple[str, str, object]] = []  # (method, path, offset or body)
        self.keys: dict[int, set[str]] = {}
        self.chunks: dict[int, bytes] = {}
        self.began: dict | None = None

    def __call__(self, req: httpx.Request) -> httpx.Response:
        import hashlib

        path = req.url.path
        with self.lock:
            if req.method == "POST" and path == UP:
                body = json.loads(req.content)
                self.log.append(("begin", path, body))
                if self.begin:
                    return self.begin.pop(0)()
                self.began = body
                out = {"uploadId": "upl_1", "chunkBytes": self.chunk_bytes, "path": body["path"],
                       "size": body["size"], "sha256": body["sha256"]}
                if self.grant_mode and "mode" in body:
                    out["mode"] = format(int(body["mode"], 8) & 0o777, "03o")
                return httpx.Response(200, json=out)
            if req.method == "PUT" and path == UP + "/upl_1":
                off = int(req.url.params["offset"])
                self.log.append(("chunk", path, off))
                self.keys.setdefault(off, set()).add(req.headers["Idempotency-Key"])
                answers = self.fail.get(off)
                if answers:
                    return answers.pop(0)()
                self.chunks[off] = req.content
                return httpx.Response(200, json={"uploadId": "upl_1", "offset": off, "bytes": len(req.content)})
            if req.method == "POST" and path == UP + "/upl_1:commit":
                self.log.append(("commit", path, json.loads(req.content)))
                if self.commit:
                    return self.commit.pop(0)()
                data = b"".join(self.chunks[o] for o in sorted(self.chunks))
                assert len(data) == self.began["size"]
                assert hashlib.sha256(data).hexdigest() == self.began["sha256"]
                return httpx.Response(200, json={"path": self.began["path"], "size": len(data), "mode": "644"})
            if req.method == "POST" and path == UP + "/upl_1:abort":
                self.log.append(("abort", path, json.loads(req.content)))
                return httpx.Response(200, json={"aborted": True, "uploadId": "upl_1"})
            if req.method == "POST" and path == "/v1/sandboxes/sbx_1/files:chmod":
                self.log.append(("chmod", path, json.loads(req.content)))
                return httpx.Response(200, json={"path": "x", "mode": "755"})
        raise AssertionError(f"unexpected {req.method} {req.url}")

    def data(self) -> bytes:
        return b"".join(self.chunks[o] for o in sorted(self.chunks))

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.log]


def _async_write(fake, path, blob, **kw):
    async def go():
        c = AsyncClient(URL, "k", transport=httpx.MockTransport(fake), backoff=0)
        try:
            return await AsyncSandbox(c, dict(SBX)).files.write(path, blob, **kw)
        finally:
            await c.aclose()

    return asyncio.run(go())


def _sync_write(fake, path, blob, **kw):
    return Sandbox(client(fake), dict(SBX)).files.write(path, blob, **kw)


WRITERS = pytest.mark.parametrize("write", [_sync_write, _async_write], ids=["sync", "async"])


@WRITERS
def test_large_write_under_workspace_uses_uploads(write):
    import hashlib

    blob = bytes(range(256)) * (3 * MiB // 256) + b"odd-tail"  # 3 MiB + 8: four chunks, the last short
    fake = FakeUploads()
    assert write(fake, "big/f.bin", blob) == {"path": "/workspace/big/f.bin", "size": len(blob)}
    kinds = fake.kinds()
    assert kinds[0] == "begin" and kinds[-1] == "commit" and kinds.count("chunk") == 4
    assert fake.log[0][2] == {"path": "/workspace/big/f.bin", "size": len(blob),
                              "sha256": hashlib.sha256(blob).hexdigest()}  # no mode unless asked
    assert sorted(o for k, _, o in fake.log if k == "chunk") == [0, MiB, 2 * MiB, 3 * MiB]
    assert [len(fake.chunks[o]) for o in sorted(fake.chunks)] == [MiB, MiB, MiB, 8]
    assert fake.data() == blob
    assert fake.log[-1][2] == {}
    keys = [k for ks in fake.keys.values() for k in ks]
    assert len(keys) == 4 and len(set(keys)) == 4  # one Idempotency-Key per chunk


@WRITERS
def test_upload_follows_the_servers_chunk_size(write):
    blob = b"z" * (MiB + 1)
    fake = FakeUploads(chunk_bytes=256 * 1024)
    write(fake, "/workspace/f", blob)
    assert sorted(fake.chunks) == [i * 256 * 1024 for i in range(5)] and fake.data() == blob


@WRITERS
def test_upload_chunk_retried_with_same_key(write):
    blob = b"q" * (2 * MiB + 3)
    fake = FakeUploads(fail={MiB: [lambda: httpx.Response(503, content=err_body(503, "busy")),
                                   lambda: httpx.Response(429, content=err_body(429, "rate_limited"))]})
    write(fake, "f.bin", blob)
    assert fake.kinds().count("chunk") == 5 and "abort" not in fake.kinds()
    assert len(fake.keys[MiB]) == 1  # the retries reused the chunk's key
    assert fake.data() == blob


@WRITERS
def test_upload_aborted_when_a_chunk_fails(write):
    blob = b"q" * (5 * MiB)
    fake = FakeUploads(fail={2 * MiB: [lambda: httpx.Response(400, content=err_body(400, "invalid_request"))]})
    with pytest.raises(InvalidRequestError):
        write(fake, "f.bin", blob)
    kinds = fake.kinds()
    assert kinds[0] == "begin" and kinds[-1] == "abort" and "commit" not in kinds
    assert fake.log[-1][1] == UP + "/upl_1:abort" and fake.log[-1][2] == {}


@WRITERS
def test_upload_aborted_when_the_commit_fails(write):
    fake = FakeUploads(commit=[lambda: httpx.Response(400, content=err_body(400, "checksum_mismatch"))])
    with pytest.raises(InvalidRequestError) as ei:
        write(fake, "f.bin", b"x" * (MiB + 1))
    assert ei.value.code == "checksum_mismatch"
    assert fake.kinds()[-2:] == ["commit", "abort"]


@WRITERS
def test_upload_commit_waits_while_busy(write):
    fake = FakeUploads(commit=[lambda: httpx.Response(409, content=err_body(409, "idempotency_in_progress",
                                                                             retryAfterMs=0))])
    write(fake, "f.bin", b"x" * (MiB + 1))
    assert fake.kinds()[-2:] == ["commit", "commit"] and "abort" not in fake.kinds()


@WRITERS
@pytest.mark.parametrize("mode,grant,sent,chmod", [
    ("755", True, "755", None),            # the commit applies it: no chmod
    (0o640, True, "640", None),            # ints are octal bits
    ("0755", True, "0755", None),          # "755" back is the same mode
    ("4755", True, "4755", "4755"),        # the commit keeps only 0777: chmod follows
    ("755", False, "755", "755"),          # no mode in the answer: chmod follows
])
def test_upload_mode(write, mode, grant, sent, chmod):
    fake = FakeUploads(grant_mode=grant)
    write(fake, "f.bin", b"x" * (MiB + 1), mode=mode)
    assert fake.log[0][2]["mode"] == sent
    if chmod is None:
        assert "chmod" not in fake.kinds()
    else:
        assert fake.kinds()[-2:] == ["commit", "chmod"]
        assert fake.log[-1][2] == {"path": "/workspace/f.bin", "mode": chmod}


@WRITERS
def test_upload_begin_without_mode_on_old_guest(write):
    fake = FakeUploads(begin=[lambda: httpx.Response(409, content=err_body(409, "guest_upgrade_required"))])
    write(fake, "f.bin", b"x" * (MiB + 1), mode="700")
    assert fake.log[0][2]["mode"] == "700" and "mode" not in fake.log[1][2]
    assert fake.kinds()[-1] == "chmod" and fake.log[-1][2]["mode"] == "700"


def test_bad_mode_refused_before_any_request():
    with pytest.raises(ValueError):
        _sync_write(lambda req: pytest.fail("no request expected"), "f", b"x", mode="rwx")
    with pytest.raises(ValueError):
        _sync_write(lambda req: pytest.fail("no request expected"), "f", b"x", mode="0o755")


@WRITERS
def test_small_write_is_one_put(write):
    seen = []

    def handler(req):
        seen.append(req)
        return httpx.Response(200, json={"path": "/workspace/s.txt", "size": 3})

    assert write(handler, "s.txt", "abc", mode=0o755) == {"path": "/workspace/s.txt", "size": 3}
    assert len(seen) == 1 and seen[0].method == "PUT" and seen[0].url.path == "/v1/sandboxes/sbx_1/files/content"
    assert dict(seen[0].url.params) == {"path": "/workspace/s.txt", "mode": "755"} and seen[0].content == b"abc"
    seen.clear()
    write(handler, "/workspace/m.bin", b"m" * MiB)  # exactly 1 MiB still fits one PUT
    assert len(seen) == 1 and seen[0].method == "PUT"


@WRITERS
def test_large_write_outside_workspace_goes_up_in_parts(write):
    puts, execs, other = [], [], []

    def handler(req):
        if req.method == "PUT" and req.url.path.endswith("/files/content"):
            puts.append((req.url.params["path"], len(req.content)))
            return httpx.Response(200, json={})
        if req.url.path.endswith(":exec"):
            execs.append(json.loads(req.content))
            if execs[-1].get("stream"):  # a 300 s timeout streams the command
                return httpx.Response(200, content=ndjson({"type": "start", "processId": "p"},
                                                          {"type": "exit", "exitCode": 0}))
            return httpx.Response(200, json={"exitCode": 0, "stdout": "", "stderr": "", "timedOut": False})
        other.append((req.method, req.url.path, json.loads(req.content or b"null")))
        return httpx.Response(200, json={})

    blob = b"p" * (2 * MiB + 1)
    write(handler, "/tmp/big.bin", blob, mode="600")
    assert [n for _, n in puts] == [MiB, MiB, 1]
    assert all(p.startswith("/tmp/big.bin.emberbox-") for p, _ in puts)
    assert execs[0]["argv"][:5] == ["sh", "-c", execs[0]["argv"][2], "sh", "/tmp/big.bin"]
    assert execs[0]["argv"][5:] == [p for p, _ in puts]
    assert other == [("POST", "/v1/sandboxes/sbx_1/files:chmod", {"path": "/tmp/big.bin", "mode": "600"})]


# --- paths and clipping ------------------------------------------------------
@pytest.mark.parametrize("path,expected", [
    (None, "/workspace"), ("", "/workspace"), (".", "/workspace"), ("a/b.txt", "/workspace/a/b.txt"),
    ("./a/../b", "/workspace/b"), ("/etc/hosts", "/etc/hosts"), ("/workspace//x/", "/workspace/x"),
    ("~/notes.md", "/workspace/notes.md"), ("../tmp/x", "/tmp/x"),
])
def test_resolve_path(path, expected):
    assert resolve_path(path) == expected


def test_resolve_path_custom_root():
    assert resolve_path("src", "/workspace/repo") == "/workspace/repo/src"


def test_clip_keeps_tail_and_says_how_much():
    assert clip("short", 10) == "short"
    c = clip("x" * 25 + "END", 10)
    assert c.endswith("x" * 7 + "END") and c.startswith("[18 earlier characters omitted]\n")


# --- tools without a server ----------------------------------------------------
def test_tools_shape_and_errors_as_text():
    def handler(req):
        p = req.url.path
        if p.endswith(":exec"):
            return httpx.Response(200, content=ndjson(
                {"type": "start", "processId": "p"},
                {"type": "stdout", "data": "y" * 50, "offset": 0},
                {"type": "exit", "exitCode": 0, "timedOut": False}))
        if p.endswith("/files/content") and req.method == "GET":
            return httpx.Response(404, content=err_body(404, "file_not_found"))
        if p.endswith("/files/content"):
            return httpx.Response(403, content=err_body(403, "permission_denied"))
        if p.endswith("/files/list"):
            assert req.url.params["path"] == "/workspace/src" and req.url.params["depth"] == "10"
            return httpx.Response(200, json={"data": [{"name": "a", "path": "/workspace/src/a", "type": "file",
                                                       "size": 3, "mode": "644"}]})
        raise AssertionError(p)

    ex, rd, wr, ls = sandbox_tools(_stream_sandbox(handler), max_output_chars=20)
    assert [f.__name__ for f in (ex, rd, wr, ls)] == ["runtime_exec", "runtime_read_file", "runtime_write_file",
                                                      "runtime_list_files"]
    r = ex("echo")
    assert r["exit_code"] == 0 and r["stdout"] == "[30 earlier characters omitted]\n" + "y" * 20
    assert set(r) == {"exit_code", "stdout", "stderr", "timed_out"}
    assert rd("missing.txt") == "No such file: /workspace/missing.txt"
    assert wr("/etc/x", "data").startswith("Could not write /etc/x: permission_denied")
    assert ls("src", depth=99) == [{"path": "/workspace/src/a", "type": "file", "size": 3}]


def test_tools_wrap_with_smolagents_tool():
    smolagents = pytest.importorskip("smolagents")
    s = Sandbox(client(lambda r: httpx.Response(500)), dict(SBX))
    tools = [smolagents.tool(f) for f in sandbox_tools(s)]
    by = {t.name: t for t in tools}
    assert by["runtime_exec"].output_type == "object"
    assert by["runtime_read_file"].output_type == "string"
    assert by["runtime_list_files"].output_type == "array"
    assert by["runtime_exec"].inputs["cwd"]["nullable"] is True
    assert by["runtime_exec"].inputs["timeout_seconds"]["type"] == "integer"
    # errors come back as data, not exceptions
    assert by["runtime_exec"](command="true")["exit_code"] is None


def test_async_tools_are_coroutines():
    s = AsyncSandbox(AsyncClient(URL, "k", transport=httpx.MockTransport(lambda r: httpx.Response(500))), dict(SBX))
    tools = sandbox_tools(s)
    assert all(asyncio.iscoroutinefunction(f) for f in tools)


def test_requirement_names():
    pytest.importorskip("smolagents")
    from emberbox.smolagents import _requirement_to_module as m
    assert m("numpy") == ("numpy", "numpy")
    assert m("numpy.*") == ("numpy", "numpy")
    assert m("pillow") == ("pillow", "PIL")
    assert m("PIL") == ("pillow", "PIL")
    assert m("scikit-learn>=1.3") == ("scikit-learn>=1.3", "sklearn")
    assert m("requests==2.32.3") == ("requests==2.32.3", "requests")
    assert m("*") is None


def test_public_surface():
    for name in ("Sandbox", "AsyncSandbox", "Client", "AsyncClient", "CommandResult", "NotFoundError"):
        assert hasattr(emberbox, name)
    for meth in ("create", "connect", "list", "exec", "extend", "stop", "delete", "refresh"):
        assert hasattr(Sandbox, meth) and hasattr(AsyncSandbox, meth)
    for meth in ("read", "write", "list", "stat", "mkdir", "remove"):
        assert hasattr(emberbox.Files, meth) and hasattr(emberbox.AsyncFiles, meth)
    for meth in ("spawn", "list", "output", "signal"):
        assert hasattr(emberbox.Processes, meth) and hasattr(emberbox.AsyncProcesses, meth)
