"""smolagents runs against a live sandbox, with scripted models (no LLM):
ToolCallingAgent with our four tools and with withruntime's, and a CodeAgent
with SandboxExecutor."""
from __future__ import annotations

import ast
import re
import uuid

import pytest

smolagents = pytest.importorskip("smolagents")
from smolagents import CodeAgent, ToolCallingAgent, tool  # noqa: E402
from smolagents.monitoring import LogLevel  # noqa: E402
from smolagents.utils import AgentExecutionError  # noqa: E402

from _scripted import ScriptedModel, call, last_observation  # noqa: E402
from emberbox.tools import sandbox_tools  # noqa: E402


def _observations(agent) -> list[str]:
    return [getattr(s, "observations", None) or "" for s in agent.memory.steps]


def _product_page_run(tools) -> tuple[object, ToolCallingAgent]:
    model = ScriptedModel([
        call("runtime_exec", command="nproc && free -m"),
        lambda msgs: call("final_answer", answer=_summarise(last_observation(msgs))),
    ])
    agent = ToolCallingAgent(tools=tools, model=model, verbosity_level=LogLevel.OFF, max_steps=4)
    return agent.run("How many CPUs and how much memory does the sandbox have?", return_full_result=True), agent


def _summarise(observation: str) -> str:
    cpus = re.search(r"'stdout': '(\d+)\\n", observation)
    mem = re.search(r"Mem:\s+(\d+)", observation)
    return f"{cpus.group(1) if cpus else '?'} CPUs, {mem.group(1) if mem else '?'} MiB memory"


def _check_product_page(result, agent) -> None:
    assert result.state == "success", result
    obs = _observations(agent)
    first = next(o for o in obs if "exit_code" in o)
    assert "'exit_code': 0" in first, first
    assert re.search(r"'stdout': '2\\n", first), first
    assert result.output.startswith("2 CPUs, "), result.output


def test_product_page_tool_calling_run(sbx):
    result, agent = _product_page_run([tool(f) for f in sandbox_tools(sbx)])
    _check_product_page(result, agent)


def test_multi_step_tool_run_keeps_state(sbx):
    d = f"proj-{uuid.uuid4().hex[:6]}"
    module = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
    tests = ("import unittest\n\nfrom calc import add, mul\n\n\nclass T(unittest.TestCase):\n"
             "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
             "    def test_mul(self):\n        self.assertEqual(mul(4, 5), 20)\n")

    def final(msgs):
        obs = last_observation(msgs)
        ran = re.search(r"Ran (\d+) tests", obs)
        return call("final_answer", answer={"tests_run": int(ran.group(1)) if ran else None,
                                            "passed": "OK" in obs})

    model = ScriptedModel([
        call("runtime_write_file", path=f"{d}/calc.py", content=module),
        call("runtime_write_file", path=f"{d}/test_calc.py", content=tests),
        call("runtime_exec", command="python3 -c 'import calc; print(calc.add(20, 22))'", cwd=d),
        call("runtime_list_files", path=d),
        call("runtime_exec", command="python3 -m unittest -v 2>&1", cwd=d),
        final,
    ])
    agent = ToolCallingAgent(tools=[tool(f) for f in sandbox_tools(sbx)], model=model,
                             verbosity_level=LogLevel.OFF, max_steps=8)
    result = agent.run("Write a module with tests, import it, then run the tests.", return_full_result=True)
    assert result.state == "success"
    obs = _observations(agent)
    assert any(f"Wrote {len(module)} bytes to /workspace/{d}/calc.py" in o for o in obs), obs
    assert any("'stdout': '42\\n'" in o for o in obs), obs
    listing = next(o for o in obs if "test_calc.py" in o and "'type': 'file'" in o)
    assert f"/workspace/{d}/calc.py" in listing
    assert result.output == {"tests_run": 2, "passed": True}


def test_withruntime_tools_same_run(server, sbx):
    withruntime = pytest.importorskip("withruntime")
    from withruntime.tools import sandbox_tools as wr_sandbox_tools

    assert withruntime.__version__ == "0.35.0" if hasattr(withruntime, "__version__") else True
    rt = withruntime.Runtime(api_key=server.key, base_url=server.url)
    try:
        wsbx = withruntime.Sandbox.connect(sbx.id, client=rt)
        result, agent = _product_page_run([tool(f) for f in wr_sandbox_tools(wsbx)])
        _check_product_page(result, agent)
    finally:
        rt.close()


# --- CodeAgent + SandboxExecutor ---------------------------------------------
def _code(src: str) -> str:
    return f"Thought: next step.\n<code>\n{src}\n</code>"


def test_code_agent_with_sandbox_executor(sbx):
    from emberbox.smolagents import SandboxExecutor

    model = ScriptedModel([
        _code("import json\nimport statistics\nx = 21\nprint('x is', x)"),
        _code("y = x * 2\nprint('y is', y)\ny"),
        _code("print('about to fail')\nraise ValueError('deliberate failure ' + json.dumps({'y': y}))"),
        _code("m = statistics.mean([y, x])\nprint('mean', m)"),
        _code("final_answer({'y': y, 'mean': m, 'items': [1, 2, 3], 'nested': {'ok': True, 'none': None}})"),
    ])
    executor = SandboxExecutor(sandbox=sbx, timeout_seconds=60)
    agent = CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF, max_steps=8)
    try:
        result = agent.run("Compute things step by step.", return_full_result=True)
    finally:
        agent.cleanup()
    assert executor.sandbox is None  # cleaned up, but a given sandbox stays running
    assert sbx.refresh().state == "running"

    assert result.state == "success", result
    assert result.output == {"y": 42, "mean": 31.5, "items": [1, 2, 3], "nested": {"ok": True, "none": None}}
    steps = [s for s in agent.memory.steps if hasattr(s, "code_action")]
    assert "x is 21" in steps[0].observations
    assert "y is 42" in steps[1].observations and "Last output from code snippet:\n42" in steps[1].observations
    err = steps[2].error
    assert isinstance(err, AgentExecutionError), steps[2]
    assert "ValueError: deliberate failure {\"y\": 42}" in str(err)
    assert "about to fail" in str(err) and "Traceback" in str(err)
    assert "mean 31.5" in steps[3].observations  # import from step 1 still there after the error
    assert steps[4].is_final_answer


def test_code_agent_chart_step_comes_back_as_a_pil_image(sbx):
    """As with smolagents' E2BExecutor: a step whose value is a matplotlib figure is a PIL
    image in the agent's memory, a DataFrame is its HTML, and an image made in the sandbox
    can be the final answer."""
    PIL = pytest.importorskip("PIL.Image")
    from emberbox.smolagents import SandboxExecutor

    model = ScriptedModel([
        _code("import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3), dpi=50)\n"
              "ax.plot([1, 2, 3], [2, 4, 8])\nprint('drew', len(ax.lines), 'line')\nfig"),
        _code("import pandas as pd\npd.DataFrame({'n': [1, 2], 'sq': [1, 4]})"),
        _code("from PIL import Image\nfinal_answer(Image.new('RGB', (3, 2), (10, 20, 30)))"),
    ])
    executor = SandboxExecutor(sandbox=sbx, timeout_seconds=120)
    agent = CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF, max_steps=5)
    try:
        result = agent.run("Draw a chart, show a table, then answer with an image.", return_full_result=True)
    finally:
        agent.cleanup()
    assert result.state == "success", result
    steps = [s for s in agent.memory.steps if hasattr(s, "code_action")]
    chart = steps[0].action_output
    assert isinstance(chart, PIL.Image), steps[0]
    assert chart.width > 50 and chart.height > 50
    assert "drew 1 line" in steps[0].observations
    assert "Last output from code snippet:\n<PIL." in steps[0].observations
    table = steps[1].action_output
    assert isinstance(table, str) and "<table" in table and "sq" in table
    # smolagents wraps an image answer in an AgentImage, whose pixels are in to_raw().
    answer = result.output.to_raw() if hasattr(result.output, "to_raw") else result.output
    assert isinstance(answer, PIL.Image) and answer.size == (3, 2)
    assert answer.convert("RGB").getpixel((0, 0)) == (10, 20, 30)


def test_executor_tuple_set_and_variables_cross_as_safe_json(sbx):
    from emberbox.smolagents import SandboxExecutor

    model = ScriptedModel([
        _code("final_answer({'seed_plus': seed + 1, 'pair': pair, 'tags': tags})"),
    ])
    executor = SandboxExecutor(sandbox=sbx, timeout_seconds=60)
    with CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF) as agent:
        out = agent.run("go", additional_args={"seed": 41, "pair": (1, "a"), "tags": {"x"}})
    assert out == {"seed_plus": 42, "pair": (1, "a"), "tags": {"x"}}


def test_executor_step_timeout_and_kernel_restart(sbx):
    from smolagents.utils import AgentError

    from emberbox.smolagents import SandboxExecutor

    ex = SandboxExecutor(sandbox=sbx, timeout_seconds=3)
    try:
        ex("kept = 'still here'")
        with pytest.raises(AgentError, match="TimeoutError: The code step did not finish within 3 s"):
            ex("import time\nfor _ in range(1000):\n    time.sleep(0.05)")
        assert ex("kept").output == "'still here'"  # an interrupted step keeps the state
        with pytest.raises(AgentError, match="exited while running this step"):
            ex("import os\nos._exit(7)")
        assert ex("1 + 1").output == "2"  # restarted
        with pytest.raises(AgentError, match="NameError"):
            ex("kept")
    finally:
        ex.cleanup()


def test_executor_additional_imports_preinstalled_numpy_without_network(sbx):
    from emberbox.smolagents import SandboxExecutor

    ex = SandboxExecutor(["numpy", "pillow", "PIL.*"], sandbox=sbx, timeout_seconds=60)
    try:
        assert ex("import numpy as np\nint(np.arange(4).sum())").output == "6"
    finally:
        ex.cleanup()


def test_executor_pip_installs_additional_imports(sbx):
    """A package that is not in the image is pip-installed from PyPI first (through the egress proxy)."""
    from emberbox.smolagents import SandboxExecutor

    probe = sbx.exec(["python3", "-c", "import humanize"])
    assert probe.exit_code != 0, "humanize is already in the image; pick another package for this test"
    try:
        ex = SandboxExecutor(["humanize"], sandbox=sbx, timeout_seconds=120)
    except Exception as e:  # PyPI unreachable from this host: say so instead of failing
        if "network" in str(e).lower() and not _pypi_reachable():
            pytest.skip(f"PyPI is not reachable from this host: {e}")
        raise
    try:
        assert ex("import humanize\nhumanize.naturalsize(1000000)").output == "'1.0 MB'"
    finally:
        ex.cleanup()


def _pypi_reachable() -> bool:
    import urllib.request

    try:
        urllib.request.urlopen("https://pypi.org/simple/humanize/", timeout=10).close()
        return True
    except OSError:
        return False


def test_executor_pip_failure_names_the_package(sbx):
    from emberbox.smolagents import PackageInstallError, SandboxExecutor

    name = "emberbox-no-such-package-" + uuid.uuid4().hex[:6]
    with pytest.raises(PackageInstallError) as ei:
        SandboxExecutor(["numpy", name], sandbox=sbx, timeout_seconds=60)
    assert ei.value.packages == [name]
    assert name in str(ei.value) and "network" in str(ei.value)


def test_executor_owns_its_sandbox(client, created):
    from emberbox.smolagents import SandboxExecutor

    ex = SandboxExecutor(client=client, memory_mib=1024, sandbox_timeout_seconds=600, timeout_seconds=60,
                         labels={"suite": "sdk-python", "case": "executor"})
    box = ex.sandbox
    assert box is not None
    created.append(box.id)
    try:
        assert ex("import platform\nplatform.system()").output == "'Linux'"
        assert box.info["labels"]["created_by"] == "emberbox-smolagents"
    finally:
        ex.cleanup()
    assert box.wait_for("stopped", timeout_seconds=60).state == "stopped"


def test_tool_hints_survive_remote_code_generation():
    """Remote executors re-create a tool's forward() from its source in a namespace that has
    only builtins (no `typing`): each tool's signature must evaluate there."""
    import inspect
    import textwrap

    import httpx

    import emberbox

    s = emberbox.Sandbox(emberbox.Client("http://127.0.0.1:9", "k",
                                         transport=httpx.MockTransport(lambda r: httpx.Response(500))),
                         {"id": "sbx_x", "state": "running"})
    for f in sandbox_tools(s):
        src = textwrap.dedent(inspect.getsource(f))
        header = src[: src.index('"""')].rstrip()
        assert "Optional" not in header and "Literal" not in header, header
        exec(compile(header + "\n    pass\n", "<tool>", "exec"), {"__builtins__": __builtins__})  # noqa: S102
        tool(f)  # and smolagents accepts it
