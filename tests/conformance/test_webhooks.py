"""Webhooks and the event feed through the real `withruntime==0.35.0` SDK:
`runtime.webhooks` sends a sandbox's lifecycle to a receiver on this machine,
which checks every delivery with `withruntime.verify_webhook`; a receiver that
is down for a while gets every event once it is back, a sandbox's in the order
they happened; `runtime.events.list` pages the same events.
"""
from __future__ import annotations

import http.server
import threading
import time

import pytest
from withruntime import Sandbox, WebhookVerificationError, verify_webhook
from withruntime._errors import InvalidRequestError, NotFoundError


class _Receiver(http.server.ThreadingHTTPServer):
    """A webhook endpoint on 127.0.0.1: 503 while down, else it verifies each
    delivery with the secrets it knows and keeps the events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down = False
        self.refused = 0
        self.secrets: list[str] = []
        self.events: list[dict] = []
        self.failures: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks/runtime"

    def taken(self) -> list[dict]:
        with self.lock:
            return list(self.events)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            if self.server.down:
                self.server.refused += 1
                self.send_response(503)
                self.end_headers()
                return
            try:
                event = verify_webhook(body, self.headers.get("runtime-signature"), self.server.secrets)
            except WebhookVerificationError as e:
                self.server.failures.append(str(e))
                self.send_response(401)
                self.end_headers()
                return
            self.server.events.append(event)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet
        pass


def _wait(what: str, cond, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def receiver():
    r = _Receiver()
    yield r
    r.shutdown()
    r.server_close()


@pytest.fixture
def hook(runtime_client, receiver):
    try:
        h = runtime_client.webhooks.create(url=receiver.url, events=["sandbox.*"], description="conformance")
    except InvalidRequestError as e:
        if e.code == "webhook_url_forbidden":
            pytest.skip("the server under test refuses loopback receivers (no --webhook-allow-private)")
        raise
    receiver.secrets = [h["secret"]]
    yield h
    try:
        runtime_client.webhooks.delete(h["id"])
    except NotFoundError:
        pass


def test_webhook_crud_test_and_rotation(runtime_client, receiver, hook):
    hooks = runtime_client.webhooks
    assert hook["id"].startswith("wh_") and hook["secret"].startswith("whsec_") and hook["enabled"] is True
    assert hook["events"] == ["sandbox.*"]
    got = hooks.get(hook["id"])
    assert "secret" not in got and got["url"] == receiver.url
    assert hook["id"] in [h["id"] for h in hooks.list()["data"]]

    sent = hooks.test(hook["id"])
    assert sent["state"] == "delivered" and sent["lastStatus"] == 204, sent
    assert receiver.taken()[-1]["type"] == "webhook.test"

    # During a rotation a receiver that knows either secret verifies.
    old = hook["secret"]
    rotated = hooks.rotate_secret(hook["id"], keep_previous_seconds=300)
    assert rotated["secret"] != old and rotated["previousSecretExpiresAt"]
    for known in ([old], [rotated["secret"]]):
        receiver.secrets = known
        assert hooks.test(hook["id"])["state"] == "delivered"
    rotated = hooks.rotate_secret(hook["id"], keep_previous_seconds=0)
    receiver.secrets = [old]
    refused = hooks.test(hook["id"])
    assert refused["state"] == "failed" and refused["lastStatus"] == 401, refused
    receiver.secrets = [rotated["secret"]]
    again = hooks.retry(refused["id"])
    assert again["state"] == "delivered" and again["attempts"] == 2, again
    states = {d["id"]: d["state"] for d in hooks.deliveries(hook["id"])["data"]}
    assert states[refused["id"]] == "delivered"

    off = hooks.update(hook["id"], enabled=False, description="off")
    assert off["enabled"] is False and off["description"] == "off"
    with pytest.raises(InvalidRequestError) as e:
        hooks.create(url="ftp://example.com/")
    assert e.value.code == "invalid_webhook_url"
    with pytest.raises(InvalidRequestError) as e:
        hooks.create(url=receiver.url, events=["sandbox.exploded"])
    assert e.value.code == "invalid_events"


def test_receiver_down_gets_every_event_in_order(runtime_client, receiver, hook):
    receiver.down = True
    box = Sandbox.create(client=runtime_client, timeout_seconds=600)
    box.delete()
    _wait("deliveries refused while the receiver is down", lambda: receiver.refused >= 2)
    feed = list(reversed(runtime_client.events.list(resource_id=box.id)["data"]))  # oldest first
    types = [e["type"] for e in feed]
    assert types[0] == "sandbox.created" and "sandbox.running" in types and types[-1] == "sandbox.deleted", types
    receiver.down = False

    def all_arrived():
        ids = {e["id"] for e in receiver.taken() if e["resourceId"] == box.id}
        return ids >= {e["id"] for e in feed}
    _wait("every event of the sandbox after the receiver came back", all_arrived)
    assert not receiver.failures, receiver.failures
    arrived = []
    for e in receiver.taken():
        if e["resourceId"] == box.id and e["id"] not in arrived:
            arrived.append(e["id"])
    assert arrived == [e["id"] for e in feed], (arrived, feed)
    # The bodies are the feed's events.
    by_id = {e["id"]: e for e in receiver.taken()}
    for e in feed:
        assert by_id[e["id"]]["type"] == e["type"] and by_id[e["id"]]["data"] == e["data"]
    deliveries = runtime_client.webhooks.deliveries(hook["id"], state="delivered", limit=100)["data"]
    retried = [d for d in deliveries if d["resourceId"] == box.id and d["attempts"] > 1]
    assert retried, deliveries
    # The feed pages, newest first, by type too.
    stopped = runtime_client.events.list(type="sandbox.*", resource_id=box.id, limit=1)
    assert len(stopped["data"]) == 1 and stopped["nextCursor"], stopped
    older = runtime_client.events.list(resource_id=box.id, cursor=stopped["nextCursor"], limit=100)["data"]
    assert [e["id"] for e in older] == [e["id"] for e in reversed(feed)][1:]
