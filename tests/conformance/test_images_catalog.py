"""The image catalog through the real `withruntime==0.35.0` SDK: an image
the operator imported (a copy of the default disk with a start command,
`emberbox images import`), found, followed and tagged with `runtime.images`,
booted with `Sandbox.create(image=...)`, refused deletion while in use.
Builds themselves (recipes, Dockerfiles) are the builder's tests.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from _helpers import ok as _ok
from conftest import BINARY
from withruntime import RuntimeError as RuntimeAPIError, Sandbox


def _server_rootfs(server) -> str:
    m = re.search(r'msg="guest image" image=([0-9a-f]+)', Path(server.log_path).read_text(errors="replace"))
    assert m, "no guest image line in the server log"
    path = Path.home() / ".cache" / "emberbox" / "images" / m.group(1) / "rootfs.img"
    assert path.is_file(), path
    return str(path)


@pytest.fixture(scope="module")
def web_image(emberbox_server, runtime_client):
    if emberbox_server.data_dir is None:
        pytest.skip("needs the server's data dir (emberbox images import)")
    owner = runtime_client.me()["keyId"]
    out = subprocess.run(
        [str(BINARY), "images", "import", _server_rootfs(emberbox_server), "--data-dir", str(emberbox_server.data_dir),
         "--name", "web", "--owner", owner, "--env", "GREETING=hi", "--start-command", "python3 -m http.server 8000",
         "--ready-port", "8000", "--ready-timeout", "120"],
        capture_output=True, text=True, timeout=600, check=True)
    return out.stdout.strip()


def test_images_catalog(runtime_client, web_image):
    images = runtime_client.images
    img = images.resolve("web")
    assert img["id"] == web_image and img["state"] == "ready" and img["tags"] == ["latest"], img
    assert images.get(web_image)["name"] == "web"
    assert images.resolve("web@1")["id"] == web_image
    assert [i["id"] for i in images.versions("web").data] == [web_image]
    assert images.resolve("default")["public"] is True

    # The log of a finished image: a page that is done, and a follow that ends.
    page = images.logs(web_image)
    assert page["done"] is True and page["lines"], page
    seen = []
    final = images.follow_logs(web_image, seen.append)
    assert final["id"] == web_image and final["state"] == "ready"
    assert [line["seq"] for line in seen] == [line["seq"] for line in page["lines"]]

    assert "stable" in images.tag("web", "stable")["tags"]
    assert images.resolve("web:stable")["id"] == web_image
    assert "stable" not in images.untag(web_image, "stable")["tags"]
    with pytest.raises(RuntimeAPIError) as e:
        images.resolve("web:stable")
    assert e.value.code == "image_not_found"


def test_sandbox_of_image_with_start_command(runtime_client, web_image):
    box = Sandbox.create(client=runtime_client, image="web")
    try:
        assert box.state == "running"
        start = box.info.get("start")
        assert start and start["ready"] is True and start["command"] == "python3 -m http.server 8000", box.info
        # Ready when the create answered: the server answers at once.
        r = box.exec("curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:8000/ && echo \" $GREETING\"")
        _ok(r, "the start command's server")
        assert r.stdout == "200 hi\n", r.stdout
        with pytest.raises(RuntimeAPIError) as e:
            runtime_client.images.delete("web")
        assert e.value.code == "image_in_use"
    finally:
        box.delete()
    gone = runtime_client.images.delete("web")
    assert gone["state"] == "deleted"
    with pytest.raises(RuntimeAPIError) as e:
        Sandbox.create(client=runtime_client, image="web")
    assert e.value.code == "image_not_found"
