"""A smolagents CodeAgent whose Python runs in an Emberbox sandbox through
SandboxExecutor: variables and imports persist between steps.

    pip install './sdk/python[smolagents]'
    EMBERBOX_API_URL=http://127.0.0.1:8080 EMBERBOX_API_KEY=$(cat ~/.local/share/emberbox/admin.key) \\
        python3 examples/code_agent.py
"""
from __future__ import annotations

from smolagents import CodeAgent

from _model import pick
from emberbox.smolagents import SandboxExecutor

TASK = ("Using numpy, compute the mean and standard deviation of the first 20 Fibonacci numbers, "
        "and report the machine the code ran on. Answer with a dict.")


def code(src: str) -> str:
    return f"Thought: I will run this in the sandbox.\n<code>\n{src}\n</code>"


SCRIPT = [
    code("import numpy as np\nimport platform\nfib = [0, 1]\nwhile len(fib) < 20:\n"
         "    fib.append(fib[-1] + fib[-2])\nprint(len(fib), fib[-1])"),
    code("arr = np.array(fib)\nstats = {'mean': float(arr.mean()), 'std': round(float(arr.std()), 3)}\n"
         "print(stats)"),
    code("final_answer({**stats, 'machine': platform.machine(), 'python': platform.python_version()})"),
]


def main() -> None:
    model = pick(SCRIPT)
    executor = SandboxExecutor(additional_imports=["numpy"], timeout_seconds=120, sandbox_timeout_seconds=900,
                               on_lease_end="delete", delete_on_cleanup=True, labels={"example": "code_agent"})
    print(f"[sandbox] {executor.sandbox.id if executor.sandbox else '?'}")
    with CodeAgent(tools=[], model=model, executor=executor, additional_authorized_imports=["numpy"],
                   max_steps=8) as agent:
        print(agent.run(TASK))


if __name__ == "__main__":
    main()
