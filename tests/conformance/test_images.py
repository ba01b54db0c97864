"""Custom images through the real `withruntime==0.35.0` SDK.

`runtime.images.build` with a recipe and with a Dockerfile and a build
context uploaded in chunks, then `Sandbox.create(image=...)` booting each.
Builds run inside sandbox VMs of the server; the first may take minutes
under software emulation, so the waits are long.
"""
from __future__ import annotations

import uuid

import pytest
from _helpers import ok as _ok
from withruntime import Sandbox
from withruntime._errors import RuntimeError as RuntimeAPIError

BUILD_POLL_S = 2.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def recipe_image(runtime_client):
    name = _name("conf-recipe")
    lines: list[dict] = []
    image = runtime_client.images.build(
        name=name,
        recipe={"pip": ["tabulate==0.9.0"], "files": {"/opt/emberbox/hello.txt": "hello from a recipe\n"},
                "env": {"RECIPE_GREETING": "hi"}, "commands": ["echo built-by-recipe > /opt/emberbox/marker"]},
        on_log=lines.append, poll_seconds=BUILD_POLL_S)
    yield image, lines
    # Deleted by test_delete_refused_while_in_use_then_allowed, or here.
    try:
        runtime_client.images.delete(image["id"])
    except RuntimeAPIError:
        pass


def test_recipe_build_and_boot(runtime_client, recipe_image):
    image, lines = recipe_image
    assert image["state"] == "ready", image
    assert image["name"].startswith("conf-recipe-")
    assert any("tabulate" in line.get("text", "") for line in lines), "the build log never mentions the pip step"
    # Resolution by name, name:tag and name@version.
    assert runtime_client.images.resolve(image["name"])["id"] == image["id"]
    assert runtime_client.images.resolve(image["name"] + ":latest")["id"] == image["id"]
    assert runtime_client.images.resolve(f"{image['name']}@{image['version']}")["id"] == image["id"]
    page = runtime_client.images.list(name=image["name"])
    assert [i["id"] for i in page.data] == [image["id"]]

    with Sandbox.create(client=runtime_client, image=image["name"]) as box:
        r = box.exec("python3 -c 'import tabulate; print(tabulate.__version__)'")
        _ok(r, "import tabulate")
        assert r.stdout.strip() == "0.9.0"
        assert box.files.read_text("/opt/emberbox/hello.txt") == "hello from a recipe\n"
        r = box.exec("cat /opt/emberbox/marker; echo $RECIPE_GREETING; whoami")
        _ok(r, "image files and env")
        assert r.stdout.split() == ["built-by-recipe", "hi", "user"]


def test_dockerfile_build_with_context_and_stages(runtime_client, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hello from the context')\n")
    (tmp_path / "notes.txt").write_text("kept out by .dockerignore\n")
    (tmp_path / ".dockerignore").write_text("notes.txt\n")
    dockerfile = """\
ARG GREETING=unset
FROM default AS build
ARG GREETING
RUN mkdir -p /out && echo "$GREETING from stage one" > /out/greeting.txt
COPY app/ /out/app/

FROM default
ARG GREETING
ENV APP_GREETING=$GREETING
WORKDIR /opt/app
COPY --from=build /out/ /opt/app/
RUN test ! -e /opt/app/notes.txt && python3 /opt/app/app/main.py > /opt/app/ran.txt
"""
    image = runtime_client.images.build(name=_name("conf-docker"), dockerfile=dockerfile, context_dir=str(tmp_path),
                                        build_args={"GREETING": "hello"}, poll_seconds=BUILD_POLL_S)
    try:
        assert image["state"] == "ready", image
        with Sandbox.create(client=runtime_client, image=image["id"]) as box:
            r = box.exec("cat /opt/app/greeting.txt /opt/app/ran.txt; echo $APP_GREETING; ls /opt/app")
            _ok(r, "the Dockerfile's files")
            out = r.stdout.splitlines()
            assert out[0] == "hello from stage one"
            assert out[1] == "hello from the context"
            assert out[2] == "hello"
            assert "notes.txt" not in out[3:]
    finally:
        runtime_client.images.delete(image["id"])


def test_failing_build_names_the_step(runtime_client):
    lines: list[dict] = []
    with pytest.raises(RuntimeAPIError) as err:
        runtime_client.images.build(name=_name("conf-fail"),
                                    recipe={"commands": ["echo about-to-fail >&2; exit 3"]},
                                    on_log=lines.append, poll_seconds=BUILD_POLL_S)
    assert err.value.code == "image_build_failed"
    assert "exit" in str(err.value)
    assert any("about-to-fail" in line.get("text", "") for line in lines), lines[-10:]


def test_unknown_image_is_refused(runtime_client):
    with pytest.raises(RuntimeAPIError) as err:
        Sandbox.create(client=runtime_client, image=_name("no-such-image"), wait_for_capacity=0)
    assert err.value.code == "image_not_found"


def test_switch_image_keeps_the_workspace(runtime_client, recipe_image):
    """`Sandbox.switch_image`: the new image's files, /workspace kept,
    the old disk's sudo install gone, the same sandbox."""
    image, _ = recipe_image
    box = Sandbox.create(client=runtime_client, name=_name("conf-switch"))
    try:
        box.files.write("/workspace/keep.txt", "kept across the switch\n")
        _ok(box.exec("sudo sh -c 'echo m > /etc/switch-marker'"), "sudo install")
        before = box.id
        box.switch_image(image["name"])
        assert box.id == before
        assert box.info["state"] == "running", box.info
        assert box.info.get("imageId") == image["id"], box.info
        assert box.files.read_text("/workspace/keep.txt") == "kept across the switch\n"
        assert box.files.read_text("/opt/emberbox/hello.txt") == "hello from a recipe\n"
        r = box.exec("stat -c %U /workspace/keep.txt; test -e /etc/switch-marker || echo gone")
        _ok(r, "owner and the old disk's file")
        assert r.stdout.split() == ["user", "gone"]
        # keep names only the workspace; an unknown image is refused as a
        # create's is.
        with pytest.raises(RuntimeAPIError) as err:
            box.switch_image(image["name"], keep="disk")
        assert err.value.code == "invalid_request"
        with pytest.raises(RuntimeAPIError) as err:
            box.switch_image(_name("no-such-image"))
        assert err.value.code == "image_not_found"
    finally:
        box.delete()


def test_delete_refused_while_in_use_then_allowed(runtime_client, recipe_image):
    image, _ = recipe_image
    box = Sandbox.create(client=runtime_client, image=image["id"])
    try:
        with pytest.raises(RuntimeAPIError) as err:
            runtime_client.images.delete(image["id"])
        assert err.value.code == "image_in_use"
    finally:
        box.delete()
    runtime_client.images.delete(image["id"])
    # The record stays, deleted; the name no longer resolves.
    assert runtime_client.images.get(image["id"])["state"] == "deleted"
    with pytest.raises(RuntimeAPIError) as err:
        runtime_client.images.resolve(image["name"])
    assert err.value.code == "image_not_found"
