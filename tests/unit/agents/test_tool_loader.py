"""--agent.tools: functions of a file or module, builtin tools, and model-written code in the sandbox."""

import asyncio

import pytest

from rlhfkit.agents.tools import ToolCall, ToolSet
from rlhfkit.agents.tools.builtin import calculator, python_tool
from rlhfkit.agents.tools.loader import load_tools
from rlhfkit.agents.tools.run import ToolLimits, ToolRunner
from rlhfkit.errors import ConfigError, RewardError

FILE = '''
def multiply(a: int, b: int) -> int:
    """Multiply.

    Args:
        a: one
        b: two
    """
    return a * b


def shout(text: str) -> str:
    """Shout.

    Args:
        text: what
    """
    return text.upper()


def _hidden():
    pass
'''


def test_functions_of_a_file_by_name_or_all_public(tmp_path):
    f = tmp_path / "tools.py"
    f.write_text(FILE)
    assert [fn.__name__ for fn in load_tools(f"{f}:shout")] == ["shout"]
    assert [fn.__name__ for fn in load_tools(str(f))] == ["multiply", "shout"]
    with pytest.raises(ConfigError, match="has no function 'nope'; it defines multiply, shout"):
        load_tools(f"{f}:nope")
    with pytest.raises(ConfigError, match="does not exist"):
        load_tools(str(tmp_path / "missing.py"))


def test_module_and_builtin_tools():
    assert load_tools("rlhfkit.agents.envs.calculator:calculate")[0].__name__ == "calculate"
    assert load_tools("builtin:calculator") == [calculator]
    assert calculator("123 * 456") == "56088"
    with pytest.raises(ConfigError, match="no such builtin tool"):
        load_tools("builtin:nope")
    with pytest.raises(ConfigError, match="cannot import"):
        load_tools("no_such_module_xyz:f")


def test_python_tool_runs_model_code_in_the_sandbox_not_in_process():
    try:
        python = python_tool(wall_seconds=5.0)
    except RewardError as exc:
        pytest.skip(f"no code sandbox here: {exc}")
    runner = ToolRunner(ToolSet([python]), ToolLimits(4, 30.0, 64))
    code = "import os\nprint(sum(range(10)), os.getpid() < 10, os.path.exists('/home'))"
    [msg] = asyncio.run(runner.run([ToolCall("python", {"code": code}, "c0")], []))
    assert msg["content"].split() == ["45", "True", "False"]  # its own pid namespace, no host folders
