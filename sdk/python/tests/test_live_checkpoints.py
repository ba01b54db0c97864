"""Checkpoints against a live server: the client's checkpoint, restore and delete; a
CodeAgent whose SandboxExecutor(checkpoints=True) rolls back a step that broke things
and branches from a step; and runtime_undo in a ToolCallingAgent. The models are
scripted (no LLM).

Capturing and restoring a VM's memory is slow on an emulated host, so these tests wait
generously and make no more VMs than they need: the session's shared sandbox, and one
branch in the branch test."""
from __future__ import annotations

import uuid

import pytest

smolagents = pytest.importorskip("smolagents")
from smolagents import CodeAgent, ToolCallingAgent, tool  # noqa: E402
from smolagents.monitoring import LogLevel  # noqa: E402
from smolagents.utils import AgentError  # noqa: E402

from _scripted import ScriptedModel, call, last_observation  # noqa: E402
from emberbox import NotFoundError  # noqa: E402
from emberbox.tools import sandbox_tools  # noqa: E402

STEP_TIMEOUT_S = 300  # a code step (the first one after a restore may wait for its kernel's connection)


def _code(src: str) -> str:
    return f"Thought: next step.\n<code>\n{src}\n</code>"


def _dir() -> str:
    return f"/workspace/ckpt-{uuid.uuid4().hex[:8]}"


def test_checkpoint_restore_and_delete(sbx):
    """The client's calls: a restore brings back the files and the interpreter's state of
    the checkpoint's moment, in the same sandbox."""
    path = f"{_dir()}.txt"
    sbx.files.write(path, "before")
    assert sbx.run_code("v = 21", timeout=STEP_TIMEOUT_S).error is None
    ck = sbx.checkpoint("client-test")
    assert ck.ok, ck
    assert (ck.sandbox_id, ck.label, ck.state) == (sbx.id, "client-test", "ready")
    assert ck.size_bytes and ck.size_bytes > 0 and ck.created_at and ck.ready_at
    try:
        sbx.files.write(path, "after")
        sbx.run_code("v = 0", timeout=STEP_TIMEOUT_S)

        assert sbx.restore(ck) is sbx and sbx.state == "running"
        assert sbx.files.read_text(path) == "before"
        assert sbx.run_code("v", timeout=STEP_TIMEOUT_S).text == "21"
        assert ck.id in [c.id for c in sbx.checkpoints()]
        assert sbx.get_checkpoint(ck.id).label == "client-test"
    finally:
        assert sbx.delete_checkpoint(ck) == {"id": ck.id, "state": "deleted"}
    with pytest.raises(NotFoundError):
        sbx.get_checkpoint(ck.id)
    assert ck.id not in [c.id for c in sbx.checkpoints()]


def test_code_agent_rollback_brings_back_the_files_and_the_session(sbx):
    """Step 1 sets x = 1 and writes a file, step 2 sets x = 2, step 3 deletes the file and
    sets x = 3; rollback(2) brings back the file and x == 2, and the agent goes on."""
    from emberbox.smolagents import SandboxExecutor

    d = _dir()
    data = f"{d}/data.txt"
    model = ScriptedModel([
        _code(f"import os\nx = 1\nos.makedirs({d!r}, exist_ok=True)\n"
              f"with open({data!r}, 'w') as f:\n    f.write('hello')\nprint('x is', x)"),
        _code("x = 2\nprint('x is', x)"),
        _code(f"import os\nos.remove({data!r})\nx = 3\nfinal_answer('broke it')"),
        # the second run, after the rollback
        _code(f"final_answer({{'x': x, 'data': open({data!r}).read()}})"),
    ])
    executor = SandboxExecutor(sandbox=sbx, timeout_seconds=STEP_TIMEOUT_S, checkpoints=True)
    agent = CodeAgent(tools=[], model=model, executor=executor, verbosity_level=LogLevel.OFF, max_steps=6)
    ids: list[str] = []
    try:
        first = agent.run("Set x, write a file, then break things.", return_full_result=True)
        assert first.state == "success", first
        assert first.output == "broke it"
        steps = [s for s in agent.memory.steps if hasattr(s, "code_action")]
        assert "x is 1" in steps[0].observations and "x is 2" in steps[1].observations
        assert executor.step == 3 and sorted(executor.step_checkpoints) == [0, 1, 2, 3]
        labels = {c.id: c.label for c in sbx.checkpoints()}
        assert {n: labels.get(cid) for n, cid in executor.step_checkpoints.items()} == {
            n: f"step-{n}" for n in range(4)}
        assert not sbx.files.exists(data)
        assert sbx.run_code("x", context=executor.context, timeout=STEP_TIMEOUT_S).text == "3"
        step3 = executor.step_checkpoints[3]
        context = executor.context.id

        executor.rollback(2)
        assert executor.step == 2 and sorted(executor.step_checkpoints) == [0, 1, 2]
        assert step3 not in [c.id for c in sbx.checkpoints()]  # forgotten, and deleted
        assert sbx.files.read_text(data) == "hello"
        assert executor.context.id == context
        assert sbx.run_code("x", context=executor.context, timeout=STEP_TIMEOUT_S).text == "2"

        second = agent.run("Read it back.", reset=False, return_full_result=True)
        assert second.state == "success", second
        assert second.output == {"x": 2, "data": "hello"}
        assert executor.step == 3 and sorted(executor.step_checkpoints) == [0, 1, 2, 3]
    finally:
        ids = list(executor.step_checkpoints.values())
        agent.cleanup()
    assert not set(ids) & {c.id for c in sbx.checkpoints()}  # cleanup deleted them
    assert sbx.refresh().state == "running"


def test_executor_branch_starts_from_the_step(sbx, created):
    """branch(1, 1) makes an executor on a new sandbox that has step 1's files and goes on
    in step 1's Python session (the server carries the interpreter's contexts into a
    branch: Service.Adopt)."""
    from emberbox.smolagents import SandboxExecutor

    d = _dir()
    data = f"{d}/data.txt"
    executor = SandboxExecutor(sandbox=sbx, timeout_seconds=STEP_TIMEOUT_S, checkpoints=True,
                               delete_on_cleanup=True)  # the branches' sandboxes go at their cleanup
    try:
        executor(f"import os\nx = 1\nos.makedirs({d!r}, exist_ok=True)\nopen({data!r}, 'w').write('one')")
        executor(f"x = 2\nopen({data!r}, 'w').write('two')")
        [branch] = executor.branch(1, 1, labels={"suite": "sdk-python", "case": "branch"})
        assert branch.sandbox is not None
        created.append(branch.sandbox.id)
        try:
            assert branch.sandbox.id != sbx.id and branch.owns_sandbox and branch.step == 1
            assert branch.sandbox.info["labels"]["created_by"] == "emberbox-smolagents"
            assert branch.sandbox.files.read_text(data) == "one"
            assert branch.kept_session
            assert branch("x").output == "1"
            assert branch(f"open({data!r}).read()").output == "'one'"
            assert sorted(branch.step_checkpoints) == [1, 2, 3]  # its own, numbered on from step 1
        finally:
            branch.cleanup()
        # the source is untouched
        assert executor.step == 2 and sbx.files.read_text(data) == "two"
        assert executor("x").output == "2"
    finally:
        executor.cleanup()


def test_tool_calling_agent_undoes_a_command(sbx):
    """With undo=True, runtime_undo puts back a file that a command removed."""
    d = _dir()
    keep = f"{d}/keep.txt"
    model = ScriptedModel([
        call("runtime_write_file", path=keep, content="important"),
        call("runtime_exec", command=f"rm -f {keep} && echo removed"),
        call("runtime_read_file", path=keep),
        call("runtime_undo"),
        call("runtime_read_file", path=keep),
        lambda msgs: call("final_answer", answer=last_observation(msgs)),
    ])
    tools = [tool(f) for f in sandbox_tools(sbx, undo=True)]
    agent = ToolCallingAgent(tools=tools, model=model, verbosity_level=LogLevel.OFF, max_steps=8)
    before = {c.id for c in sbx.checkpoints()}
    try:
        result = agent.run("Write a file, remove it, then undo that.", return_full_result=True)
        assert result.state == "success", result
        obs = [getattr(s, "observations", None) or "" for s in agent.memory.steps]
        assert any("removed" in o for o in obs), obs
        assert any(f"No such file: {keep}" in o for o in obs), obs
        assert any(f"Undid runtime_exec('rm -f {keep} && echo removed')" in o for o in obs), obs
        assert "important" in str(result.output)
        assert sbx.files.read_text(keep) == "important"
    finally:
        for c in sbx.checkpoints():  # the write's checkpoint is still on the stack
            if c.id not in before and (c.label or "").startswith("undo-"):
                sbx.delete_checkpoint(c)
