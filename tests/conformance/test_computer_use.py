"""Computer use through the real `withruntime==0.35.0` SDK: `sbx.browser`
starts Chromium (from the image's computer-use layer) in a real sandbox, and
Playwright from PyPI drives it over CDP through the `cdpUrl` the server
answers. Playwright downloads no browser for that: it connects to ours."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from _helpers import delete_quietly, loopback as _loopback, poll as _poll
from withruntime import Sandbox

PAGE = ("<html><head><title>Hello from Emberbox</title></head>"
        "<body><h1>hi</h1><input id=q></body></html>")


@pytest.fixture(scope="module")
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    try:
        b.files.write("/workspace/site/index.html", PAGE)
        b.spawn("python3 -m http.server 8000 --bind 127.0.0.1", cwd="/workspace/site")
        assert _poll(lambda: b.exec("curl -s --max-time 5 http://127.0.0.1:8000/", timeout_ms=20_000).exit_code == 0,
                     90, 1), "the page's server never answered"
        yield b
    finally:
        delete_quietly(b)


def _status(url: str) -> tuple[int, str]:
    """GET url (a ws:// address read as http://): its status and error code."""
    url, host = _loopback(url.replace("ws://", "http://", 1))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=host), timeout=60) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}").get("error", {}).get("code", "")


def _page(cdp_url: str, playwright):
    url, headers = _loopback(cdp_url)
    browser = playwright.chromium.connect_over_cdp(url, headers=headers, timeout=120_000)
    ctx = browser.contexts[0] if browser.contexts else browser.new_context()
    return browser, ctx


def test_playwright_drives_the_sandbox_browser_over_cdp(box):
    from playwright.sync_api import sync_playwright

    assert box.browser.get()["running"] is False
    t0 = time.monotonic()
    b = box.browser.start()
    print(f"browser start in a fresh sandbox: {time.monotonic() - t0:.1f} s")
    assert b["running"] is True and b["headless"] is True and (b["width"], b["height"]) == (1280, 720)
    assert b["cdpUrl"].startswith("ws://9222-") and "/devtools/browser/" in b["cdpUrl"]
    assert b["version"].startswith("Chrome/")
    # A second start answers the browser that runs.
    assert box.browser.start()["startedAt"] == b["startedAt"]
    # Inside the sandbox the same browser is at 127.0.0.1:9222.
    inside = box.exec("curl -s --max-time 10 http://127.0.0.1:9222/json/version", timeout_ms=30_000)
    assert inside.exit_code == 0 and b["cdpUrl"].split("?")[0].endswith(
        json.loads(inside.stdout)["webSocketDebuggerUrl"].split("9222", 1)[1])
    # The URL without its token is refused.
    assert _status(b["cdpUrl"].split("?")[0]) == (401, "preview_token_required")

    with sync_playwright() as p:
        browser, ctx = _page(b["cdpUrl"], p)
        page = ctx.new_page()
        page.goto("http://127.0.0.1:8000/", timeout=120_000)
        assert page.title() == "Hello from Emberbox"
        page.fill("#q", "typed through CDP")
        assert page.input_value("#q") == "typed through CDP"
        png = page.screenshot(timeout=120_000)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
        browser.close()  # over CDP: disconnects, the browser runs on

    # A pause saves the whole VM: the browser and its page survive a wake,
    # and a fresh cdpUrl reaches them.
    box.pause()
    box.wake()
    g = box.browser.get()
    assert g["running"] is True and g["startedAt"] == b["startedAt"] and g["cdpUrl"]
    with sync_playwright() as p:
        browser, ctx = _page(g["cdpUrl"], p)
        titles = [pg.title() for pg in ctx.pages]
        assert "Hello from Emberbox" in titles, titles
        browser.close()

    assert box.browser.stop() is True
    assert box.browser.get()["running"] is False and box.browser.get()["cdpUrl"] is None
    # Its URLs end with it.
    assert _status(g["cdpUrl"])[0] == 404
    assert box.browser.stop() is False


FORM = ("<html><head><title>Form</title></head><body style='font-size:40px'>"
        "<input id=q autofocus style='font-size:40px' "
        "onkeydown=\"if (event.key == 'Enter') document.title = 'typed: ' + this.value\"></body></html>")


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", png[:16]
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _act_raw(server, box, body: dict) -> tuple[int, str]:
    """POST …/desktop:act with body as it is: its status and error code."""
    req = urllib.request.Request(f"{server.url}/v1/sandboxes/{box.id}/desktop:act", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + server.key, "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}").get("error", {}).get("code", "")


def _desktop_raw(server, box) -> dict:
    """GET …/desktop (the SDK has no call for it)."""
    req = urllib.request.Request(f"{server.url}/v1/sandboxes/{box.id}/desktop",
                                 headers={"Authorization": "Bearer " + server.key})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=120) as r:
        return json.loads(r.read())


def _mp4_boxes(data: bytes) -> list[str]:
    """The top-level boxes of an MP4 file, checking that they tile it."""
    names, at = [], 0
    while at < len(data):
        size, name = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8].decode("latin-1")
        if size == 1:
            size = int.from_bytes(data[at + 8:at + 16], "big")
        assert size >= 8 and at + size <= len(data), (name, size, at, len(data))
        names.append(name)
        at += size
    return names


def _live_view(stream: str) -> None:
    """The live view: its page (with the token) is noVNC's, refused without
    the token; its WebSocket carries the desktop's VNC server, whose first
    bytes are the RFB greeting. The WebSocket is spoken by hand here: one
    handshake and one server frame."""
    import base64
    import os
    import socket

    assert _status(stream) == (200, "")
    bare = stream.split("?")[0]
    assert _status(bare) == (401, "preview_token_required")
    token = stream.split("runtime_preview_token=")[1]
    url, host = _loopback(bare + "websockify?runtime_preview_token=" + token)
    u = urlsplit(url)
    s = socket.create_connection((u.hostname, u.port), timeout=180)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        origin = f"http://{host.get('Host', u.netloc)}"
        s.sendall((f"GET {u.path}?{u.query} HTTP/1.1\r\nHost: {host.get('Host', u.netloc)}\r\n"
                   f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   f"Sec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            assert chunk, data
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        while len(rest) < 2 + 12:
            rest += s.recv(4096)
        assert rest[0] == 0x82, rest[:2]  # FIN, binary
        assert rest[2:14].startswith(b"RFB 003.00"), rest[:20]
    finally:
        s.close()


def test_desktop_is_driven_like_a_person_would(box, emberbox_server):
    box.files.write("/workspace/site/form.html", FORM)
    t0 = time.monotonic()
    d = box.desktop.start(width=1024, height=768)
    print(f"desktop start: {time.monotonic() - t0:.1f} s")
    assert d["running"] is True and (d["width"], d["height"]) == (1024, 768) and d["display"] == ":1"
    assert box.desktop.start()["startedAt"] == d["startedAt"]
    stream = d["streamUrl"]
    assert stream.startswith("http://5900-") and "runtime_preview_token=" in stream
    _live_view(stream)

    box.desktop.move(100, 200)
    assert box.desktop.cursor() == {"x": 100, "y": 200}
    box.desktop.open("file:///workspace/site/form.html")
    assert _poll(lambda: any("Form" in w["title"] for w in box.desktop.windows()), 300, 1), box.desktop.windows()
    rec = box.desktop.recordings.start(fps=5, max_seconds=300, max_mib=64)
    assert rec["state"] == "recording" and rec["id"].startswith("rec_")
    box.desktop.click(100, 120)
    box.desktop.type("hello desktop")
    box.desktop.press("Return")
    # The page titles itself with what was typed once Return is pressed:
    # the window's title shows what the keyboard did.
    assert _poll(lambda: any("typed: hello desktop" in w["title"] for w in box.desktop.windows()), 300, 1), \
        box.desktop.windows()

    done = box.desktop.recordings.stop(rec["id"])
    assert done["state"] == "ready" and done["sizeBytes"] > 0, done
    assert [r["id"] for r in box.desktop.recordings.list()] == [rec["id"]]
    video = box.desktop.recordings.download(rec["id"])
    assert len(video) == done["sizeBytes"]
    boxes = _mp4_boxes(video)
    assert boxes[0] == "ftyp" and "moov" in boxes and "mdat" in boxes, boxes
    open("/tmp/emberbox-desktop-recording.mp4", "wb").write(video)
    assert box.desktop.recordings.delete(rec["id"]) is True
    assert box.desktop.recordings.list() == []

    t0 = time.monotonic()
    png = box.desktop.screenshot()
    print(f"screenshot: {time.monotonic() - t0:.2f} s, {len(png)} bytes")
    assert _png_size(png) == (1024, 768) and len(png) > 5000
    jpeg = box.desktop.screenshot(format="jpeg", quality=50)
    assert jpeg[:3] == b"\xff\xd8\xff"

    # Bad input is refused in the API's error shape, before the guest.
    for bad in ({"action": "move", "x": 5000, "y": 1}, {"action": "key", "keys": "ctrl+l; rm -rf /"},
                {"action": "teleport"}, {"action": "focus", "windowId": "$(id)"},
                {"action": "type", "text": ""}, {"action": "open", "url": "javascript:alert(1)"}):
        assert _act_raw(emberbox_server, box, bad) == (400, "invalid_request"), bad

    assert box.desktop.stop()["stopped"] is True
    assert box.browser.get()["running"] is False  # its window went with it
    assert _desktop_raw(emberbox_server, box)["streamUrl"] is None
    assert _status(stream)[0] in (401, 404)  # the view's preview went with it
    assert _act_raw(emberbox_server, box, {"action": "cursor"}) == (409, "desktop_not_running")
