"""The product page's agent: a smolagents ToolCallingAgent with Emberbox's four
tools asks the sandbox how many CPUs and how much memory it has.

    pip install './sdk/python[smolagents]'
    EMBERBOX_API_URL=http://127.0.0.1:8080 EMBERBOX_API_KEY=$(cat ~/.local/share/emberbox/admin.key) \\
        python3 examples/tool_calling_agent.py
"""
from __future__ import annotations

import re

from smolagents import ToolCallingAgent, tool

from _model import last_observation, pick, tool_call
from emberbox import Sandbox
from emberbox.tools import sandbox_tools

TASK = "How many CPUs and how much memory (in MiB) does the sandbox have? Use the tools to find out."


def summarise(messages) -> object:
    obs = last_observation(messages)
    cpus = re.search(r"'stdout': '(\d+)\\n", obs)
    mem = re.search(r"Mem:\s+(\d+)", obs)
    return tool_call("final_answer", answer=f"The sandbox has {cpus.group(1) if cpus else '?'} CPUs and "
                                            f"{mem.group(1) if mem else '?'} MiB of memory.")


def main() -> None:
    model = pick([tool_call("runtime_exec", command="nproc && free -m"), summarise])
    with Sandbox.create(timeout_seconds=900, on_lease_end="delete", delete_on_exit=True,
                        labels={"example": "tool_calling_agent"}) as sbx:
        print(f"[sandbox] {sbx.id}")
        agent = ToolCallingAgent(tools=[tool(f) for f in sandbox_tools(sbx)], model=model, max_steps=6)
        print(agent.run(TASK))


if __name__ == "__main__":
    main()
