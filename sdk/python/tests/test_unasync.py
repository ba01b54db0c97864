"""The sync modules are generated from the async ones by scripts/unasync.py: these tests
fail when a committed generated module is stale, and pin the generator's rules."""
from __future__ import annotations

import difflib
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "unasync.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("emberbox_unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


U = _load_generator()


@pytest.mark.parametrize("twin", U.TWINS, ids=lambda t: t.target)
def test_generated_module_is_current(twin):
    path = U.PKG / twin.target
    want = U.generate(twin)
    have = path.read_text(encoding="utf-8") if path.exists() else ""
    if have != want:
        diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                            f"{twin.target} (committed)", f"{twin.target} (generated)"))
        pytest.fail(f"src/emberbox/{twin.target} is stale or was edited by hand; it is generated from "
                    f"{twin.source}. Regenerate it with:\n\n    {U.COMMAND}\n\n{diff[:4000]}", pytrace=False)


def test_every_async_module_has_a_generated_twin():
    assert {p.name for p in U.PKG.glob("_async_*.py")} == {t.source for t in U.TWINS}


def _sync(src: str, text=()) -> str:
    return U.unasync(textwrap.dedent(src), text)


def test_keywords_names_and_needless_parentheses():
    got = _sync('''
        import asyncio
        from contextlib import asynccontextmanager
        from ._async_sandbox import AsyncSandbox

        class AsyncThing(AsyncSandbox):
            """An AsyncThing; see _async_sandbox."""
            async def __aenter__(self) -> AsyncThing:
                return self

            async def text(self) -> str:
                await asyncio.sleep(1)
                async with self.client.stream() as r:  # AsyncThing comment
                    async for line in r.aiter_lines():
                        pass
                await self.aclose()
                return (await self.read()).decode() + str(await self.n()) + f"{self!r}: AsyncThing"
    ''')
    assert got == textwrap.dedent('''
        import time
        from contextlib import contextmanager
        from ._sandbox import Sandbox

        class Thing(Sandbox):
            """An Thing; see _sandbox."""
            def __enter__(self) -> Thing:
                return self

            def text(self) -> str:
                time.sleep(1)
                with self.client.stream() as r:  # Thing comment
                    for line in r.iter_lines():
                        pass
                self.close()
                return self.read().decode() + str(self.n()) + f"{self!r}: Thing"
    ''')


def test_parentheses_kept_where_they_group_more_than_one_primary():
    assert _sync("x = (await a() + b).c\n") == "x = (a() + b).c\n"


def test_continuation_lines_follow_their_bracket():
    got = _sync('''
        async def f(a: int,
                    b: int) -> None:
            r = await g(a,
                        b, h(1,
                             2))
            s = await g(
                a)
    ''')
    assert got == textwrap.dedent('''
        def f(a: int,
              b: int) -> None:
            r = g(a,
                  b, h(1,
                       2))
            s = g(
                a)
    ''')


def test_import_asyncio_goes_when_time_is_imported_and_relative_imports_stay_sorted():
    got = _sync('''
        import asyncio
        import time
        from ._async_client import AsyncClient
        from ._errors import E
    ''')
    assert got == textwrap.dedent('''
        import time
        from ._client import Client
        from ._errors import E
    ''')


def test_text_replacements_must_match_once():
    src = '"""AsyncX: the asyncio one."""\n'
    assert _sync(src, [('"""AsyncX: the asyncio one."""', '"""X: the sync one."""')]) == '"""X: the sync one."""\n'
    with pytest.raises(U.GenerationError, match="matches 0 times"):
        _sync(src, [("not there", "x")])


@pytest.mark.parametrize("src", [
    "async def f():\n    await asyncio.gather(a(), b())\n",  # asyncio beyond sleep
    '"""The asyncio twin."""\n',  # prose that needs a text replacement
])
def test_leftover_async_words_stop_the_generator(src):
    with pytest.raises(U.GenerationError, match="still says"):
        _sync(src)
