"""Directory files through the real `withruntime==0.35.0` SDK: glob, rename,
and upload/download of a directory (a tar.gz the guest's agent packs and
unpacks). One sandbox serves every test of the module."""
from __future__ import annotations

import os
import stat

import pytest
from withruntime import Sandbox

WS = "/workspace"


@pytest.fixture(scope="module")
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    yield b
    try:
        b.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {b.id} failed: {e}")


def _tree(root: str) -> dict[str, tuple]:
    """Every entry below root: kind, permission bits, and content or link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", oct(st.st_mode & 0o777))
            else:
                with open(full, "rb") as f:
                    out[rel] = ("file", oct(st.st_mode & 0o777), f.read())
    return out


def test_glob(box):
    box.exec(f"mkdir -p {WS}/g/src/deep && touch {WS}/g/a.py {WS}/g/b.txt {WS}/g/src/c.py {WS}/g/src/deep/d.py")
    found = sorted(e["path"] for e in box.files.glob("**/*.py", root=f"{WS}/g"))
    assert found == [f"{WS}/g/a.py", f"{WS}/g/src/c.py", f"{WS}/g/src/deep/d.py"]
    assert [e["name"] for e in box.files.glob("*.txt", root=f"{WS}/g")] == ["b.txt"]


def test_rename(box):
    box.files.write(f"{WS}/r1", "one")
    box.files.write(f"{WS}/r2", "two")
    with pytest.raises(Exception) as refused:
        box.files.rename(f"{WS}/r1", f"{WS}/r2")
    assert getattr(refused.value, "code", None) == "file_exists"
    box.files.rename(f"{WS}/r1", f"{WS}/r2", overwrite=True)
    assert box.files.read_text(f"{WS}/r2") == "one"
    assert not box.files.exists(f"{WS}/r1")


def test_upload_download_directory(box, tmp_path):
    src = tmp_path / "src"
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "run.sh", 0o755)
    (src / "sub" / "deep" / "data.bin").write_bytes(os.urandom(200_000))
    (src / "sub" / "private").write_text("secret")
    os.chmod(src / "sub" / "private", 0o600)
    os.symlink("sub/deep/data.bin", src / "link")
    box.files.upload(str(src), f"{WS}/up")
    r = box.exec(f"cd {WS}/up && ./run.sh && stat -c '%a' sub/private && readlink link")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "hi\n600\nsub/deep/data.bin\n"

    out = tmp_path / "back"
    box.files.download(f"{WS}/up", str(out))
    assert _tree(str(out)) == _tree(str(src))

    # An archive, and what the guest's tar thinks of it.
    data = box.files.archive(f"{WS}/up", exclude=["sub/deep"])
    box.files.unarchive(f"{WS}/again", data)
    r = box.exec(f"cd {WS}/again && ls -A . sub")
    assert r.exit_code == 0 and "deep" not in r.stdout and "private" in r.stdout, r.stdout
