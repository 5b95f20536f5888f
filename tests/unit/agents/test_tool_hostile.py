"""What a hostile policy (or an unlucky tool) does to tool-calling episodes: every case is a result
the model reads or a bounded episode end, never a crash of the run and never a call made up."""

import asyncio
import enum
import json
import os
import sys
import threading
import time
from typing import Literal, Optional

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools import ToolCall, ToolSet, parse_tool_calls
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.agents.tools.run import ToolLimits, ToolRunner
from rlhfkit.rollout.base import SamplingParams

from .conftest import char_tokenizer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


class P:
    def __init__(self, text):
        self.text, self.raw, self.label, self.ids = text, text, None, []


def call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def llama_call(name, **args):
    return json.dumps({"name": name, "parameters": args})


def test_llama3_answers_with_braces_are_text_not_calls(chat_tok):
    """Llama 3.1's JSON calls are the whole turn (or follow <|python_tag|>, or a call and `;`); a brace
    inside an answer is text, as vLLM's llama3_json parser reads it."""
    for text in ["The answer is \\boxed{5}.", "Sets like {1, 2} are fine.", 'It said {"name": "x"} ok']:
        content, calls, errors = parse_tool_calls(text + "<|eot_id|>", chat_tok, "llama3_json")
        assert (content, calls, errors) == (text, [], [])
    two = llama_call("multiply", a=2, b=3) + "; " + llama_call("multiply", a=1, b=1)
    for text in [two, "  " + two, "<|python_tag|>" + two, "Let me compute. <|python_tag|>" + two]:
        _, calls, errors = parse_tool_calls(text + "<|eot_id|>", chat_tok, "llama3_json")
        assert [c.arguments for c in calls] == [{"a": 2, "b": 3}, {"a": 1, "b": 1}] and not errors, text
    _, calls, errors = parse_tool_calls("{oops}<|eot_id|>", chat_tok, "llama3_json")  # a turn opening a call
    assert calls == [] and "malformed" in errors[0]


LLAMA = ("{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] "
         "+ '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")


def test_a_llama3_final_answer_in_a_box_ends_the_episode(scripted):
    tok = char_tokenizer(LLAMA, ("<|start_header_id|>", "<|eot_id|>", "<|end_header_id|>", "<|python_tag|>"))

    def policy(ctx):
        done = "</tool_response>" in ctx
        return ("The answer is \\boxed{6}." if done else llama_call("multiply", a=2, b=3)) + "<|eot_id|>"

    ex = ToolExecutor([multiply], parser="llama3_json")
    [t] = ex.run(scripted(tok, policy), tok, [P("2*3?")], SamplingParams(max_new_tokens=200),
                 TokenBudget(200, 2000, 4))
    assert t.info["turns"] == 2 and t.finish_reason == "stop" and not t.truncated
    assert t.info["messages"][-1] == {"role": "assistant", "content": "The answer is \\boxed{6}."}
    assert ex.pop_metrics()["tools/valid_call_rate"] == 1.0


def test_json_nested_past_the_recursion_limit_is_a_malformed_call(chat_tok, scripted):
    deep = "[" * 3000 + "]" * 3000
    hermes = '<tool_call>{"name": "multiply", "arguments": {"a": ' + deep + ', "b": 2}}</tool_call>'
    for text, parser in [(hermes, "hermes"), ('{"name": "multiply", "parameters": ' + deep + "}", "llama3_json"),
                         ("[TOOL_CALLS]" + "[" * 3000, "mistral")]:
        _, calls, errors = parse_tool_calls(text, chat_tok, parser)
        assert calls == [] and len(errors) == 1 and "recursion" in errors[0], parser

    def policy(ctx):
        return "6<|im_end|>" if "</tool_response>" in ctx else hermes + "<|im_end|>"

    [t] = ToolExecutor([multiply]).run(scripted(chat_tok, policy), chat_tok, [P("go")],
                                       SamplingParams(max_new_tokens=8000), TokenBudget(8000, 40000, 3))
    tool = [m["content"] for m in t.info["messages"] if m["role"] == "tool"]
    assert t.info["turns"] == 2 and len(tool) == 1 and tool[0].startswith("error: tool call 0: malformed")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def paint(color: Color, times: int = 1, shade: Optional[float] = None, mode: Literal["a", "b"] = "a",
          tags: list[str] = None, strict: bool = False) -> str:
    """Paint.

    Args:
        color: which colour
        times: how many coats
        shade: how dark
        mode: how
        tags: labels
        strict: whether to be strict
    """
    return f"{color.value} x{times!r} {shade} {mode} {tags} {strict}"


def test_arguments_are_checked_against_the_schema_and_enums_given_as_members():
    runner = ToolRunner(ToolSet([paint]))

    def answer(**args):
        return asyncio.run(runner.run([ToolCall("paint", args, "c0")], []))[0]["content"]

    assert answer(color="blue") == "blue x1 None a None False"  # the function gets Color.BLUE, not "blue"
    assert answer(color="red", times=3.0, shade=None, tags=None, strict=True) == "red x3 None a None True"
    wrong = "error: wrong arguments for paint: "
    assert answer(color="green") == wrong + 'color must be one of ["red", "blue"], got "green"'
    assert answer(color="red", times="xx") == wrong + 'times must be integer, got str "xx"'
    assert answer(color="red", times=2.5) == wrong + "times must be integer, got float 2.5"
    assert answer(color="red", times=True) == wrong + "times must be integer, got bool true"
    assert answer(color="red", mode="c") == wrong + 'mode must be one of ["a", "b"], got "c"'
    assert answer(color="red", tags=["a", 1]) == wrong + "tags[1] must be string, got int 1"
    assert answer(color="red", strict=1) == wrong + "strict must be boolean, got int 1"
    assert answer(color="red", zzz=1) == wrong + "got an unexpected keyword argument 'zzz'"
    assert answer() == wrong + "missing a required argument: 'color'"
    m = runner.stats.metrics()
    assert m["tools/paint/calls"] == 11 and m["tools/paint/errors"] == 9


def test_multiply_with_a_string_never_runs():
    """A string for an integer is refused before the call ("xx" * 10**9 would take gigabytes)."""
    ran = []

    def times(a: int, b: int) -> int:
        """Multiply.

        Args:
            a: the first factor
            b: the second factor
        """
        ran.append(a)
        return len(a * b)

    [msg] = asyncio.run(ToolRunner(ToolSet([times])).run([ToolCall("times", {"a": "xx", "b": 10**6}, "c0")], []))
    assert msg["content"] == 'error: wrong arguments for times: a must be integer, got str "xx"' and ran == []


class Unprintable:
    def __str__(self):
        raise ValueError("no text")


def test_a_tool_that_exits_or_returns_what_cannot_be_text_is_an_error_not_the_end_of_the_run():
    def quits(code: int) -> str:
        """Exit as an argparse-based tool does on bad input.

        Args:
            code: the exit status
        """
        sys.exit(code)

    async def aquits(code: int) -> str:
        """Exit from a coroutine.

        Args:
            code: the exit status
        """
        raise SystemExit(code)

    def odd() -> str:
        """Return an object whose text cannot be made."""
        return Unprintable()

    runner = ToolRunner(ToolSet([quits, aquits, odd, multiply]))
    calls = [ToolCall("quits", {"code": 2}, "c0"), ToolCall("aquits", {"code": 3}, "c1"), ToolCall("odd", {}, "c2"),
             ToolCall("multiply", {"a": 2, "b": 3}, "c3")]
    out = [m["content"] for m in asyncio.run(runner.run(calls, []))]
    assert out == ["error: quits raised SystemExit: 2", "error: aquits raised SystemExit: 3",
                   "error: odd raised ValueError: no text", "6"]
    m = runner.stats.metrics()
    assert m["tools/quits/errors"] == 1 and m["tools/aquits/errors"] == 1 and m["tools/odd/errors"] == 1


class Peak:
    """A sync tool that counts how many of its calls run at once."""

    def __init__(self, seconds: float):
        self.seconds, self.running, self.peak, self.lock = seconds, 0, 0, threading.Lock()

    def __call__(self, k: int) -> int:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return k


def peak_tool(seconds: float, max_concurrency: int):
    peak = Peak(seconds)

    def work(k: int) -> int:
        """Work a while.

        Args:
            k: what to return
        """
        return peak(k)

    work.max_concurrency = max_concurrency
    return work, peak


def test_a_tool_with_max_concurrency_runs_that_many_calls_at_once_their_time_starting_when_they_run():
    """Six calls of 0.2 s, two at a time: 0.6 s in all, yet none runs past its 0.5 s limit (the
    sandbox of builtin:python: 64 programs at once on 2 cores all timed out)."""
    work, peak = peak_tool(0.2, 2)
    runner = ToolRunner(ToolSet([work]), ToolLimits(calls_per_episode=8, seconds_per_call=0.5))
    out = asyncio.run(runner.run([ToolCall("work", {"k": k}, f"c{k}") for k in range(6)], []))
    assert [m["content"] for m in out] == ["0", "1", "2", "3", "4", "5"] and peak.peak == 2


def test_episodes_with_their_own_environment_share_a_tools_slots(chat_tok, scripted):
    work, peak = peak_tool(0.05, 1)

    class Env:
        def reset(self, **row):
            return None

        def noop(self) -> str:
            """Do nothing."""
            return ""

    def policy(ctx):
        return "done<|im_end|>" if "</tool_response>" in ctx else call("work", k=1) + "<|im_end|>"

    ex = ToolExecutor([work], environment_factory=Env)
    trajs = ex.run(scripted(chat_tok, policy), chat_tok, [P("go")] * 4, SamplingParams(max_new_tokens=80),
                   TokenBudget(80, 400, 3))
    assert [t.info["tool_calls"] for t in trajs] == [1, 1, 1, 1] and peak.peak == 1


def test_the_python_tool_runs_one_program_per_core_at_once():
    from rlhfkit.agents.tools.builtin import python_tool

    assert python_tool(backend="none").max_concurrency == len(os.sched_getaffinity(0))
