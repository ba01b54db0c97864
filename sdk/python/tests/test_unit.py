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
    (503, err_body(503, "checkpoints_unavailable")),               # deliberate
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
    for name in ("Execution", "Result", "ExecutionError", "Logs", "Context", "Interpreter", "AsyncInterpreter"):
        assert hasattr(emberbox, name)
    for meth in ("create", "connect", "list", "exec", "run_code", "extend", "stop", "delete", "refresh"):
        assert hasattr(Sandbox, meth) and hasattr(AsyncSandbox, meth)
    for meth in ("read", "write", "list", "stat", "mkdir", "remove"):
        assert hasattr(emberbox.Files, meth) and hasattr(emberbox.AsyncFiles, meth)
    for meth in ("spawn", "list", "output", "signal"):
        assert hasattr(emberbox.Processes, meth) and hasattr(emberbox.AsyncProcesses, meth)
    for meth in ("create", "list", "restart", "interrupt", "remove"):
        assert hasattr(emberbox.InterpreterContexts, meth) and hasattr(emberbox.AsyncInterpreterContexts, meth)


# --- code interpreter: run_code and contexts -----------------------------------
IP = "/v1/sandboxes/sbx_1/interpreter"
ANSI_TB = "\x1b[0;31mValueError\x1b[0m                                Traceback (most recent call last)\nCell \x1b[0;32mIn[3], line 2\x1b[0m\n\x1b[0;31mValueError\x1b[0m: boom"


def _png(color=(255, 0, 0), size=(4, 3)) -> bytes:
    from io import BytesIO

    PIL = pytest.importorskip("PIL.Image")
    buf = BytesIO()
    PIL.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _execution(**kw) -> dict:
    base = {"status": "ok", "stdout": "", "stderr": "", "results": [], "error": None, "executionCount": 1}
    base.update(kw)
    return base


class FakeInterpreter:
    """The interpreter routes of sandbox sbx_1, as a MockTransport handler. `runs` holds
    what each `:run` answers, in order: an execution dict (sent as JSON, or streamed as
    NDJSON with `stream` lines first when the request asks to stream), or a function of
    the request body returning (stream lines, execution)."""

    def __init__(self, runs=(), files=None):
        self.runs = list(runs)
        self.files = dict(files or {})  # result name -> bytes
        self.requests: list[tuple[str, str, dict | None, httpx.Request]] = []
        self.contexts = {"python": {"id": "python", "language": "python", "cwd": "/workspace"}}
        self.made = 0

    def bodies(self, suffix=":run"):
        return [b for m, p, b, _ in self.requests if p.endswith(suffix)]

    def __call__(self, req: httpx.Request) -> httpx.Response:
        path, method = req.url.path, req.method
        body = json.loads(req.content) if req.content else None
        self.requests.append((method, path, body, req))
        if method == "POST" and path == IP + ":run":
            assert self.runs, f"unexpected run {body}"
            answer = self.runs.pop(0)
            lines, execution = answer(body) if callable(answer) else ([], answer)
            if body.get("stream"):
                assert req.headers["Accept"] == "application/x-ndjson"
                tail = [] if execution is None else [{"k": "execution", "execution": execution}]
                return httpx.Response(200, content=ndjson(*lines, *tail),
                                      headers={"content-type": "application/x-ndjson"})
            assert req.headers["Accept"] == "application/json"
            return httpx.Response(200, json=execution)
        if path == IP + "/contexts" and method == "POST":
            self.made += 1
            ctx = {"id": body.get("id") or f"ctx-{self.made}", "language": body.get("language", "python"),
                   "cwd": body.get("cwd", "/workspace")}
            self.contexts[ctx["id"]] = ctx
            return httpx.Response(200, json=ctx)
        if path == IP + "/contexts" and method == "GET":
            return httpx.Response(200, json={"data": list(self.contexts.values())})
        if method == "POST" and path == "/v1/sandboxes/sbx_1:exec":  # the executor's import check
            assert body["argv"][:2] == ["python3", "-c"]
            return httpx.Response(200, json={"exitCode": 0, "stdout": "[]", "stderr": "", "timedOut": False})
        if path.startswith(IP + "/contexts/"):
            rest = path[len(IP + "/contexts/"):]
            if "/results/" in rest:
                name = rest.split("/results/")[1]
                if name not in self.files:
                    return httpx.Response(404, content=err_body(404, "not_found"))
                assert req.headers["Accept"] == "application/octet-stream"
                return httpx.Response(200, content=self.files[name])
            cid, _, action = rest.partition(":")
            if cid not in self.contexts:
                return httpx.Response(404, content=err_body(404, "context_not_found"))
            if method == "DELETE":
                del self.contexts[cid]
                return httpx.Response(200, json={"id": cid, "deleted": True})
            if action == "restart":
                return httpx.Response(200, json=self.contexts[cid])
            if action == "interrupt":
                return httpx.Response(200, json={"interrupted": True})
        raise AssertionError(f"unexpected {method} {req.url}")


def _isbx(fake) -> Sandbox:
    return Sandbox(client(fake), dict(SBX))


def test_run_code_plain_json_and_result_accessors():
    png = base64.b64encode(_png()).decode()
    fake = FakeInterpreter([_execution(
        stdout="a\nb\npartial", stderr="warn\n", executionCount=7,
        results=[
            {"main": False, "data": {"image/png": png, "text/plain": "<Figure size 640x480 with 1 Axes>"}},
            {"main": True, "data": {"text/plain": "42", "text/html": "<b>42</b>", "text/markdown": "**42**",
                                    "image/svg+xml": "<svg/>", "image/jpeg": "/9j/", "application/pdf": "JVBE",
                                    "text/latex": "$42$", "application/json": {"v": 42},
                                    "application/javascript": "x()", "application/vnd.custom": "c"}},
        ])])
    s = _isbx(fake)
    ex = s.run_code("x = 41\nx + 1", timeout=5)
    [(method, path, body, req)] = fake.requests
    assert (method, path, body) == ("POST", IP + ":run", {"code": "x = 41\nx + 1", "timeoutMs": 5000})
    assert req.headers["Idempotency-Key"]
    assert ex.logs.stdout == ["a\n", "b\n", "partial"] and ex.logs.stderr == ["warn\n"]
    assert (ex.stdout, ex.stderr, ex.execution_count, ex.status, ex.error) == ("a\nb\npartial", "warn\n", 7, "ok", None)
    display, main = ex.results
    assert not display.is_main_result and display.png == png and display.text.startswith("<Figure")
    assert main.is_main_result and ex.main_result is main and ex.text == "42"
    assert (main.text, main.html, main.markdown, main.svg, main.jpeg, main.pdf, main.latex, main.json,
            main.javascript) == ("42", "<b>42</b>", "**42**", "<svg/>", "/9j/", "JVBE", "$42$", {"v": 42}, "x()")
    assert main.png is None and main.extra == {"application/vnd.custom": "c"} and main["html"] == "<b>42</b>"
    assert main.formats() == ["text", "html", "markdown", "svg", "jpeg", "pdf", "latex", "json", "javascript",
                              "application/vnd.custom"]


@pytest.mark.parametrize("kw,want", [
    ({}, {"code": "1"}),
    ({"timeout": 0}, {"code": "1", "timeoutMs": 0}),
    ({"timeout": 0.0004}, {"code": "1", "timeoutMs": 1}),
    ({"language": "python", "context": "ctx-9"}, {"code": "1", "language": "python", "context": "ctx-9"}),
    ({"context": emberbox.Context("ctx/x", "python")}, {"code": "1", "context": "ctx/x"}),
])
def test_run_code_request_body(kw, want):
    fake = FakeInterpreter([_execution()])
    _isbx(fake).run_code("1", **kw)
    assert fake.bodies() == [want]


def test_run_code_streams_to_callbacks_and_fetches_refs_once():
    png_bytes = _png((0, 0, 255))
    ref = {"path": "/workspace/.runtime/interpreter/ctx-1/out/r1.png", "bytes": len(png_bytes)}
    big_json = {"path": "/workspace/.runtime/interpreter/ctx-1/out/r2.json"}
    streamed = {"main": True, "data": {"text/plain": "<Figure>"}, "refs": {"image/png": ref, "application/json": big_json}}
    tb = ANSI_TB

    def run(body):
        assert body == {"code": "draw()", "context": "ctx-1", "timeoutMs": 30000, "stream": True}
        return ([{"k": "stdout", "text": "one\n"}, {"k": "stderr", "text": "two\n"}, {"k": "stdout", "text": "3"},
                 {"k": "result", **streamed}, {"k": "some-new-kind", "x": 1},
                 {"k": "error", "name": "ValueError", "value": "boom", "traceback": tb}],
                _execution(status="error", stdout="one\n3", stderr="two\n", results=[streamed],
                           error={"name": "ValueError", "value": "boom", "traceback": tb}, executionCount=3))

    fake = FakeInterpreter([run], files={"r1.png": png_bytes, "r2.json": b'{"rows": [1, 2]}'})
    seen: list = []
    ex = _isbx(fake).run_code("draw()", context="ctx-1", timeout=30,
                              on_stdout=lambda t: seen.append(("out", t)), on_stderr=lambda t: seen.append(("err", t)),
                              on_result=lambda r: seen.append(("result", r)), on_error=lambda e: seen.append(("error", e)))
    assert [k for k, _ in seen] == ["out", "err", "out", "result", "error"]
    assert [t for k, t in seen if k in ("out", "err")] == ["one\n", "two\n", "3"]
    streamed_result = seen[3][1]
    assert isinstance(streamed_result, emberbox.Result) and streamed_result.is_main_result
    assert base64.b64decode(streamed_result.png) == png_bytes and streamed_result.json == {"rows": [1, 2]}
    assert streamed_result.refs["image/png"] == ref
    err = seen[4][1]
    assert isinstance(err, emberbox.ExecutionError) and (err.name, err.value) == ("ValueError", "boom")
    assert err.plain_traceback.endswith("ValueError: boom") and "\x1b" not in err.plain_traceback
    assert ex.results[0].png == streamed_result.png and ex.error == err and ex.execution_count == 3
    fetches = [p for m, p, _, _ in fake.requests if "/results/" in p]
    assert fetches == [IP + "/contexts/ctx-1/results/r1.png", IP + "/contexts/ctx-1/results/r2.json"]


def test_run_code_ref_that_cannot_be_fetched_stays_a_ref():
    ref = "/workspace/.runtime/interpreter/python/out/gone.png"
    fake = FakeInterpreter([_execution(results=[{"main": True, "data": {"text/plain": "x"}, "refs": {"image/png": ref}}])])
    s = _isbx(fake)
    [r] = s.run_code("x").results
    assert r.png is None and r.text == "x" and r.refs == {"image/png": ref}
    fake.files["gone.png"] = b"late"
    assert s.interpreter.result(r.refs["image/png"]) == b"late"
    with pytest.raises(ValueError):
        s.interpreter.result("/etc/passwd")
    with pytest.raises(ValueError):
        s.interpreter.result({"path": "/workspace/.runtime/interpreter/../out/x"})


def test_run_code_failure_line_bad_line_and_cut_stream():
    def failure(body):
        return [{"k": "stdout", "text": "x"}, {"k": "failure", "code": "sandbox_stopped", "status": 409,
                                               "message": "gone", "requestId": "req_9"}], None

    s = _isbx(FakeInterpreter([failure]))
    with pytest.raises(SandboxNotRunningError) as ei:
        s.run_code("1", on_stdout=lambda t: None)
    assert ei.value.request_id == "req_9" and ei.value.message == "gone"

    s = _isbx(FakeInterpreter([lambda body: ([{"k": "stdout", "text": "x"}], None)]))
    with pytest.raises(APIConnectionError, match="ended without the execution"):
        s.run_code("1", on_stdout=lambda t: None)

    def bad(req):
        return httpx.Response(200, content=b'{"k":"stdout","text":"x"}\n{"k": "std')

    with pytest.raises(APIConnectionError, match="bad line"):
        _isbx(bad).run_code("1", on_stderr=lambda t: None)


def test_run_code_stream_cut_by_the_transport():
    def cut():
        yield b'{"k":"stdout","text":"x"}\n'
        raise httpx.ReadError("connection reset")

    got = []
    with pytest.raises(APIConnectionError, match="stream broke: ReadError"):
        _isbx(lambda req: httpx.Response(200, content=cut())).run_code("1", on_stdout=got.append)
    assert got == ["x"]


def test_run_code_error_status_is_raised_typed():
    def handler(req):
        return httpx.Response(409, content=err_body(409, "sandbox_stopped"))

    with pytest.raises(SandboxNotRunningError):
        _isbx(handler).run_code("1")


def test_run_code_execution_error_and_jupyter_list_traceback():
    fake = FakeInterpreter([_execution(status="error", error={"name": "NameError", "value": "name 'y' is not defined",
                                                               "traceback": ["frame 1", "NameError: name 'y'"]})])
    ex = _isbx(fake).run_code("y")
    assert ex.error == emberbox.ExecutionError("NameError", "name 'y' is not defined", "frame 1\nNameError: name 'y'")
    assert ex.text is None and ex.results == [] and not ex.timed_out


def test_run_code_env_sets_and_restores_around_the_run():
    import os

    fake = FakeInterpreter([_execution(), _execution(stdout="v\n"), _execution()])
    ex = _isbx(fake).run_code("print(os.environ['A'])", env={"A": "v", "B": 1}, context="ctx-1")
    assert ex.stdout == "v\n"
    setup, main, restore = fake.bodies()
    assert main == {"code": "print(os.environ['A'])", "context": "ctx-1"}
    assert setup["context"] == restore["context"] == "ctx-1"
    before = dict(os.environ)
    os.environ["B"] = "old"
    ns: dict = {}
    try:
        exec(setup["code"], ns)  # noqa: S102 - the cells are plain Python: check what they do here
        assert (os.environ["A"], os.environ["B"]) == ("v", "1")
        exec(restore["code"], ns)  # noqa: S102
        assert "A" not in os.environ and os.environ["B"] == "old"
        assert [k for k in ns if k != "__builtins__"] == []  # nothing left in the namespace
    finally:
        os.environ.clear()
        os.environ.update(before)


def test_run_code_env_restored_when_the_run_fails_and_refused_for_other_languages():
    fake = FakeInterpreter([_execution(), lambda body: ([{"k": "failure", "code": "interpreter_failed",
                                                          "status": 502, "message": "x"}], None), _execution()])
    with pytest.raises(ServiceUnavailableError):
        _isbx(fake).run_code("1", env={"A": "1"}, on_stdout=print)
    assert len(fake.bodies()) == 3 and "restore" in fake.bodies()[2]["code"]
    with pytest.raises(ValueError, match="Python context"):
        _isbx(FakeInterpreter()).run_code("echo $A", language="bash", env={"A": "1"})
    with pytest.raises(ValueError, match="Python context"):
        _isbx(FakeInterpreter()).run_code("x", context=emberbox.Context("c", "r"), env={"A": "1"})


def test_contexts_routes_and_bodies():
    fake = FakeInterpreter()
    ctxs = _isbx(fake).interpreter.contexts
    c = ctxs.create(language="python", cwd="proj", env={"K": 1}, idempotency_key="ik-1")
    assert (c.id, c.language, c.cwd) == ("ctx-1", "python", "/workspace/proj")
    method, path, body, req = fake.requests[-1]
    assert (method, path, body) == ("POST", IP + "/contexts", {"language": "python", "cwd": "/workspace/proj",
                                                               "env": {"K": "1"}})
    assert req.headers["Idempotency-Key"] == "ik-1"
    assert ctxs.create(id="mine").id == "mine" and fake.requests[-1][2] == {"id": "mine"}
    assert [x.id for x in ctxs.list()] == ["python", "ctx-1", "mine"]
    assert ctxs.restart(c).id == "ctx-1" and fake.requests[-1][1:3] == (IP + "/contexts/ctx-1:restart", {})
    assert ctxs.interrupt("ctx-1") is True and fake.requests[-1][1:3] == (IP + "/contexts/ctx-1:interrupt", {})
    assert ctxs.remove(c) is True and fake.requests[-1][:2] == ("DELETE", IP + "/contexts/ctx-1")
    with pytest.raises(NotFoundError):
        ctxs.remove("ctx-1")
    with pytest.raises(NotFoundError):
        ctxs.restart("a/b")
    assert fake.requests[-1][3].url.raw_path.decode().endswith("/contexts/a%2Fb:restart")


def test_async_run_code_awaits_coroutine_callbacks_and_contexts():
    png = base64.b64encode(_png()).decode()

    def run(body):
        assert body["stream"] is True
        return ([{"k": "stdout", "text": "hi\n"}, {"k": "result", "main": True, "data": {"image/png": png}, "refs": {}}],
                _execution(stdout="hi\n", results=[{"main": True, "data": {"image/png": png}}]))

    fake = FakeInterpreter([run, _execution(results=[{"main": True, "data": {"text/plain": "2"}}])])
    got: list = []

    async def on_result(r):
        await asyncio.sleep(0)
        got.append(r)

    async def go():
        c = AsyncClient(URL, "k", transport=httpx.MockTransport(fake), backoff=0)
        try:
            s = AsyncSandbox(c, dict(SBX))
            ctx = await s.interpreter.contexts.create()
            ex = await s.run_code("plot()", context=ctx, on_stdout=got.append, on_result=on_result)
            plain = await s.run_code("1 + 1", context=ctx)
            removed = await s.interpreter.contexts.remove(ctx)
            return ex, plain, removed
        finally:
            await c.aclose()

    ex, plain, removed = asyncio.run(go())
    assert got[0] == "hi\n" and got[1].png == png and ex.results[0].png == png
    assert plain.text == "2" and removed is True
    assert [b["context"] for b in fake.bodies()] == ["ctx-1", "ctx-1"]


# --- SandboxExecutor over run_code ------------------------------------------------
def _executor(fake, **kw):
    pytest.importorskip("smolagents")
    from emberbox.smolagents import SandboxExecutor

    fake.runs.insert(0, _execution())  # the warm-up cell of the executor's context
    return SandboxExecutor(sandbox=_isbx(fake), timeout_seconds=kw.pop("timeout_seconds", 3), **kw)


def test_executor_makes_its_own_context_and_warms_it_up():
    fake = FakeInterpreter()
    ex = _executor(fake)
    assert ex.context.id == "ctx-1"
    assert fake.requests[0][:3] == ("POST", IP + "/contexts", {"language": "python", "cwd": "/workspace"})
    warm = fake.bodies()[0]
    assert warm["context"] == "ctx-1" and warm["timeoutMs"] == 300000 and "site.addsitedir" in warm["code"]
    ex.cleanup()
    assert fake.requests[-1][:2] == ("DELETE", IP + "/contexts/ctx-1") and ex.sandbox is None and ex.context is None
    ex.cleanup()  # twice is fine


def test_executor_png_main_result_is_a_pil_image_with_interleaved_logs():
    PIL = pytest.importorskip("PIL.Image")
    png = base64.b64encode(_png((1, 2, 3), (5, 7))).decode()

    def run(body):
        assert body["stream"] is True and body["timeoutMs"] == 3000 and body["context"] == "ctx-1"
        return ([{"k": "stdout", "text": "drawing\n"}, {"k": "stderr", "text": "careful\n"}, {"k": "stdout", "text": "done\n"}],
                _execution(stdout="drawing\ndone\n", stderr="careful\n",
                           results=[{"main": True, "data": {"image/png": png, "text/plain": "<Figure size 640x480>"}}]))

    fake = FakeInterpreter([run])
    out = _executor(fake)("fig")
    assert isinstance(out.output, PIL.Image) and out.output.size == (5, 7)
    assert out.output.convert("RGB").getpixel((0, 0)) == (1, 2, 3)
    assert out.logs == "drawing\ncareful\ndone\n" and out.is_final_answer is False


@pytest.mark.parametrize("data,want", [
    ({"text/plain": "   a\n0  1", "text/html": "<table/>"}, "<table/>"),   # a DataFrame: HTML first, as E2B
    ({"text/plain": "42"}, "42"),
    ({"application/json": {"a": 1}, "text/plain": "{'a': 1}"}, {"a": 1}),
    ({"image/svg+xml": "<svg/>", "text/plain": "<svg>"}, "<svg/>"),
])
def test_executor_other_main_results(data, want):
    fake = FakeInterpreter([_execution(results=[{"main": False, "data": {"text/plain": "shown"}},
                                                {"main": True, "data": data}])])
    assert _executor(fake)("x").output == want


def test_executor_display_only_step_has_no_output():
    png = base64.b64encode(_png()).decode()
    fake = FakeInterpreter([_execution(stdout="p\n", results=[{"main": False, "data": {"image/png": png}}])])
    out = _executor(fake)("plt.show()")
    assert out.output is None and out.logs == "p\n"


def test_executor_final_answer_and_errors():
    from smolagents.utils import AgentError

    fake = FakeInterpreter([
        _execution(status="error", stdout="almost\n",
                   error={"name": "FinalAnswerException", "value": 'safe:{"a": [1, 2]}', "traceback": "tb"}),
        _execution(status="error", stdout="about to fail\n", error={"name": "ValueError", "value": "boom",
                                                                    "traceback": ANSI_TB}),
        _execution(status="error", error={"name": "KeyError", "value": "'k'", "traceback": ""}),
    ])
    ex = _executor(fake)
    out = ex("final_answer({'a': [1, 2]})")
    assert out.is_final_answer and out.output == {"a": [1, 2]} and out.logs == "almost\n"
    with pytest.raises(AgentError) as ei:
        ex("raise ValueError('boom')")
    msg = str(ei.value)
    assert msg.startswith("about to fail\nExecuting code yielded an error:\n")
    assert "\x1b" not in msg and "Traceback" in msg and msg.endswith("ValueError: boom")
    with pytest.raises(AgentError, match=r"yielded an error:\nKeyError: 'k'$"):
        ex("{}['k']")


def test_executor_timeout_keeps_context_and_lost_restarts_it():
    from smolagents.utils import AgentError

    fake = FakeInterpreter([
        _execution(status="timeout", stdout="tick\n", error={"name": "KeyboardInterrupt", "value": "", "traceback": ""}),
        _execution(status="lost", error=None),
        _execution(),  # the warm-up after the restart
        _execution(results=[{"main": True, "data": {"text/plain": "2"}}]),
    ])
    ex = _executor(fake)
    with pytest.raises(AgentError, match="tick\nExecuting code yielded an error:\nTimeoutError: The code step did "
                                         "not finish within 3 s and was interrupted"):
        ex("while True: pass")
    assert not any(p.endswith(":restart") for _, p, _, _ in fake.requests)
    with pytest.raises(AgentError, match="exited while running this step. It was restarted"):
        ex("import os; os._exit(7)")
    assert any(p == IP + "/contexts/ctx-1:restart" for _, p, _, _ in fake.requests)
    assert ex("1 + 1").output == "2"


def test_executor_makes_a_new_context_when_the_lost_one_cannot_restart():
    from smolagents.utils import AgentError

    fake = FakeInterpreter([_execution(status="lost"), _execution(), _execution(results=[
        {"main": True, "data": {"text/plain": "'fresh'"}}])])
    ex = _executor(fake)
    fake.contexts.pop("ctx-1")  # the server forgot it when its kernel died
    with pytest.raises(AgentError, match="exited while running this step. It was restarted"):
        ex("import os; os._exit(1)")
    assert ex.context.id == "ctx-2" and ex("'fresh'").output == "'fresh'"
    assert fake.bodies()[-1]["context"] == "ctx-2"


def test_executor_refuses_to_start_without_an_interpreter():
    from emberbox.smolagents import KernelError, SandboxExecutor

    def handler(req):
        return httpx.Response(501, content=err_body(501, "not_implemented"))

    with pytest.raises(KernelError, match="could not start a Python context"):
        SandboxExecutor(sandbox=_isbx(handler))


def test_code_agent_gets_a_pil_image_from_a_chart_step():
    pytest.importorskip("smolagents")
    PIL = pytest.importorskip("PIL.Image")
    from _scripted import ScriptedModel
    from smolagents import CodeAgent
    from smolagents.monitoring import LogLevel

    png = base64.b64encode(_png((9, 9, 9), (8, 6))).decode()
    fake = FakeInterpreter([
        _execution(),  # tool definitions (final_answer)
        _execution(results=[{"main": True, "data": {"image/png": png, "text/plain": "<Figure>"}}]),
        _execution(status="error", error={"name": "FinalAnswerException", "value": 'safe:"drawn"', "traceback": ""}),
    ])
    ex = _executor(fake)
    model = ScriptedModel(["Thought: draw.\n<code>\nfig\n</code>", "Thought: done.\n<code>\nfinal_answer('drawn')\n</code>"])
    agent = CodeAgent(tools=[], model=model, executor=ex, verbosity_level=LogLevel.OFF, max_steps=4)
    try:
        assert agent.run("Draw a chart.") == "drawn"
    finally:
        agent.cleanup()
    steps = [s for s in agent.memory.steps if hasattr(s, "code_action")]
    assert isinstance(steps[0].action_output, PIL.Image) and steps[0].action_output.size == (8, 6)
    assert "Last output from code snippet:\n<PIL." in steps[0].observations


# --- checkpoints ------------------------------------------------------------------
CK = "/v1/sandboxes/sbx_1/checkpoints"


class FakeCheckpoints:
    """The checkpoint routes of every sandbox, in front of `inner` (the handler of
    everything else of sbx_1, such as a FakeInterpreter). `log` holds (method, path, body,
    request) of each checkpoint call, in order. A capture labelled one of `quota_labels`
    answers 409 quota_exceeded, one of `failed_labels` a checkpoint in state failed.
    Sandboxes made by a branch (sbx_b1, ...) answer here too: their interpreter knows the
    contexts in `branch_contexts` (those the server carried over) and those made in them;
    a run elsewhere is 404 context_not_found."""

    def __init__(self, inner=None, *, quota_labels=(), failed_labels=(), branch_contexts=()):
        self.inner = inner
        self.checkpoints: dict[str, dict] = {}
        self.log: list[tuple[str, str, dict | None, httpx.Request]] = []
        self.made = 0
        self.quota_labels, self.failed_labels = set(quota_labels), set(failed_labels)
        self.branch_contexts = set(branch_contexts)
        self.boxes: dict[str, set[str]] = {}  # branched sandbox -> its contexts
        self.box_calls: list[tuple[str, str, str, dict | None]] = []  # (sandbox, method, rest, body)
        self.order: list[str] = []  # "checkpoint", "restore", ... and the other calls' paths, in order
        self.capturing: dict[str, int] = {}  # checkpoint id -> GETs that still answer capturing

    def labels(self, sandbox="sbx_1"):
        return [b.get("label") for m, p, b, _ in self.log
                if m == "POST" and p == f"/v1/sandboxes/{sandbox}/checkpoints"]

    def calls(self, method, suffix=""):
        return [(p, b) for m, p, b, _ in self.log if m == method and p.endswith(suffix)]

    def __call__(self, req: httpx.Request) -> httpx.Response:
        import re

        path, method = req.url.path, req.method
        body = json.loads(req.content) if req.content and req.headers.get("content-type") == "application/json" else None
        m = re.fullmatch(r"/v1/sandboxes/([^/:]+)/checkpoints(?:/([^/:]+)(?::(\w+))?)?", path)
        if m:
            self.log.append((method, path, body, req))
            self.order.append(f"{method} checkpoints{':' + m.group(3) if m.group(3) else ''}")
            return self._checkpoint(m.group(1), m.group(2), m.group(3), method, body)
        m = re.fullmatch(r"/v1/sandboxes/(sbx_b\d+)(.*)", path)
        if m:
            self.box_calls.append((m.group(1), method, m.group(2), body))
            return self._branched(m.group(1), m.group(2), method, body)
        self.order.append(f"{method} {path}")
        if self.inner is None:
            raise AssertionError(f"unexpected {method} {req.url}")
        return self.inner(req)

    def _checkpoint(self, sid, cid, action, method, body):
        if cid is None and method == "POST":
            label = body.get("label")
            if label in self.quota_labels:
                return httpx.Response(409, content=err_body(409, "quota_exceeded"))
            self.made += 1
            new = {"id": f"ckpt_{self.made:020x}", "kind": "checkpoint", "sandboxId": sid, "label": label,
                   "state": "ready", "sizeBytes": 1000 * self.made, "createdAt": "2026-12-07T01:00:00Z",
                   "readyAt": "2026-12-07T01:00:02Z", "error": None,
                   "shape": {"vcpu": 1, "memoryMiB": 512, "diskMiB": 1024}}
            if label in self.failed_labels:
                new.update(state="failed", readyAt=None, error="disk full")
            self.checkpoints[new["id"]] = new
            if body.get("wait") is False and new["state"] == "ready":
                # Captured in the background: capturing until its second GET.
                self.capturing[new["id"]] = 1
                return httpx.Response(202, json={**new, "state": "capturing", "readyAt": None})
            return httpx.Response(200, json=new)
        if cid is None:
            return httpx.Response(200, json={"checkpoints": [c for c in self.checkpoints.values()
                                                             if c["sandboxId"] == sid]})
        if cid not in self.checkpoints or self.checkpoints[cid]["sandboxId"] != sid:
            return httpx.Response(404, content=err_body(404, "checkpoint_not_found"))
        if method == "GET":
            if self.capturing.get(cid, 0) > 0:
                self.capturing[cid] -= 1
                return httpx.Response(200, json={**self.checkpoints[cid], "state": "capturing", "readyAt": None})
            return httpx.Response(200, json=self.checkpoints[cid])
        if self.capturing.get(cid, 0) > 0 and action in ("restore", "branch"):
            return httpx.Response(409, content=err_body(409, "checkpoint_not_ready"))
        if method == "DELETE":
            del self.checkpoints[cid]
            return httpx.Response(200, json={"id": cid, "state": "deleted"})
        if action == "restore":
            return httpx.Response(200, json={"id": sid, "state": "running", "restoredFrom": cid})
        if action == "branch":
            made = []
            for _ in range(body["count"]):
                bid = f"sbx_b{len(self.boxes) + 1}"
                self.boxes[bid] = set(self.branch_contexts)
                made.append({"id": bid, "state": "running", "name": body.get("name"),
                             "labels": body.get("labels") or {}})
            return httpx.Response(200, json={"sandboxes": made})
        raise AssertionError(f"unexpected {method} {cid}:{action}")

    def _branched(self, sid, rest, method, body):
        contexts = self.boxes[sid]
        if rest == "/interpreter:run":
            if body.get("context") not in contexts:
                return httpx.Response(404, content=err_body(404, "context_not_found"))
            execution = _execution()
            if body.get("stream"):
                return httpx.Response(200, content=ndjson({"k": "execution", "execution": execution}))
            return httpx.Response(200, json=execution)
        if rest == "/interpreter/contexts" and method == "POST":
            cid = f"bctx-{len(contexts) + 1}"
            contexts.add(cid)
            return httpx.Response(200, json={"id": cid, "language": "python", "cwd": "/workspace"})
        if rest.startswith("/interpreter/contexts/") and method == "DELETE":
            contexts.discard(rest.rsplit("/", 1)[1])
            return httpx.Response(200, json={"deleted": True})
        if rest == ":stop":
            return httpx.Response(200, json={"id": sid, "state": "stopped"})
        if rest == "" and method == "DELETE":
            return httpx.Response(200, json={"id": sid, "state": "deleted"})
        raise AssertionError(f"unexpected {method} {sid}{rest}")


def test_checkpoint_create_list_get_delete():
    fake = FakeCheckpoints()
    s = Sandbox(client(fake), dict(SBX))
    c = s.checkpoint("step-2")
    assert isinstance(c, emberbox.Checkpoint) and c.ok
    assert (c.id, c.sandbox_id, c.label, c.state, c.size_bytes, c.error) == (
        "ckpt_00000000000000000001", "sbx_1", "step-2", "ready", 1000, None)
    assert (c.created_at, c.ready_at, c.info["shape"]["vcpu"]) == ("2026-12-07T01:00:00Z", "2026-12-07T01:00:02Z", 1)
    bare = s.checkpoint()
    (_, path, body, req), (_, _, bare_body, _) = fake.log
    assert (path, body, bare_body) == (CK, {"label": "step-2"}, {})
    assert req.headers["Idempotency-Key"] and req.extensions["timeout"]["read"] == 900
    assert bare.label is None
    assert [x.id for x in s.checkpoints()] == [c.id, bare.id]
    assert s.get_checkpoint(c.id) == c
    assert s.delete_checkpoint(bare) == {"id": bare.id, "state": "deleted"}
    assert fake.log[-1][:2] == ("DELETE", f"{CK}/{bare.id}")
    with pytest.raises(NotFoundError) as ei:
        s.get_checkpoint(bare.id)
    assert ei.value.code == "checkpoint_not_found"
    with pytest.raises(ValueError):
        s.get_checkpoint("")


def test_checkpoint_failed_capture_and_quota():
    fake = FakeCheckpoints(quota_labels={"big"}, failed_labels={"bad"})
    s = Sandbox(client(fake), dict(SBX))
    bad = s.checkpoint("bad")
    assert not bad.ok and bad.state == "failed" and bad.error == "disk full" and bad.ready_at is None
    with pytest.raises(ConflictError) as ei:
        s.checkpoint("big")
    assert ei.value.code == "quota_exceeded" and ei.value.status == 409


def test_restore_and_branch():
    fake = FakeCheckpoints()
    s = Sandbox(client(fake), {"id": "sbx_1", "state": "paused"})
    c = s.checkpoint("a")
    assert s.restore(c) is s and s.state == "running" and s.info["restoredFrom"] == c.id
    s.restore(c.id, keep=True)
    assert fake.calls("POST", ":restore") == [(f"{CK}/{c.id}:restore", {"keep": False}),
                                              (f"{CK}/{c.id}:restore", {"keep": True})]
    boxes = s.branch(c, count=2, name="try", labels={"k": 1})
    assert [type(b) for b in boxes] == [Sandbox, Sandbox] and [b.id for b in boxes] == ["sbx_b1", "sbx_b2"]
    assert all(b.client is s.client and b.state == "running" for b in boxes)
    assert fake.calls("POST", ":branch") == [(f"{CK}/{c.id}:branch",
                                              {"count": 2, "name": "try", "labels": {"k": "1"}})]
    assert s.branch(c)[0].id == "sbx_b3" and fake.calls("POST", ":branch")[-1][1] == {"count": 1}
    n = len(fake.log)
    for bad in (0, 11, True, 1.5):
        with pytest.raises(ValueError, match="count"):
            s.branch(c, count=bad)
    assert len(fake.log) == n  # refused before any request
    with pytest.raises(NotFoundError):
        s.restore("ckpt_nope")


def test_async_checkpoint_methods():
    fake = FakeCheckpoints()

    async def go():
        c = AsyncClient(URL, "k", transport=httpx.MockTransport(fake), backoff=0)
        try:
            s = AsyncSandbox(c, dict(SBX))
            ck = await s.checkpoint("x")
            listed = await s.checkpoints()
            got = await s.get_checkpoint(ck.id)
            restored = await s.restore(ck, keep=True)
            boxes = await s.branch(ck.id, count=1, labels={"a": "b"})
            deleted = await s.delete_checkpoint(ck)
            return s, ck, listed, got, restored, boxes, deleted
        finally:
            await c.aclose()

    s, ck, listed, got, restored, boxes, deleted = asyncio.run(go())
    assert ck.ok and listed == [ck] and got == ck and restored is s
    assert [type(b) for b in boxes] == [AsyncSandbox] and boxes[0].id == "sbx_b1"
    assert deleted == {"id": ck.id, "state": "deleted"}
    assert [(m, p.rsplit("/", 1)[-1]) for m, p, _, _ in fake.log] == [
        ("POST", "checkpoints"), ("GET", "checkpoints"), ("GET", ck.id), ("POST", f"{ck.id}:restore"),
        ("POST", f"{ck.id}:branch"), ("DELETE", ck.id)]


def test_checkpoint_is_public():
    assert emberbox.Checkpoint is emberbox._types.Checkpoint
    for meth in ("checkpoint", "checkpoints", "get_checkpoint", "restore", "branch", "delete_checkpoint"):
        assert hasattr(Sandbox, meth) and hasattr(AsyncSandbox, meth)


# --- the executor's checkpoints -----------------------------------------------------
def _ck_executor(fake, checkpoints_fake, **kw):
    pytest.importorskip("smolagents")
    from smolagents.monitoring import AgentLogger, LogLevel

    from emberbox.smolagents import SandboxExecutor

    checkpoints_fake.inner = fake
    fake.runs.insert(0, _execution())  # the warm-up cell of the executor's context
    kw.setdefault("checkpoints", True)
    kw.setdefault("logger", AgentLogger(level=LogLevel.OFF))
    return SandboxExecutor(sandbox=Sandbox(client(checkpoints_fake), dict(SBX)), timeout_seconds=3, **kw)


def _fails(name="ValueError"):
    return _execution(status="error", error={"name": name, "value": "x", "traceback": ""})


def test_executor_checkpoints_after_each_step_and_rolls_back():
    from smolagents.utils import AgentError

    fake = FakeInterpreter([_execution(), _execution(), _fails(), _execution(), _execution(), _execution(),
                            _execution()])
    ck = FakeCheckpoints()
    ex = _ck_executor(fake, ck)
    ex.run_code_raise_errors("tools = 1")  # what send_tools and send_variables do: not a step
    assert ck.log == [] and ex.step == 0
    ex("a = 1")
    with pytest.raises(AgentError):
        ex("raise ValueError('x')")  # a failed step is a step, checkpointed too
    ex("a = 3")
    assert ck.labels() == ["step-0", "step-1", "step-2", "step-3"] and ex.step == 3
    ids = ex.step_checkpoints
    assert sorted(ids) == [0, 1, 2, 3] and len(set(ids.values())) == 4
    # the checkpoint of a step is taken after its run
    assert ck.order[-2:] == ["POST /v1/sandboxes/sbx_1/interpreter:run", "POST checkpoints"]

    # each step's checkpoint is taken in the background: the step does not wait for it
    assert all(b == {"label": f"step-{n}", "wait": False} for n, (_, b) in enumerate(ck.calls("POST", "/checkpoints")))

    ex.rollback(1)
    # the rollback waited for the step's capture (GET until ready) before the restore
    assert ck.calls("GET", ids[1]) and ck.order.index("POST checkpoints:restore") > ck.order.index("GET checkpoints")
    assert ck.calls("POST", ":restore") == [(f"{CK}/{ids[1]}:restore", {"keep": False})]
    assert [p for p, _ in ck.calls("DELETE")] == [f"{CK}/{ids[2]}", f"{CK}/{ids[3]}"]
    assert ex.step == 1 and ex.step_checkpoints == {0: ids[0], 1: ids[1]}
    probe = fake.bodies()[-1]  # the restored session is checked by a run in it
    assert probe["context"] == "ctx-1" and "site.addsitedir" in probe["code"]
    assert ck.order[-4:] == ["POST checkpoints:restore", "DELETE checkpoints", "DELETE checkpoints",
                             "POST /v1/sandboxes/sbx_1/interpreter:run"]

    ex("a = 2")  # numbered on from the step rolled back to
    assert ck.labels()[-1] == "step-2" and ex.step == 2 and sorted(ex.step_checkpoints) == [0, 1, 2]
    ex.rollback(1)  # a step can be rolled back to again
    ex.cleanup()  # the checkpoints of a sandbox it was given go, and its context
    assert ck.checkpoints == {}
    assert fake.requests[-1][:2] == ("DELETE", IP + "/contexts/ctx-1")


def test_executor_rollback_puts_back_the_context_and_packages_of_the_step():
    """A lost kernel after step 1 made the executor move to a new context; rolling back to
    step 1 must talk to the context of step 1 again (its kernel is in the restored memory)."""
    from smolagents.utils import AgentError

    fake = FakeInterpreter([_execution(), _execution(status="lost"), _execution(), _execution()])
    ck = FakeCheckpoints()
    ex = _ck_executor(fake, ck)
    ex("a = 1")
    fake.contexts.pop("ctx-1")  # the server forgot it when its kernel died
    with pytest.raises(AgentError, match="exited while running this step"):
        ex("import os; os._exit(1)")
    assert ex.context.id == "ctx-2"
    ex.installed_packages.append("humanize")  # installed after step 1
    fake.contexts["ctx-1"] = {"id": "ctx-1", "language": "python", "cwd": "/workspace"}  # back with the memory
    ex.rollback(1)
    assert ex.context.id == "ctx-1" and fake.bodies()[-1]["context"] == "ctx-1"
    assert ex.installed_packages == [] and ex.owns_context


def test_executor_rollback_starts_a_new_session_when_the_restored_one_does_not_answer():
    from emberbox.smolagents import KernelError

    fake = FakeInterpreter([_execution(), _execution(status="lost"), _execution(),
                            _execution(results=[{"main": True, "data": {"text/plain": "2"}}])])
    ck = FakeCheckpoints()
    ex = _ck_executor(fake, ck)
    ex("a = 1")
    fake.contexts.pop("ctx-1")
    with pytest.raises(KernelError, match="rolled back to step 1, but its Python session could not be reached"):
        ex.rollback(1)
    assert ex.context.id == "ctx-2" and ex.step == 1  # restored, and usable
    assert ex("1 + 1").output == "2" and fake.bodies()[-1]["context"] == "ctx-2"


def test_executor_capture_failures_are_logged_not_raised():
    from emberbox.smolagents import CheckpointError

    fake = FakeInterpreter([_execution(), _execution(), _execution()])
    ck = FakeCheckpoints(quota_labels={"step-1"}, failed_labels={"step-2"})
    ex = _ck_executor(fake, ck)
    ex("a = 1")
    ex("a = 2")
    failed = [c for c in ck.log if c[0] == "POST" and c[2] and c[2].get("label") == "step-2"]
    assert failed and ex.step == 2 and sorted(ex.step_checkpoints) == [0]
    assert ck.calls("DELETE")  # the failed checkpoint is not kept
    ex("a = 3")  # no second try at the earlier steps
    assert ck.labels() == ["step-0", "step-1", "step-2", "step-3"]
    with pytest.raises(CheckpointError, match="step 1 has no checkpoint: its capture failed.*quota_exceeded"):
        ex.rollback(1)
    with pytest.raises(CheckpointError, match="disk full"):
        ex.branch(2)
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 7 \(the steps with one: 0, 1, 2, 3\)"):
        ex.rollback(7)
    assert not ck.calls("POST", ":restore")


def test_executor_without_checkpoints_refuses_rollback_and_branch():
    from emberbox.smolagents import CheckpointError

    fake = FakeInterpreter([_execution()])
    ck = FakeCheckpoints()
    ex = _ck_executor(fake, ck, checkpoints=False)
    ex("a = 1")
    assert ex.step == 1 and ex.step_checkpoints == {} and ck.log == []
    with pytest.raises(CheckpointError, match=r"SandboxExecutor\(checkpoints=True\)"):
        ex.rollback(0)
    with pytest.raises(CheckpointError, match=r"SandboxExecutor\(checkpoints=True\)"):
        ex.branch(1, 2)


def test_executor_rollback_to_a_checkpoint_the_server_dropped():
    from emberbox.smolagents import CheckpointError

    fake = FakeInterpreter([_execution()])
    ck = FakeCheckpoints()
    ex = _ck_executor(fake, ck)
    ex("a = 1")
    ck.checkpoints.pop(ex.step_checkpoints[0])  # beyond the server's per-sandbox cap
    with pytest.raises(CheckpointError, match="step 0 .* is gone from the server"):
        ex.rollback(0)
    assert sorted(ex.step_checkpoints) == [1]


@pytest.mark.parametrize("carried", [True, False])
def test_executor_branch_makes_executors_on_new_sandboxes(carried):
    fake = FakeInterpreter([_execution(), _execution()])
    ck = FakeCheckpoints(branch_contexts={"ctx-1"} if carried else ())
    ex = _ck_executor(fake, ck, delete_on_cleanup=True)
    ex("a = 1")
    ex("a = 2")
    b1, b2 = ex.branch(1, 2, labels={"try": "x"})
    assert ck.calls("POST", ":branch") == [(f"{CK}/{ex.step_checkpoints[1]}:branch",
                                            {"count": 2, "labels": {"created_by": "emberbox-smolagents",
                                                                    "try": "x"}})]
    assert [b.sandbox.id for b in (b1, b2)] == ["sbx_b1", "sbx_b2"]
    for b in (b1, b2):
        assert b.owns_sandbox and b.delete_on_cleanup and b.checkpoints and b.step == 1
        assert b.step_checkpoints == {} and b.timeout_seconds == ex.timeout_seconds
        assert b.kept_session is carried
        assert b.context.id == ("ctx-1" if carried else "bctx-1")
    assert ex.step == 2 and ex.sandbox.id == "sbx_1"  # the source executor is unchanged
    b1("b = 1")  # a step in the branch: its own checkpoints, numbered on from the branch's step
    assert ck.labels("sbx_b1") == ["step-1", "step-2"] and sorted(b1.step_checkpoints) == [1, 2]
    b1.cleanup()
    assert ck.box_calls[-1][:3] == ("sbx_b1", "DELETE", "")
    assert ex.branch(0, 1)[0].step == 0


def test_executor_branch_deletes_the_new_sandboxes_when_it_fails():
    fake = FakeInterpreter([_execution()])
    ck = FakeCheckpoints()
    ex = _ck_executor(fake, ck)
    ex("a = 1")
    real = ck._branched

    def broken(sid, rest, method, body):
        if sid == "sbx_b2" and rest == "/interpreter/contexts":
            return httpx.Response(501, content=err_body(501, "not_implemented"))
        return real(sid, rest, method, body)

    ck._branched = broken
    from emberbox.smolagents import KernelError

    with pytest.raises(KernelError):
        ex.branch(1, 2)
    assert {(s, m, r) for s, m, r, _ in ck.box_calls if m == "DELETE" and r == ""} == {
        ("sbx_b1", "DELETE", ""), ("sbx_b2", "DELETE", "")}


# --- runtime_undo --------------------------------------------------------------------
def _tool_handler(req: httpx.Request) -> httpx.Response:
    p = req.url.path
    if p.endswith(":exec"):
        return httpx.Response(200, content=ndjson({"type": "start", "processId": "p"},
                                                  {"type": "stdout", "data": "ok\n", "offset": 0},
                                                  {"type": "exit", "exitCode": 0, "timedOut": False}))
    if p.endswith("/files/content") and req.method == "PUT":
        return httpx.Response(200, json={})
    if p.endswith("/files/content"):
        return httpx.Response(200, content=b"text")
    if p.endswith("/files/list"):
        return httpx.Response(200, json={"data": []})
    raise AssertionError(p)


def test_undo_tool_is_opt_in():
    ck = FakeCheckpoints(_tool_handler)
    tools = sandbox_tools(Sandbox(client(ck), dict(SBX)))
    assert [f.__name__ for f in tools] == ["runtime_exec", "runtime_read_file", "runtime_write_file",
                                           "runtime_list_files"]
    tools[0]("rm -rf x")
    tools[2]("a.txt", "hi")
    assert ck.log == []  # no checkpoints without undo=True


def test_undo_tool_checkpoints_before_each_change_and_restores_newest_first():
    ck = FakeCheckpoints(_tool_handler)
    ex, rd, wr, ls, undo = sandbox_tools(Sandbox(client(ck), dict(SBX)), undo=True)
    assert undo.__name__ == "runtime_undo"
    assert undo().startswith("Nothing to undo")
    assert ex("rm -rf build") == {"exit_code": 0, "stdout": "ok\n", "stderr": "", "timed_out": False}
    assert wr("a.txt", "hi") == "Wrote 2 bytes to /workspace/a.txt"
    assert rd("a.txt") == "text" and ls(".") == []  # reads change nothing: no checkpoint
    assert ck.labels() == ["undo-1", "undo-2"]
    assert ck.order[:4] == ["POST checkpoints", "POST /v1/sandboxes/sbx_1:exec",
                            "POST checkpoints", "PUT /v1/sandboxes/sbx_1/files/content"]
    first, second = list(ck.checkpoints)
    assert undo() == ("Undid runtime_write_file('/workspace/a.txt'): the sandbox is back as it was just before it "
                      "(files, installed packages and running processes).")
    assert ck.calls("POST", ":restore")[-1] == (f"{CK}/{second}:restore", {"keep": False})
    assert list(ck.checkpoints) == [first]  # used up, deleted
    assert undo().startswith("Undid runtime_exec('rm -rf build')")
    assert ck.checkpoints == {}
    assert undo().startswith("Nothing to undo")


def test_undo_tool_says_why_it_cannot_undo():
    ck = FakeCheckpoints(_tool_handler, quota_labels={"undo-2"})
    ex, _, wr, _, undo = sandbox_tools(Sandbox(client(ck), dict(SBX)), undo=True)
    ex("make")
    assert wr("b.txt", "x") == "Wrote 1 bytes to /workspace/b.txt"  # the change goes ahead without a checkpoint
    msg = undo()
    assert msg.startswith("Could not undo runtime_write_file('/workspace/b.txt'): no checkpoint could be taken "
                          "before it (quota_exceeded: m-quota_exceeded (h))")
    assert "Calling runtime_undo again" in msg and not ck.calls("POST", ":restore")
    ck.checkpoints.clear()  # the server dropped the older one
    assert undo().startswith("Could not undo runtime_exec('make'): checkpoint_not_found")
    long = "echo " + "y" * 300
    ex(long)
    assert "..." in undo() and len(ck.labels()) == 3


def test_undo_tool_wraps_with_smolagents_and_survives_remote_code_generation():
    smolagents = pytest.importorskip("smolagents")
    import inspect
    import textwrap

    undo = sandbox_tools(Sandbox(client(lambda r: httpx.Response(500)), dict(SBX)), undo=True)[-1]
    t = smolagents.tool(undo)
    assert t.name == "runtime_undo" and t.inputs == {} and t.output_type == "string"
    assert "before the last command" in t.description
    src = textwrap.dedent(inspect.getsource(undo))
    header = src[: src.index('"""')].rstrip()
    exec(compile(header + "\n    pass\n", "<tool>", "exec"), {"__builtins__": __builtins__})  # noqa: S102


def test_async_undo_tool():
    ck = FakeCheckpoints(_tool_handler)

    async def go():
        c = AsyncClient(URL, "k", transport=httpx.MockTransport(ck), backoff=0)
        try:
            tools = sandbox_tools(AsyncSandbox(c, dict(SBX)), undo=True)
            assert all(asyncio.iscoroutinefunction(f) for f in tools) and len(tools) == 5
            ex, _, _, _, undo = tools
            await ex("rm x")
            return await undo(), await undo()
        finally:
            await c.aclose()

    done, nothing = asyncio.run(go())
    assert done.startswith("Undid runtime_exec('rm x')") and nothing.startswith("Nothing to undo")
    assert ck.labels() == ["undo-1"] and ck.checkpoints == {}


def test_executor_patches_final_answer_once_across_runs():
    """smolagents 1.26 patches final_answer at each run(); patched twice, its source names a
    closure variable that does not exist in the sandbox. The executor patches it once."""
    pytest.importorskip("smolagents")
    from smolagents.default_tools import FinalAnswerTool

    fake = FakeInterpreter([_execution(), _execution()])
    ex = _executor(fake)
    final = FinalAnswerTool()
    ex.send_tools({"final_answer": final})
    patched = type(final)
    ex.send_tools({"final_answer": final})  # the agent's second run
    assert type(final) is patched
    first, second = [b["code"] for b in fake.bodies()[-2:]]
    assert first == second and "= allow_pickle_setting" not in second and "ALLOW_PICKLE = False" in second
    assert "_patch_final_answer_with_exception" not in vars(ex)
