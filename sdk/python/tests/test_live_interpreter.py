"""Sandbox.run_code and interpreter contexts against a live server (Runtime's
interpreter API: IPython kernels in the sandbox, with matplotlib and pandas in the image)."""
from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from io import BytesIO

import pytest

from emberbox import (
    AsyncClient,
    AsyncSandbox,
    ConflictError,
    Context,
    Execution,
    ExecutionError,
    NotFoundError,
    Result,
)


@pytest.fixture(scope="module")
def ctx(sbx):
    """A context of this module's own, so state from other tests cannot leak in."""
    c = sbx.interpreter.contexts.create(language="python", cwd="/workspace")
    yield c
    try:
        sbx.interpreter.contexts.remove(c)
    except NotFoundError:
        pass


def _png_size(b64: str) -> tuple[int, int]:
    PIL = pytest.importorskip("PIL.Image")
    raw = base64.b64decode(b64)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")
    return PIL.open(BytesIO(raw)).size


def test_state_persists_across_runs_and_counts_go_up(sbx, ctx):
    first = sbx.run_code("x = 41\nimport math", context=ctx, timeout=120)
    assert isinstance(first, Execution) and first.error is None and first.status == "ok"
    assert first.text is None  # an assignment has no value
    second = sbx.run_code("x + 1", context=ctx)
    assert second.text == "42" and second.main_result is not None and second.main_result.is_main_result
    assert second.execution_count is not None and first.execution_count is not None
    assert second.execution_count > first.execution_count
    third = sbx.run_code("print('pi is', round(math.pi, 2))\nx", context=ctx)
    assert third.logs.stdout == ["pi is 3.14\n"] and third.text == "41"


def test_default_context_without_one(sbx):
    marker = uuid.uuid4().hex[:8]
    sbx.run_code(f"default_marker = {marker!r}", timeout=120)
    assert sbx.run_code("default_marker").text == repr(marker)


def test_matplotlib_chart_comes_back_as_png(sbx, ctx):
    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 3), dpi=50)\n"
        "ax.plot([1, 2, 3], [1, 4, 9])\n"
        "ax.set_title('squares')\n"
        "fig", context=ctx, timeout=120)
    assert ex.error is None, ex.error
    main = ex.main_result
    assert main is not None and main.png is not None, ex.results
    width, height = _png_size(main.png)  # the inline backend trims the figure's margins
    assert 100 <= width <= 200 and 75 <= height <= 150, (width, height)
    assert "png" in main.formats()
    # plt.show() draws as a display (not the cell's value)
    shown = sbx.run_code("fig2, ax2 = plt.subplots()\nax2.bar(['a', 'b'], [3, 5])\nplt.show()", context=ctx)
    assert shown.error is None and shown.main_result is None
    assert any(r.png and not r.is_main_result for r in shown.results), shown.results


def test_pandas_table_is_html_and_text(sbx, ctx):
    ex = sbx.run_code("import pandas as pd\n"
                      "df = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3, 19]})\n"
                      "df", context=ctx, timeout=120)
    assert ex.error is None, ex.error
    main = ex.main_result
    assert main is not None and main.html is not None and "<table" in main.html and "Oslo" in main.html
    assert "city" in (main.text or "") and "Lima" in (main.text or "")
    assert sbx.run_code("int(df['temp'].sum())", context=ctx).text == "22"


def test_display_results_and_json(sbx, ctx):
    ex = sbx.run_code("from IPython.display import HTML, JSON, display\n"
                      "display(HTML('<b>hi</b>'))\n"
                      "display(JSON({'k': [1, 2]}))\n"
                      "7", context=ctx)
    assert ex.error is None, ex.error
    html = [r for r in ex.results if r.html and "<b>hi</b>" in r.html]
    assert html and not html[0].is_main_result
    js = [r for r in ex.results if r.json is not None]
    assert js and js[0].json == {"k": [1, 2]}
    assert ex.text == "7"


def test_errors_come_back_in_the_execution(sbx, ctx):
    ex = sbx.run_code("print('before')\n1 / 0", context=ctx)
    assert ex.status == "error" and isinstance(ex.error, ExecutionError)
    assert ex.error.name == "ZeroDivisionError" and "division by zero" in ex.error.value
    assert "ZeroDivisionError" in ex.error.plain_traceback
    assert ex.stdout == "before\n"
    assert sbx.run_code("x", context=ctx).text == "41"  # state survives an error


def test_streaming_callbacks(sbx, ctx):
    got: list[tuple[str, object]] = []
    ex = sbx.run_code(
        "import sys, time\n"
        "for i in range(3):\n"
        "    print('tick', i, flush=True)\n"
        "    time.sleep(0.2)\n"
        "print('oops', file=sys.stderr)\n"
        "from IPython.display import display, Markdown\n"
        "display(Markdown('**md**'))\n"
        "raise KeyError('k')",
        context=ctx, timeout=120,
        on_stdout=lambda t: got.append(("out", t)), on_stderr=lambda t: got.append(("err", t)),
        on_result=lambda r: got.append(("result", r)), on_error=lambda e: got.append(("error", e)))
    assert "".join(t for k, t in got if k == "out") == "tick 0\ntick 1\ntick 2\n"  # type: ignore[misc]
    assert "".join(t for k, t in got if k == "err") == "oops\n"  # type: ignore[misc]
    results = [r for k, r in got if k == "result"]
    assert len(results) == 1 and isinstance(results[0], Result) and results[0].markdown == "**md**"
    errors = [e for k, e in got if k == "error"]
    assert len(errors) == 1 and errors[0].name == "KeyError"  # type: ignore[union-attr]
    assert ex.error is not None and ex.error.name == "KeyError" and ex.stdout == "tick 0\ntick 1\ntick 2\n"


def test_timeout_interrupts_and_keeps_state(sbx, ctx):
    sbx.run_code("kept_after_timeout = 'yes'", context=ctx)
    started = time.monotonic()
    ex = sbx.run_code("import time\nwhile True:\n    time.sleep(0.05)", context=ctx, timeout=2)
    assert ex.status == "timeout" and ex.timed_out
    assert time.monotonic() - started < 60
    assert sbx.run_code("kept_after_timeout", context=ctx).text == "'yes'"


def test_env_for_one_run(sbx, ctx):
    code = "import os, subprocess\n(os.environ.get('EMBERBOX_RUN_ENV'), subprocess.run(['sh', '-c', 'echo $EMBERBOX_RUN_ENV'], capture_output=True, text=True).stdout)"
    ex = sbx.run_code(code, context=ctx, env={"EMBERBOX_RUN_ENV": "just this run"})
    assert ex.text == "('just this run', 'just this run\\n')"
    assert sbx.run_code(code, context=ctx).text == "(None, '\\n')"


def test_contexts_are_isolated_and_managed(sbx):
    contexts = sbx.interpreter.contexts
    a = contexts.create(language="python", cwd="/tmp", env={"CTX_ENV": "a-env"})
    b = contexts.create()
    try:
        assert isinstance(a, Context) and a.id and a.id != b.id and a.language == "python"
        assert sbx.run_code("import os\n(os.getcwd(), os.environ['CTX_ENV'])", context=a, timeout=120).text == \
            "('/tmp', 'a-env')"
        sbx.run_code("only_in_a = 1", context=a)
        missing = sbx.run_code("only_in_a", context=b, timeout=120)
        assert missing.error is not None and missing.error.name == "NameError"
        ids = [c.id for c in contexts.list()]
        assert a.id in ids and b.id in ids

        restarted = contexts.restart(a)
        assert restarted.id == a.id
        gone = sbx.run_code("only_in_a", context=a, timeout=120)
        assert gone.error is not None and gone.error.name == "NameError"

        # interrupt a running cell: it ends as interrupted, the state stays
        sbx.run_code("before_interrupt = 5", context=b)
        box: dict[str, Execution] = {}
        t = threading.Thread(target=lambda: box.setdefault("ex", sbx.run_code(
            "import time\nfor _ in range(1200):\n    time.sleep(0.05)", context=b, timeout=300)))
        t.start()
        deadline = time.monotonic() + 50  # the cell would run 60 s
        while t.is_alive():  # until the cell has started, an interrupt has nothing to stop
            assert time.monotonic() < deadline, "interrupt did not stop the cell"
            try:
                contexts.interrupt(b)
            except ConflictError:  # nothing running yet, if the server says so by status
                pass
            t.join(0.5)
        assert box["ex"].status == "interrupted" and box["ex"].error is not None
        assert box["ex"].error.name == "KeyboardInterrupt"
        assert sbx.run_code("before_interrupt", context=b).text == "5"

        assert contexts.remove(a) is True
        assert a.id not in [c.id for c in contexts.list()]
    finally:
        for c in (a, b):
            try:
                contexts.remove(c)
            except NotFoundError:
                pass


def test_async_run_code(server, sbx):
    async def go():
        async with AsyncClient(server.url, server.key) as c:
            box = await AsyncSandbox.connect(sbx.id, client=c)
            ctx = await box.interpreter.contexts.create()
            try:
                chunks: list[str] = []

                async def on_stdout(text: str) -> None:
                    chunks.append(text)

                await box.run_code("n = 6", context=ctx, timeout=120)
                ex = await box.run_code("print('async')\nn * 7", context=ctx, on_stdout=on_stdout)
                return ex, chunks
            finally:
                await box.interpreter.contexts.remove(ctx)

    ex, chunks = asyncio.run(go())
    assert ex.text == "42" and "".join(chunks) == "async\n"
