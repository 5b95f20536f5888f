"""A calculator tool: the model calls it with a fixed syntax and gets the result as feedback.

Action syntax (the first match in the action counts):
    <calc>EXPR</calc>     EXPR of numbers, + - * / ( ) -> feedback "<result>VALUE</result>\\n"
    <answer>X</answer>    ends the episode; reward 1 when X equals the label (as numbers), else 0
An action with neither gets the feedback "use <calc>EXPR</calc> or <answer>X</answer>\\n".
The episode also ends after MAX_CALLS tool calls (reward 0). Expressions are evaluated by
walking their syntax tree (numbers and + - * / only), never with eval().

    --agent.func_path builtin:calculator   (labels: the reference answers)
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

from rlhfkit.agents import AgentInstanceBase
from rlhfkit.rewards.math import answers_equal

MAX_CALLS = 3
_CALL_RE = re.compile(r"<(calc|answer)>(.*?)</\1>", re.DOTALL)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expr: str) -> str:
    """The value of `expr` as text ("2*(3+4)" -> "14", "1/4" -> "1/4"), or "error: ..."."""
    if len(expr) > 200:
        return "error: expression too long"
    try:
        value = _eval(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {type(exc).__name__}"
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def parse_action(action: str) -> tuple[str, str] | None:
    """("calc", expr) or ("answer", x) from the first tool tag in `action`; None if none."""
    m = _CALL_RE.search(action)
    return (m.group(1), m.group(2).strip()) if m else None


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.calls = 0

    async def step(self, states: dict, **kwargs) -> dict:
        call = parse_action(states["action_text"])
        reward, done, feedback = 0.0, False, ""
        if call is None:
            feedback = "use <calc>EXPR</calc> or <answer>X</answer>\n"
        elif call[0] == "calc":
            self.calls += 1
            feedback = f"<result>{calculate(call[1])}</result>\n"
        else:
            done = True
            reward = 1.0 if answers_equal(call[1], str(states["label"])) else 0.0
        done = done or self.calls >= MAX_CALLS
        return {"rewards": reward, "scores": reward, "environment_feedback": "" if done else feedback,
                "done": done, "extra_logs": {"tool_calls": float(self.calls)}}
