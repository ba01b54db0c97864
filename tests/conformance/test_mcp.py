"""MCP servers in a sandbox through the real `withruntime==0.35.0` SDK
(`runtime.mcp.catalog()`, `sbx.mcp.start/ready/get/stop`), called with the
real `mcp` client from PyPI over streamable HTTP at the URLs and headers
the server answers. The catalog's `time` server is installed from PyPI
inside the sandbox, through its egress."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from _helpers import delete_quietly, loopback
from withruntime import Sandbox


@pytest.fixture(scope="module")
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    try:
        yield b
    finally:
        delete_quietly(b)


def _post(url: str, headers: dict, message: dict) -> tuple[int, dict]:
    """One raw JSON-RPC POST: its status and JSON body."""
    url, host = loopback(url)
    req = urllib.request.Request(url, data=json.dumps(message).encode(), method="POST",
                                 headers={**headers, **host, "Content-Type": "application/json",
                                          "Accept": "application/json, text/event-stream"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _use(url: str, headers: dict) -> tuple[str, list[str], str]:
    """With the mcp client: initialize, list the tools, call get_current_time."""
    from mcp import ClientSession
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    url, host = loopback(url)
    headers = {**headers, **host}

    async def run():
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    init = await s.initialize()
                    tools = await s.list_tools()
                    r = await s.call_tool("get_current_time", {"timezone": "UTC"})
                    assert not r.is_error, r
                    return init.server_info.name, [t.name for t in tools.tools], r.content[0].text

    return asyncio.run(run())


def test_catalog(runtime_client):
    catalog = {e["id"]: e for e in runtime_client.mcp.catalog()}
    assert {"time", "fetch", "git", "sqlite", "filesystem", "memory", "github"} <= set(catalog)
    assert catalog["time"]["registry"] == "pypi" and "pypi.org" in catalog["time"]["egress"]
    assert catalog["filesystem"]["registry"] == "npm"
    gh = catalog["github"]["secrets"]
    assert gh[0]["env"] == "GITHUB_PERSONAL_ACCESS_TOKEN" and gh[0]["required"] is True


def test_time_server_through_the_gateway(box):
    from withruntime import InvalidRequestError

    assert box.mcp.get()["running"] is False
    with pytest.raises(InvalidRequestError) as e:
        box.mcp.start([{"id": "no-such-server"}])
    assert e.value.code == "mcp_server_unknown"
    with pytest.raises(InvalidRequestError) as e:
        box.mcp.start([{"id": "github"}])
    assert e.value.code == "mcp_secret_required"

    t0 = time.monotonic()
    gw = box.mcp.start([{"id": "time"}])
    assert gw["running"] is True and gw["public"] is False
    srv = gw["servers"][0]
    assert srv["id"] == "time" and srv["status"] in ("installing", "running")
    assert srv["url"].endswith("/mcp/time") and "x-runtime-preview-token" in {k.lower() for k in gw["headers"]}
    gw = box.mcp.ready(timeout=1200, interval=3)
    srv = gw["servers"][0]
    assert srv["status"] == "running", srv
    print(f"time server installed from PyPI and started: {time.monotonic() - t0:.1f} s")
    assert srv["serverInfo"]["name"] == "mcp-time"

    name, tools, text = _use(srv["url"], gw["headers"])
    assert name == "mcp-time" and "get_current_time" in tools
    assert '"timezone": "UTC"' in text, text

    # Without the header, or with a wrong one, the gateway is out of reach.
    tools_list = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    code, body = _post(srv["url"], {}, tools_list)
    assert code == 401 and body["error"]["code"] == "preview_token_required", body
    code, _ = _post(srv["url"], {"X-Runtime-Preview-Token": "x" * 40}, tools_list)
    assert code == 401
    code, body = _post(srv["url"], gw["headers"], tools_list)
    assert code == 200 and body["id"] == 1 and body["result"]["tools"], body

    # The same start again leaves the running server alone.
    again = box.mcp.start([{"id": "time"}])
    assert again["servers"][0]["startedAt"] == srv["startedAt"]


def test_gateway_survives_pause_and_wake(box):
    gw = box.mcp.get()
    assert gw["running"] is True, "runs after test_time_server_through_the_gateway"
    started = gw["servers"][0]["startedAt"]
    box.pause()
    box.wake()
    gw = box.mcp.get()
    srv = gw["servers"][0]
    assert srv["status"] == "running" and srv["startedAt"] == started
    assert _use(srv["url"], gw["headers"])[0] == "mcp-time"


def test_public_gateway_needs_its_key(box):
    gw = box.mcp.start([{"id": "time"}], public=True)
    assert gw["public"] is True and gw["tokenExpiresAt"] is None
    key = gw["headers"]["X-Mcp-Gateway-Key"]
    assert len(key) == 64
    gw = box.mcp.ready(timeout=600, interval=2)
    srv = gw["servers"][0]
    assert srv["status"] == "running", srv
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert _post(srv["url"], {}, tools_list)[0] == 401
    assert _post(srv["url"], {"X-Mcp-Gateway-Key": "0" * 64}, tools_list)[0] == 401
    assert _use(srv["url"], gw["headers"])[0] == "mcp-time"
    # The key is kept by the next public start; a private one drops it.
    assert box.mcp.start([{"id": "time"}], public=True)["headers"]["X-Mcp-Gateway-Key"] == key
    gw = box.mcp.start([{"id": "time"}])
    assert gw["public"] is False and "X-Mcp-Gateway-Key" not in gw["headers"]
    assert _post(gw["servers"][0]["url"], {"X-Mcp-Gateway-Key": key}, tools_list)[0] == 401


def test_stop_ends_the_urls(box):
    gw = box.mcp.get()
    url, headers = gw["servers"][0]["url"], gw["headers"]
    assert box.mcp.stop() is True
    assert box.mcp.get()["running"] is False
    code, _ = _post(url, headers, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    assert code in (401, 404), code
    assert box.mcp.stop() is False
