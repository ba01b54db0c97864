"""The code interpreter through the real `withruntime==0.35.0` SDK:
`sbx.interpreter.run` (plain and with streaming callbacks), rich results,
errors, timeouts, and `sbx.interpreter.contexts`.

One sandbox serves the module: its kernel starts once (slowly under TCG).
"""
from __future__ import annotations

import base64
import threading

import pytest
from _helpers import poll as _poll
from withruntime import InvalidRequestError, NotFoundError, Sandbox

RUN_MS = 300_000  # the first run starts the kernel


@pytest.fixture(scope="module")
def box(runtime_client):
    b = Sandbox.create(client=runtime_client, timeout_seconds=3600)
    yield b
    try:
        b.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {b.id} failed: {e}")


def test_state_persists_and_values_come_back(box):
    ex = box.interpreter.run("counter = 10\nprint('set')", timeout_ms=RUN_MS)
    assert ex["status"] == "ok", ex
    assert ex["stdout"] == "set\n"
    ex = box.interpreter.run("counter += 5\ncounter")
    assert ex["status"] == "ok", ex
    assert [r["data"]["text/plain"] for r in ex["results"] if r["main"]] == ["15"]
    assert ex["executionCount"] == 2
    assert ex["context"] == "python"


def test_rich_results(box):
    ex = box.interpreter.run("import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()", timeout_ms=RUN_MS)
    assert ex["status"] == "ok", ex
    (fig,) = ex["results"]
    assert not fig["main"]
    assert base64.b64decode(fig["data"]["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert fig["refs"] == {}

    ex = box.interpreter.run("import pandas as pd\npd.DataFrame({'n': [1, 2, 3]})", timeout_ms=RUN_MS)
    (table,) = ex["results"]
    assert table["main"] and "<table" in table["data"]["text/html"], ex

    ex = box.interpreter.run("from IPython.display import display, Markdown\ndisplay(Markdown('# hi'))")
    assert [r["data"].get("text/markdown") for r in ex["results"]] == ["# hi"], ex


def test_streaming_callbacks(box):
    out, err, results, errors = [], [], [], []
    ex = box.interpreter.run(
        "import sys\nprint('one')\nprint('two', file=sys.stderr)\ndisplay({'text/plain': 'raw'}, raw=True)\n"
        "raise KeyError('k')",
        on_stdout=out.append, on_stderr=err.append, on_result=results.append, on_error=errors.append)
    assert "".join(out) == "one\n" and "".join(err) == "two\n", (out, err)
    assert len(results) == 1 and results[0]["data"] == {"text/plain": "raw"} and results[0]["main"] is False, results
    assert len(errors) == 1 and errors[0]["name"] == "KeyError" and "KeyError" in errors[0]["traceback"], errors
    assert ex["status"] == "error" and ex["error"]["name"] == "KeyError", ex


def test_exception(box):
    ex = box.interpreter.run("int('nope')")
    assert ex["status"] == "error", ex
    assert ex["error"]["name"] == "ValueError"
    assert "invalid literal" in ex["error"]["value"]
    assert "int('nope')" in ex["error"]["traceback"]


def test_timeout_interrupts_and_keeps_state(box):
    ex = box.interpreter.run("import time\nkept = 'yes'\ntime.sleep(120)", timeout_ms=3000)
    assert ex["status"] == "timeout", ex
    assert ex["error"]["name"] == "KeyboardInterrupt"
    assert box.interpreter.run("kept")["results"][0]["data"]["text/plain"] == "'yes'"


def test_interrupt_call(box):
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("ex", box.interpreter.run("import time\ntime.sleep(120)",
                                                                                 timeout_ms=0)))
    t.start()
    assert _poll(lambda: box.interpreter.contexts.interrupt("python"), timeout_s=60, interval_s=0.3)
    t.join(90)
    assert done["ex"]["status"] == "interrupted", done


def test_contexts(box):
    made = box.interpreter.contexts.create(id="side", cwd="/tmp", env={"SIDE": "1"})
    assert made["id"] == "side" and made["language"] == "python" and made["cwd"] == "/tmp", made
    ex = box.interpreter.run("import os\nprint(os.getcwd(), os.environ['SIDE'])\n'counter' in dir()",
                             context="side", timeout_ms=RUN_MS)
    assert ex["stdout"] == "/tmp 1\n" and ex["results"][0]["data"]["text/plain"] == "False", ex
    ids = [c["id"] for c in box.interpreter.contexts.list()]
    assert "python" in ids and "side" in ids, ids

    box.interpreter.run("z = 1", context="side")
    restarted = box.interpreter.contexts.restart("side")
    assert restarted["id"] == "side"
    assert box.interpreter.run("z", context="side")["error"]["name"] == "NameError"

    assert box.interpreter.contexts.remove("side") is True
    assert box.interpreter.contexts.remove("side") is False
    with pytest.raises(NotFoundError):
        box.interpreter.run("1", context="side")
    with pytest.raises(InvalidRequestError):
        box.interpreter.contexts.create(language="r")
    with pytest.raises(InvalidRequestError):
        box.interpreter.run("1", language="javascript")


def test_withruntime_e2b_adapter(runtime_client):
    """withruntime's E2B code-interpreter adapter runs on these routes too
    (it runs cells with timeout_ms=0 and interrupt_on_disconnect=False)."""
    from withruntime.e2b.code_interpreter import Sandbox as E2BSandbox

    sbx = E2BSandbox.create(client=runtime_client, runtime_create={"memory_mib": 2048})
    try:
        ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nx = 3\nprint('hi')")
        assert ex.error is None, ex.error
        assert ex.logs.stdout == ["hi\n"], ex.logs
        assert ex.results and ex.results[0].png and not ex.results[0].is_main_result, ex.results
        assert sbx.run_code("x * 2").text == "6"
        assert sbx.run_code("1/0").error.name == "ZeroDivisionError"
        ctx = sbx.create_code_context(cwd="/tmp")
        assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
        assert len(sbx.list_code_contexts()) == 2
        sbx.remove_code_context(ctx)
        assert len(sbx.list_code_contexts()) == 1
    finally:
        sbx.kill()
