"""Volumes through the real `withruntime==0.35.0` SDK: a disk of its own,
made with `runtime.volumes.create`, attached to one running sandbox at a time
(`volumes.attach` / `volumes.detach`, or `Sandbox.create(volumes=[...])`),
mounted with the sandbox user's rights, and outliving the sandboxes that wrote it.
"""
from __future__ import annotations

import uuid

import pytest
from _helpers import ok as _ok
from withruntime import Sandbox
from withruntime._errors import ConflictError, InvalidRequestError, NotFoundError


@pytest.fixture
def volume(runtime_client):
    v = runtime_client.volumes.create(256, name="conformance", labels={"suite": "volumes"})
    yield v
    try:
        runtime_client.volumes.delete(v["id"])
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of volume {v['id']} failed: {e}")


def _delete(box):
    try:
        box.delete()
    except Exception as e:  # noqa: BLE001
        print(f"cleanup: delete of {box.id} failed: {e}")


def test_volume_moves_between_sandboxes(runtime_client, volume):
    vols = runtime_client.volumes
    assert volume["id"].startswith("vol_") and volume["state"] == "ready" and volume["sizeMiB"] == 256
    assert vols.get(volume["id"])["name"] == "conformance"
    assert volume["id"] in [v["id"] for v in vols.list(name="conformance")]
    token = uuid.uuid4().hex

    # Create-time volumes: mounted before the sandbox runs.
    first = Sandbox.create(client=runtime_client, volumes=[{"volume_id": volume["id"], "path": "/data"}])
    second = None
    try:
        r = first.exec("stat -c %U /data && findmnt -n -o FSTYPE /data")
        _ok(r, "the mount")
        assert r.stdout.split() == ["user", "ext4"], r.stdout
        first.files.write("/data/token.txt", token)
        _ok(first.exec("cd /data && head -c 3000000 /dev/urandom > blob && md5sum blob > blob.md5 && sync"), "write")
        held = vols.get(volume["id"])
        assert held["state"] == "attached" and held["sandboxId"] == first.id, held

        # One sandbox at a time.
        second = Sandbox.create(client=runtime_client)
        with pytest.raises(ConflictError) as e:
            vols.attach(volume["id"], second.id, "/data")
        assert e.value.code == "volume_attached" and first.id in str(e.value)
        with pytest.raises(ConflictError):
            vols.delete(volume["id"])

        vols.detach(volume["id"], held["attachmentId"])
        assert vols.get(volume["id"])["state"] == "ready"
        assert first.exec("mountpoint -q /data").exit_code != 0

        att = vols.attach(volume["id"], second.id, "/mnt/shared")
        assert att["state"] == "attached" and att["sandboxId"] == second.id and att["path"] == "/mnt/shared", att
        assert vols.get_attachment(volume["id"], att["id"])["state"] == "attached"
        assert second.files.read("/mnt/shared/token.txt").decode() == token
        _ok(second.exec("cd /mnt/shared && md5sum -c blob.md5"), "data intact in the second sandbox")
        vols.detach(volume["id"], att["id"])
    finally:
        _delete(first)
        if second is not None:
            _delete(second)


def test_volume_grows_and_refuses_what_is_not_offered(runtime_client, volume):
    vols = runtime_client.volumes
    grown = vols.resize(volume["id"], 512)
    assert grown["sizeMiB"] == 512
    with pytest.raises(InvalidRequestError):
        vols.resize(volume["id"], 128)  # grow only
    with pytest.raises(InvalidRequestError):
        Sandbox.create(client=runtime_client, volumes=[{"volume_id": volume["id"], "path": "/data", "mode": "snapshot"}])
    with pytest.raises(NotFoundError):
        vols.get("vol_doesnotexist")
    box = Sandbox.create(client=runtime_client, volumes=[{"volume_id": volume["id"], "path": "/data"}])
    try:
        r = box.exec("df -m --output=size /data | tail -1")
        _ok(r, "df")
        assert int(r.stdout.strip()) > 400, f"the filesystem was not grown to the volume: {r.stdout!r} MiB"
    finally:
        _delete(box)
    # The sandbox's delete let go of the volume.
    assert vols.get(volume["id"])["state"] == "ready"


def test_volume_backup_and_restore(runtime_client, volume):
    vols = runtime_client.volumes
    box = Sandbox.create(client=runtime_client, volumes=[{"volume_id": volume["id"], "path": "/data"}])
    restored = None
    try:
        box.files.write("/data/kept.txt", "before the backup")
        backup = vols.backup(volume["id"], name="conformance", retention_days=2)
        assert backup["id"].startswith("vbk_") and backup["state"] == "ready", backup
        assert backup["consistent"] == "frozen" and backup["sizeMiB"] == 256, backup
        assert backup["id"] in [b["id"] for b in vols.backups(volume["id"])]
        assert vols.get_backup(backup["id"])["volumeId"] == volume["id"]
        box.files.write("/data/kept.txt", "after the backup")
        restored = vols.restore(backup["id"], name="restored")
        assert restored["id"] != volume["id"] and restored["sizeMiB"] == 256 and restored["state"] == "ready", restored
        vols.attach(restored["id"], box.id, "/restored")
        assert box.files.read("/restored/kept.txt").decode() == "before the backup"
        assert box.files.read("/data/kept.txt").decode() == "after the backup"
        vols.delete_backup(backup["id"])
        with pytest.raises(ConflictError):
            vols.restore(backup["id"])
    finally:
        _delete(box)
        if restored is not None:
            vols.delete(restored["id"])
