"""Tools shipped with rlhfkit (`--agent.tools builtin:NAME`).

  builtin:calculator  `calculator(expression)`: + - * / and parentheses on numbers, evaluated by
                      walking the syntax tree (never eval)
  builtin:python      `python(code)`: runs model-written code in the code sandbox (bubblewrap,
                      rlhfkit.rewards.code_sandbox), never in the trainer's process; returns its stdout;
                      at most one program per CPU core at once (`max_concurrency`)
"""

from __future__ import annotations

import os
from collections.abc import Callable

from rlhfkit.agents.envs.calculator import calculate


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / and parentheses, e.g. "123 * 456"
    """
    return calculate(expression)


def python_tool(backend: str = "bwrap", wall_seconds: float = 5.0) -> Callable[[str], str]:
    """A `python(code)` tool over a `CodeSandbox` (built now: a missing bubblewrap fails here)."""
    from rlhfkit.rewards.code_sandbox import CodeSandbox

    sandbox = CodeSandbox(backend=backend, wall_seconds=wall_seconds)

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return what it prints.

        Args:
            code: the program's source
        """
        result = sandbox.run(code)
        if result.timed_out:
            return f"error: the program ran past {wall_seconds:g} s"
        if result.returncode != 0:
            return f"error: exit status {result.returncode}\n{result.output}{result.stderr[-1000:]}"
        return result.output

    # the sandbox's wall-clock limit is fair only while each program has a core: many calls at once
    # (a rollout's episodes in one turn) would time out together; the ToolRunner queues the others
    python.max_concurrency = max(len(os.sched_getaffinity(0)), 1)
    return python


BUILTIN_TOOLS: dict[str, Callable[[], Callable]] = {
    "builtin:calculator": lambda: calculator,
    "builtin:python": python_tool,
}
