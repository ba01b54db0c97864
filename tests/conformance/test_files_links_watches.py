"""The rest of the files API through the real `withruntime==0.35.0` SDK: a
directory upload over 1 MiB (the chunked archive route), signed download
and upload links and their revocation, and a file watch. One sandbox serves
every test of the module."""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request

import pytest
from withruntime import Sandbox

from _helpers import ok, poll

WS = "/workspace"
# Links are opened without the SDK: no key, no proxy.
_open = urllib.request.build_opener(urllib.request.ProxyHandler({})).open


@pytest.fixture(scope="module")
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    yield b
    try:
        b.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {b.id} failed: {e}")


def test_upload_large_directory(box, tmp_path):
    src = tmp_path / "big"
    (src / "sub").mkdir(parents=True)
    blob = os.urandom(3 << 20)  # incompressible: the tar.gz is over 1 MiB
    (src / "blob.bin").write_bytes(blob)
    (src / "sub" / "note.txt").write_text("note\n")
    box.files.upload(str(src), f"{WS}/big")
    r = box.exec(f"cd {WS}/big && sha256sum blob.bin && cat sub/note.txt")
    ok(r, "checking the upload")
    assert r.stdout == f"{hashlib.sha256(blob).hexdigest()}  blob.bin\nnote\n"
    out = tmp_path / "back"
    box.files.download(f"{WS}/big", str(out))
    assert (out / "blob.bin").read_bytes() == blob
    assert (out / "sub" / "note.txt").read_text() == "note\n"


def test_links_and_revoke(box):
    box.files.write(f"{WS}/shared.txt", "shared through a link\n")
    link = box.files.download_url(f"{WS}/shared.txt", expires_in_seconds=600)
    assert link["url"] and link["expiresAt"]
    with _open(link["url"], timeout=60) as r:
        assert r.read() == b"shared through a link\n"
    folder = box.files.download_url(f"{WS}/big", archive=True)
    with _open(folder["url"], timeout=120) as r:
        assert r.read(2) == b"\x1f\x8b"
    up = box.files.upload_url(f"{WS}/dropped.txt", max_bytes=1000)
    put = urllib.request.Request(up["url"], data=b"dropped in\n", method="PUT")
    with _open(put, timeout=60) as r:
        assert r.status == 200
    assert box.files.read_text(f"{WS}/dropped.txt") == "dropped in\n"

    box.files.revoke_links()
    with pytest.raises(urllib.error.HTTPError) as refused:
        _open(link["url"], timeout=60)
    assert refused.value.code == 403
    assert b"link_revoked" in refused.value.read()
    # A link made after the revoke works.
    again = box.files.download_url(f"{WS}/shared.txt")
    with _open(again["url"], timeout=60) as r:
        assert r.read() == b"shared through a link\n"


def test_watch(box):
    box.files.mkdir(f"{WS}/watched")
    watch = box.files.watch(f"{WS}/watched", recursive=True)
    assert any(w["id"] == watch.id for w in box.files.watches.list())
    box.files.write(f"{WS}/watched/a.txt", "one")
    ok(box.exec(f"echo more >> {WS}/watched/a.txt && rm {WS}/watched/a.txt"), "changing a.txt")
    want = {("create", f"{WS}/watched/a.txt"), ("modify", f"{WS}/watched/a.txt"), ("delete", f"{WS}/watched/a.txt")}
    seen: set = set()

    def saw_all():
        seen.update((e["type"], e["path"]) for e in watch.get_new_events(wait_ms=5000))
        return want <= seen
    assert poll(saw_all, 60), seen

    # The streamed form sees what comes next.
    box.files.mkdir(f"{WS}/watched/later")
    box.files.write(f"{WS}/watched/later/b.txt", "two")
    streamed = set()
    for event in watch.events():
        streamed.add((event["type"], event["path"]))
        assert event["at"]
        if ("create", f"{WS}/watched/later/b.txt") in streamed:
            break
    assert ("create", f"{WS}/watched/later") in streamed
    assert watch.stop()
    assert all(w["id"] != watch.id for w in box.files.watches.list())
