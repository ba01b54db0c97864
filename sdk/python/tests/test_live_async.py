"""AsyncSandbox and the async tools against a live server."""
from __future__ import annotations

import asyncio
import hashlib
import os
import uuid

import pytest

from emberbox import AsyncClient, AsyncSandbox, FileNotFoundInSandboxError, NotFoundError
from emberbox.tools import sandbox_tools


def run(coro):
    return asyncio.run(coro)


def test_async_client_surface(server, sbx):
    async def go():
        async with AsyncClient(server.url, server.key) as c:
            box = await AsyncSandbox.connect(sbx.id, client=c)
            assert box.state == "running"
            assert sbx.id in [b.id for b in await AsyncSandbox.list(client=c, labels={"suite": "sdk-python"})]
            await box.refresh()
            r = await box.exec("nproc")
            assert r.ok and r.stdout == "2\n"
            chunks: list[str] = []
            r = await box.exec("for i in 1 2 3; do echo a$i; sleep 0.1; done", on_stdout=chunks.append,
                               timeout=100)
            assert r.ok and "".join(chunks) == "a1\na2\na3\n"
            r = await box.exec("sleep 20", timeout=1)
            assert r.timed_out
            # several commands at once on one connection pool
            outs = await asyncio.gather(*(box.exec(f"echo {i}") for i in range(4)))
            assert [o.stdout for o in outs] == [f"{i}\n" for i in range(4)]

            d = f"/workspace/async-{uuid.uuid4().hex[:6]}"
            await box.files.write(f"{d}/f.txt", "async ✓")
            assert await box.files.read_text(f"{d}/f.txt") == "async ✓"
            assert (await box.files.stat(f"{d}/f.txt"))["exists"]
            assert [e["name"] for e in await box.files.list(d)] == ["f.txt"]
            await box.files.mkdir(f"{d}/sub")
            with pytest.raises(FileNotFoundInSandboxError):
                await box.files.read(f"{d}/none")
            assert await box.files.remove(d, recursive=True)
            assert not await box.files.exists(d)

            p = await box.processes.spawn("echo x; sleep 0.2; echo y")
            assert any(q.id == p.id for q in await box.processes.list())
            res = await box.processes.wait(p.id)
            assert res.exit_code == 0 and res.stdout == "x\ny\n"
            events = [e async for e in box.processes.stream(p.id)]
            assert events[-1].type == "exit"
            longer = await box.processes.spawn("sleep 300")
            await box.processes.signal(longer.id, "SIGKILL")
            assert (await box.processes.wait(longer.id)).exit_code != 0
            await box.extend(3400)
            with pytest.raises(NotFoundError):
                await AsyncSandbox.connect("sbx_missing", client=c)

    run(go())


def test_async_big_file_chunked_upload_roundtrip(server, sbx):
    async def go():
        async with AsyncClient(server.url, server.key) as c:
            box = await AsyncSandbox.connect(sbx.id, client=c)
            d = f"/workspace/async-big-{uuid.uuid4().hex[:6]}"
            blobs = {f"{d}/five.bin": os.urandom(5 << 20), f"{d}/odd.bin": os.urandom((5 << 20) + 99991)}
            # two uploads at once on one client
            await asyncio.gather(*(box.files.write(p, b) for p, b in blobs.items()))
            for p, blob in blobs.items():
                got = await box.files.read(p)
                assert len(got) == len(blob) and hashlib.sha256(got).hexdigest() == hashlib.sha256(blob).hexdigest()
            assert sorted(e["name"] for e in await box.files.list(d)) == ["five.bin", "odd.bin"]
            await box.files.remove(d, recursive=True)

    run(go())


def test_async_tools(server, sbx):
    async def go():
        async with AsyncClient(server.url, server.key) as c:
            box = await AsyncSandbox.connect(sbx.id, client=c)
            ex, rd, wr, ls = sandbox_tools(box)
            d = f"atools-{uuid.uuid4().hex[:6]}"
            assert await wr(f"{d}/hello.py", "print('hi from async')\n") == \
                f"Wrote 23 bytes to /workspace/{d}/hello.py"
            r = await ex("python3 hello.py", cwd=d)
            assert r == {"exit_code": 0, "stdout": "hi from async\n", "stderr": "", "timed_out": False}
            assert await rd(f"{d}/hello.py") == "print('hi from async')\n"
            assert await rd(f"{d}/nope.py") == f"No such file: /workspace/{d}/nope.py"
            assert await ls(d) == [{"path": f"/workspace/{d}/hello.py", "type": "file", "size": 23}]
            r = await ex("sleep 10", timeout_seconds=1)
            assert r["timed_out"] is True and r["exit_code"] is None
            await ex(f"rm -rf /workspace/{d}")

    run(go())


def test_async_create_and_delete(server, created):
    async def go():
        async with AsyncClient(server.url, server.key) as c:
            async with await AsyncSandbox.create(client=c, timeout_seconds=600, memory_mib=1024,
                                                 delete_on_exit=True, labels={"suite": "sdk-python"}) as box:
                created.append(box.id)
                assert (await box.exec("echo async-vm")).stdout == "async-vm\n"
            with pytest.raises(NotFoundError):
                await box.refresh()

    run(go())
