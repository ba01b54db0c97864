"""The tunnel (forward_port) and previews through the real `withruntime==0.35.0`
SDK, against servers running in real sandboxes: python3 -m http.server and a
WebSocket echo server written with the standard library only."""
from __future__ import annotations

import base64
import json
import os
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from _helpers import loopback as _loopback, poll as _poll
from withruntime import Sandbox

WS_ECHO = r'''
import base64, hashlib, socket, struct, sys, threading
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    f = c.makefile("rb")
    while True:
        b1, b2 = f.read(2)
        n = b2 & 0x7F
        if n == 126: n = struct.unpack("!H", f.read(2))[0]
        elif n == 127: n = struct.unpack("!Q", f.read(8))[0]
        mask = f.read(4) if b2 & 0x80 else b"\0\0\0\0"
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
        if b1 & 0x0F == 8:
            c.close(); return
        out = b"echo:" + data
        c.sendall(bytes([0x81, len(out)]) + out if len(out) < 126 else bytes([0x81, 126]) + struct.pack("!H", len(out)) + out)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
'''


def _answers(box, port: int) -> bool:
    r = box.exec(f"curl -s --max-time 5 http://127.0.0.1:{port}/", timeout_ms=20_000)
    return r.exit_code == 0


@pytest.fixture(scope="module")
def boxes(runtime_client):
    made = []
    try:
        for _ in range(2):
            made.append(Sandbox.create(client=runtime_client, timeout_seconds=1800))
        a, b = made
        a.files.write("/workspace/hello.txt", "hello from a\n")
        b.files.write("/workspace/hello.txt", "hello from b\n")
        a.files.write("/workspace/ws_echo.py", WS_ECHO)
        a.spawn("python3 -m http.server 8000", cwd="/workspace")
        a.spawn("python3 /workspace/ws_echo.py 8001", cwd="/workspace")
        # b serves on a port a has nothing on.
        b.spawn("python3 -m http.server 8002", cwd="/workspace")
        assert _poll(lambda: _answers(a, 8000), 90, 1), "a's http.server never answered"
        assert _poll(lambda: a.exec("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8001))\"").exit_code == 0, 60, 1)
        assert _poll(lambda: _answers(b, 8002), 90, 1), "b's http.server never answered"
        yield a, b
    finally:
        for box in made:
            try:
                box.delete()
            except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
                print(f"cleanup: delete of {box.id} failed: {e}")


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    url, host = _loopback(url)
    req = urllib.request.Request(url, headers={**(headers or {}), **host})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_forward_port_carries_connections(boxes):
    a, _ = boxes
    with a.forward_port(8000, local_port=0) as fwd:
        for _ in range(3):  # one WebSocket carries each connection
            status, body = _get(f"http://127.0.0.1:{fwd.local_port}/hello.txt")
            assert status == 200 and body == b"hello from a\n"
        # A big answer crosses the guest stream's flow control.
        a.exec("head -c 3000000 /dev/urandom > /workspace/big.bin")
        want = a.files.read("/workspace/big.bin")
        status, body = _get(f"http://127.0.0.1:{fwd.local_port}/big.bin")
        assert status == 200 and len(body) == 3_000_000 and body == want


def test_forward_port_to_a_closed_port_fails_the_connection(boxes):
    a, _ = boxes
    with a.forward_port(8999, local_port=0) as fwd:
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{fwd.local_port}/", timeout=60).read()


def test_private_preview_needs_the_token_or_key(boxes, emberbox_server):
    a, _ = boxes
    p = a.previews.create(8000)
    assert p["visibility"] == "private" and p["port"] == 8000 and p["token"] and p["url"].endswith("/")
    url = p["url"] + "hello.txt"
    status, body = _get(url)
    assert status == 401 and json.loads(body)["error"]["code"] == "preview_token_required"
    assert _get(url, {"x-runtime-preview-token": "forged." + p["token"]})[0] == 401
    assert _get(url, {"x-runtime-preview-token": p["token"]}) == (200, b"hello from a\n")
    with_token = p["urlWithToken"].replace("/?", "/hello.txt?")
    assert _get(with_token) == (200, b"hello from a\n")
    assert _get(url, {"Authorization": "Bearer " + emberbox_server.key}) == (200, b"hello from a\n")
    # A rotation refuses the old token.
    old = p["token"]
    new = a.previews.rotate(8000)
    assert new["token"] != old
    assert _get(url, {"x-runtime-preview-token": old})[0] == 401
    assert _get(url, {"x-runtime-preview-token": new["token"]})[0] == 200
    got = a.previews.get(8000, ttl_seconds=120)
    assert got["url"] == p["url"] and got["tokenExpiresAt"]
    assert [x["port"] for x in a.previews.list()] == [8000]
    a.previews.delete(8000)
    assert _get(url, {"x-runtime-preview-token": new["token"]})[0] == 404


def _ws_echo(url: str, text: str) -> str:
    u = urlsplit(url)
    connect_to = "127.0.0.1" if (u.hostname or "").endswith(".localhost") else u.hostname
    s = socket.create_connection((connect_to, u.port), timeout=60)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, f"closed during the handshake: {head!r}"
        head += chunk
    assert b" 101 " in head.split(b"\r\n", 1)[0], head
    rest = head.split(b"\r\n\r\n", 1)[1]
    payload, mask = text.encode(), os.urandom(4)
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    while len(rest) < 2 or len(rest) < 2 + rest[1]:
        rest += s.recv(4096)
    s.close()
    return rest[2:2 + rest[1]].decode()


def test_public_preview_and_websocket(boxes):
    a, _ = boxes
    p = a.previews.create(8001, visibility="public", ttl_seconds=600)
    assert p["visibility"] == "public" and p.get("token") is None and p["expiresAt"]
    assert _ws_echo(p["url"], "hi there") == "echo:hi there"
    assert _ws_echo(p["url"] + "any/path", "again") == "echo:again"
    a.previews.delete(8001)


def test_a_preview_reaches_only_its_own_sandbox(boxes):
    a, b = boxes
    # b serves 8002; a preview of a's 8002 reaches a, where nothing listens.
    pa = a.previews.create(8002, visibility="public")
    status, body = _get(pa["url"])
    assert status == 502 and json.loads(body)["error"]["code"] == "preview_unreachable"
    pb = b.previews.create(8002)
    assert _get(pb["url"] + "hello.txt", {"x-runtime-preview-token": pb["token"]}) == (200, b"hello from b\n")
    # a's token does not open b's preview.
    pa8000 = a.previews.create(8000)
    assert _get(pb["url"] + "hello.txt", {"x-runtime-preview-token": pa8000["token"]})[0] == 401
    for box, port in ((a, 8002), (b, 8002), (a, 8000)):
        box.previews.delete(port)


def test_previews_end_with_the_sandbox(runtime_client):
    box = Sandbox.create(client=runtime_client, timeout_seconds=600)
    try:
        box.spawn("python3 -m http.server 8000", cwd="/workspace")
        p = box.previews.create(8000, visibility="public")
        assert _poll(lambda: _get(p["url"])[0] == 200, 90, 1)
    finally:
        box.delete()
    assert _get(p["url"])[0] == 404
