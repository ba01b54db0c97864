#!/usr/bin/env python3
"""Generates the SDK's synchronous modules from their hand-written asyncio twins.

    python3 sdk/python/scripts/unasync.py           # rewrite the generated modules
    python3 sdk/python/scripts/unasync.py --check   # exit 1 and show a diff if one is stale

Only the async modules (`TWINS` below: `_async_*.py`) are edited by hand; each sync
module is generated from one, and tests/test_unasync.py fails when a committed one is
stale. The rules, in the order they apply:

1. Text replacements. The few sentences that must say something else in the sync
   module (module and class docstrings, mostly) are listed per module in `TWINS` as
   (async source text, sync text). Each must occur exactly once in the source, so an
   edit that makes one stale stops the generator instead of being skipped silently.
   The sync text goes through the rules below too, which leave plain sync text alone.
2. Keywords, on Python tokens (so strings and comments are never taken for code):
   `async` (of `async def`, `async with`, `async for`) and `await` are dropped, and an
   `(await x.f())` that was parenthesised only for the `await` loses the parentheses.
3. Names, in code and as whole words in strings and comments: `AsyncX` becomes `X` for
   a capitalised X (AsyncSandbox, AsyncClient, AsyncIterator, httpx's
   AsyncBaseTransport), `_async_x` becomes `_x` (modules), `async_x` becomes `x`
   (functions), and the few in `NAMES` (`__aenter__`, `aclose`, `aiter_lines`,
   `asynccontextmanager`, ...) become their sync names.
4. `asyncio.sleep` becomes `time.sleep`, and `import asyncio` becomes `import time` (or
   goes, if the module imports time already). Where asyncio and threads genuinely
   differ, the code belongs in the hand-written twins of `_concurrency.py`, which the
   async modules call by their `async_` names.
5. Layout: a continuation line aligned with an opening bracket moves with the bracket
   when the text before it got shorter, and each run of one-line `from .x import y`
   lines is sorted again (renamed modules move).

Last, the generated module must not mention async, await, asyncio or coroutines
anywhere (code, strings or comments; an `await` inside an f-string's braces is not
rewritten, so await into a variable first). If it does, the generator stops and names
the line: add a text replacement, or move the code into `_concurrency.py`.
"""
from __future__ import annotations

import argparse
import difflib
import io
import keyword
import re
import sys
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SDK = Path(__file__).resolve().parents[1]
PKG = SDK / "src" / "emberbox"
COMMAND = "python3 sdk/python/scripts/unasync.py"


class GenerationError(Exception):
    """The source cannot be turned into its sync twin by these rules."""


@dataclass(frozen=True)
class Twin:
    """A hand-written async module under src/emberbox and the sync module generated from it."""

    source: str
    target: str
    text: tuple[tuple[str, str], ...] = ()


# Names whose sync twin is not found by the AsyncX / _async_x / async_x rules.
NAMES = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "aclose": "close",
    "aread": "read",
    "aiter_bytes": "iter_bytes",
    "aiter_lines": "iter_lines",
    "aiter_raw": "iter_raw",
    "aiter_text": "iter_text",
    "asynccontextmanager": "contextmanager",
    "StopAsyncIteration": "StopIteration",
}

_CLIENT_DOC = '''"""A synchronous connection to an Emberbox server.

    Args:
        api_url: server origin; defaults to EMBERBOX_API_URL, RUNTIME_API_URL, then http://127.0.0.1:8080.
        api_key: bearer key; defaults to EMBERBOX_API_KEY, then RUNTIME_API_KEY.
        timeout: default read timeout of a call, in seconds.
        max_retries: retries of transport errors and 429/502/503/504 answers (same idempotency key).
        backoff: base of the exponential backoff, in seconds.
        transport: an httpx transport (tests pass httpx.MockTransport).
    """'''

TWINS: tuple[Twin, ...] = (
    Twin("_async_client.py", "_client.py", text=(
        ('"""AsyncClient: the asyncio HTTP client. The sync Client (_client.py) is generated from this\n'
         'module by scripts/unasync.py."""',
         '"""Client: the synchronous HTTP client, with retries under one idempotency key per call."""'),
        ('"""The asyncio twin of `Client` (same arguments)."""', _CLIENT_DOC),
    )),
    Twin("_async_sandbox.py", "_sandbox.py", text=(
        ('"""AsyncSandbox: the asyncio twin of Sandbox (same methods, awaited). The sync Sandbox\n'
         '(_sandbox.py) is generated from this module by scripts/unasync.py."""',
         '"""The synchronous Sandbox, with its `files`, `processes` and `interpreter` helpers."""'),
        ("once; any failure (or cancellation) aborts the upload. A larger file outside\n"
         "        /workspace (which the server's uploads refuse) goes up as 1 MiB part files that\n"
         "        a command in the sandbox joins.",
         "once; any failure aborts the upload. A larger file outside /workspace (which the\n"
         "        server's uploads refuse) goes up as 1 MiB part files that a command in the\n"
         "        sandbox joins."),
    )),
    Twin("_async_interpreter.py", "_interpreter.py", text=(
        ('"""AsyncInterpreter: a sandbox\'s stateful code interpreter (`sbx.interpreter`, and\n'
         '`sbx.run_code`), over asyncio. The sync Interpreter (_interpreter.py) is generated from\n'
         'this module by scripts/unasync.py; the wire contract is described in _execution.py."""',
         '"""Interpreter: a sandbox\'s stateful code interpreter (`sbx.interpreter`, and `sbx.run_code`).\n'
         'The wire contract is described in _execution.py."""'),
    )),
    Twin("_async_tools.py", "_tools.py", text=(
        ('"""async_sandbox_tools: the four agent tools as coroutine functions bound to an AsyncSandbox\n'
         '(see tools.py). The sync factory (_tools.py) is generated from this module by\n'
         'scripts/unasync.py.',
         '"""The four agent tools as plain functions bound to a Sandbox (see tools.py).'),
        ('"""The four tools as coroutine functions bound to an AsyncSandbox, and runtime_undo fifth\n'
         '    with undo=True (see tools.sandbox_tools)."""',
         '"""The four tools as plain functions bound to a Sandbox, and runtime_undo fifth with\n'
         '    undo=True (`tools.sandbox_tools` checks the type of the sandbox and calls this one for a\n'
         '    Sandbox)."""'),
    )),
)

_FORBIDDEN = re.compile(r"\b(async|await|asyncio|coroutines?)\b", re.IGNORECASE)
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_OPEN, _CLOSE = "([{", ")]}"


def rename(name: str) -> str:
    """The sync twin of an identifier (itself if it has none)."""
    if name in NAMES:
        return NAMES[name]
    if m := re.fullmatch(r"Async([A-Z]\w*)", name):
        return m.group(1)
    if m := re.fullmatch(r"(_?)async_(\w+)", name):
        return m.group(1) + m.group(2)
    return name


def _rename_words(text: str) -> str:
    return _WORD.sub(lambda m: rename(m.group(0)), text)


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    """The source's tokens, an f-string (split up from Python 3.12 on) kept as one STRING."""
    out: list[tokenize.TokenInfo] = []
    depth, start = 0, None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tokenize.tok_name[tok.type]
        if kind == "FSTRING_START":
            depth += 1
            start = start or tok
        elif kind == "FSTRING_END":
            depth -= 1
            if depth == 0 and start is not None:
                out.append(tokenize.TokenInfo(tokenize.STRING, "", start.start, tok.end, start.line))
                start = None
        elif depth == 0:
            out.append(tok)
    return out


def _primary(toks: Sequence[tokenize.TokenInfo]) -> bool:
    """True if the tokens (those after an `await`) form one primary, such as `self.f(x)[0]`:
    names and dots outside brackets, nothing else. Parentheses around one are needless
    once the `await` is gone."""
    depth = 0
    for tok in toks:
        if tok.type == tokenize.OP and tok.string in _OPEN:
            depth += 1
        elif tok.type == tokenize.OP and tok.string in _CLOSE:
            depth -= 1
        elif depth == 0:
            name = tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)
            dot = tok.type == tokenize.OP and tok.string == "."
            if not (name or dot):
                return False
    return depth == 0


def _is_call(before: tokenize.TokenInfo | None) -> bool:
    """True if a `(` after this token opens a call's arguments, not a parenthesised expression."""
    if before is None:
        return False
    if before.type == tokenize.NAME:
        return not keyword.iskeyword(before.string) or before.string in ("True", "False", "None")
    return before.type == tokenize.STRING or (before.type == tokenize.OP and before.string in _CLOSE)


def _matching(toks: Sequence[tokenize.TokenInfo], i: int) -> int:
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].type == tokenize.OP and toks[j].string in _OPEN:
            depth += 1
        elif toks[j].type == tokenize.OP and toks[j].string in _CLOSE:
            depth -= 1
            if depth == 0:
                return j
    raise GenerationError(f"line {toks[i].start[0]}: unbalanced bracket")


def _emit(out: list[str], s: str, col: int) -> int:
    """Appends s; returns the column the output has then reached."""
    out.append(s)
    return len(s) - s.rindex("\n") - 1 if "\n" in s else col + len(s)


def unasync(source: str, text: Sequence[tuple[str, str]] = (), name: str = "<source>") -> str:
    """The sync twin of an async module's source, by the rules in this script's docstring."""
    for old, new in text:
        if source.count(old) != 1:
            raise GenerationError(f"{name}: the text replacement starting {old[:60]!r} matches "
                                  f"{source.count(old)} times, not once; update it in scripts/unasync.py")
        source = source.replace(old, new)

    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    toks = _tokens(source)
    dropped: set[int] = set()
    for i, tok in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if tok.type == tokenize.NAME and tok.string == "async" and nxt and nxt.string in ("def", "with", "for"):
            dropped.add(i)
        elif tok.type == tokenize.NAME and tok.string == "await":
            dropped.add(i)
        elif (tok.type == tokenize.OP and tok.string == "(" and nxt and nxt.string == "await"
              and not _is_call(toks[i - 1] if i else None)):
            j = _matching(toks, i)
            if toks[j].start[0] == tok.start[0] and _primary(toks[i + 2:j]):
                dropped.update((i, j))

    out: list[str] = []
    col = 0  # the column the output has reached on its current line
    brackets: list[tuple[int, int]] = []  # open brackets: (source column, output column)
    prev_end = (1, 0)
    skip_gap = False
    for i, tok in enumerate(toks):
        gap = source[offset(prev_end):offset(tok.start)]
        prev_end = tok.end
        if skip_gap and "\n" not in gap:
            gap = ""
        skip_gap = False
        if (brackets and tok.start[0] != toks[i - 1].end[0] and gap.strip(" ") == ""
                and tok.start[1] == brackets[-1][0] + 1):
            gap = " " * (brackets[-1][1] + 1)  # a continuation line aligned with its bracket
        piece = source[offset(tok.start):offset(tok.end)]
        if i in dropped:
            piece = ""
            skip_gap = tok.string in ("async", "await")  # and the space after it
        elif tok.type == tokenize.NAME:
            nxt = toks[i + 1] if i + 1 < len(toks) else None
            after = toks[i + 2] if i + 2 < len(toks) else None
            if tok.string == "asyncio" and nxt and nxt.string == "." and after and after.string == "sleep":
                piece = "time"
            else:
                piece = rename(piece)
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            piece = _rename_words(piece)
        col = _emit(out, gap, col)
        if tok.type == tokenize.OP and i not in dropped:
            if tok.string in _OPEN:
                brackets.append((tok.start[1], col))
            elif tok.string in _CLOSE and brackets:
                brackets.pop()
        col = _emit(out, piece, col)
    result = "".join(out)

    result = _sort_relative_imports(result)
    if re.search(r"^import time$", result, re.MULTILINE):
        result = re.sub(r"^import asyncio\n", "", result, flags=re.MULTILINE)
    else:
        result = re.sub(r"^import asyncio$", "import time", result, flags=re.MULTILINE)
    for n, line in enumerate(result.splitlines(), 1):
        if m := _FORBIDDEN.search(line):
            raise GenerationError(
                f"{name}: line {n} of the sync output still says {m.group(0)!r}: {line.strip()!r}. Add a text "
                f"replacement in scripts/unasync.py, or move asyncio-only code into _concurrency.py")
    return result


def _sort_relative_imports(text: str) -> str:
    """Sorts each run of one-line `from .x import y` lines by module: a renamed module
    (`._async_sandbox` to `._sandbox`) may have moved out of order."""
    lines = text.splitlines(keepends=True)
    one_line = re.compile(r"from \.\S* import [^(\n]*\n")
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and one_line.fullmatch(lines[j]):
            j += 1
        lines[i:j] = sorted(lines[i:j], key=lambda line: line.split()[1])
        i = max(j, i + 1)
    return "".join(lines)


def header(twin: Twin) -> str:
    return (f"# Generated from {twin.source} by scripts/unasync.py: do not edit by hand.\n"
            f"# Edit {twin.source}, then regenerate: {COMMAND}\n")


def generate(twin: Twin) -> str:
    """The text the generated module should have."""
    return header(twin) + unasync((PKG / twin.source).read_text(encoding="utf-8"), twin.text, twin.source)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated module is stale")
    args = ap.parse_args(argv)
    stale = 0
    for twin in TWINS:
        path = PKG / twin.target
        want = generate(twin)
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have == want:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                       f"{twin.target} (committed)", f"{twin.target} (generated)"))
        else:
            path.write_text(want, encoding="utf-8")
            print(f"wrote src/emberbox/{twin.target}")
    if stale:
        print(f"{stale} generated module(s) stale; run: {COMMAND}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
