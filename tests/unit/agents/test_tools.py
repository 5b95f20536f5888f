"""Native tool calling on a character-level ChatML tokenizer: schemas, parsing, rendering,
episodes on a scripted engine, and hostile tools and models."""

import asyncio
import time

import pytest

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools import (
    ToolCall,
    ToolSet,
    ToolTemplate,
    default_tools_prompt,
    parse_tool_calls,
    tool_schema,
)
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.agents.tools.builtin import calculator
from rlhfkit.agents.tools.render import example_call
from rlhfkit.agents.tools.run import ToolLimits, ToolRunner
from rlhfkit.errors import ConfigError
from rlhfkit.rollout.base import SamplingParams


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


class P:
    def __init__(self, text):
        self.text, self.raw, self.label, self.ids = text, text, None, []


def call(name, **args):
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def test_schema_from_hints_and_docstring():
    s = tool_schema(multiply)["function"]
    assert s["name"] == "multiply" and s["description"] == "Multiply two integers."
    assert s["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first factor"}
    assert s["parameters"]["required"] == ["a", "b"]
    tools = ToolSet([multiply, add])
    assert tools.names == ["multiply", "add"] and tools.is_async("add") and not tools.is_async("multiply")


def test_schema_errors_name_the_tool():
    def bare(x):
        return x

    with pytest.raises(ConfigError, match="bare"):
        tool_schema(bare)
    with pytest.raises(ConfigError, match="two tools are named"):
        ToolSet([multiply, multiply])


def test_parse_two_calls_and_content(chat_tok):
    text = "Let me compute.\n" + call("multiply", a=2, b=3) + "\n" + call("add", a=1, b=4) + "<|im_end|>"
    content, calls, errors = parse_tool_calls(text, chat_tok, "hermes")
    assert content == "Let me compute."
    assert calls == [ToolCall("multiply", {"a": 2, "b": 3}, "call_0"), ToolCall("add", {"a": 1, "b": 4}, "call_1")]
    assert errors == []


def test_parse_malformed_call_is_reported_and_the_others_kept(chat_tok):
    text = call("multiply", a=2, b=3) + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call><|im_end|>'
    _, calls, errors = parse_tool_calls(text, chat_tok, "hermes")
    assert calls == [ToolCall("multiply", {"a": 2, "b": 3}, "call_0")]
    assert len(errors) == 1 and errors[0].startswith("tool call 1: malformed")
    _, calls, errors = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>', chat_tok, "hermes")
    assert calls == [] and "no function name" in errors[0]
    _, calls, errors = parse_tool_calls('<tool_call>{"name": "f", "arguments": 3}</tool_call>', chat_tok, "hermes")
    assert calls == [] and "arguments must be a JSON object" in errors[0]


def test_parse_llama3_and_mistral_formats(chat_tok):
    text = '{"name": "multiply", "parameters": {"a": 2, "b": 3}}; {"name": "add", "parameters": {"a": 1, "b": 1}}'
    _, calls, errors = parse_tool_calls(text + "<|eot_id|>", chat_tok, "llama3_json")
    assert [c.name for c in calls] == ["multiply", "add"] and calls[1].arguments == {"a": 1, "b": 1} and not errors
    text = '[TOOL_CALLS][{"name": "multiply", "arguments": {"a": 2, "b": 3}}, {"name": "add", "arguments": {"a": 5}}]'
    _, calls, errors = parse_tool_calls(text + "</s>", chat_tok, "mistral")
    assert [c.arguments for c in calls] == [{"a": 2, "b": 3}, {"a": 5}] and not errors
    content, calls, errors = parse_tool_calls("The answer is 6.</s>", chat_tok, "mistral")
    assert content == "The answer is 6." and calls == [] and errors == []
    with pytest.raises(ConfigError, match="tool_parser"):
        parse_tool_calls("x", chat_tok, "nope")


def test_template_that_ignores_tools_gets_the_default_system_turn(chat_tok, caplog):
    with caplog.at_level("INFO", logger="rlhfkit"):
        tt = ToolTemplate(chat_tok, ToolSet([multiply]).schemas)
    assert not tt.native and tt.parser == "hermes"
    assert "ignores tools=" in caplog.text
    text = tt.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2*3?"}])
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call tools.")
    # the example call is the first tool's own name and arguments, not a placeholder to copy
    assert '<tool_call>\n{"name": "multiply", "arguments": {"a": 0, "b": 0}}\n</tool_call>' in text
    assert "TOOL_NAME" not in text
    assert '"name": "multiply"' in text and text.endswith("<|im_start|>user\n2*3?<|im_end|>\n<|im_start|>assistant\n")
    # tool results: <tool_response> blocks of one user turn, after the turn's end
    action = chat_tok(call("multiply", a=2, b=3) + "<|im_end|>", add_special_tokens=False)["input_ids"]
    delta = tt.delta(action, True, [{"role": "tool", "content": "6"}, {"role": "tool", "content": "7"}])
    assert chat_tok.decode(delta) == ("\n<|im_start|>user\n<tool_response>\n6\n</tool_response>\n<tool_response>\n7\n"
                                      "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_conversation_with_tool_calls_renders_as_the_calls_the_model_is_asked_to_write(chat_tok):
    """Few-shot examples and SFT traces given as OpenAI messages: without native tools, an assistant
    turn's tool_calls become the same <tool_call> blocks the parser reads back."""
    tt = ToolTemplate(chat_tok, ToolSet([multiply]).schemas)
    shot = [{"role": "user", "content": "2*3?"},
            {"role": "assistant", "content": "Let me see.", "tool_calls": [
                {"type": "function", "function": {"name": "multiply", "arguments": '{"a": 2, "b": 3}'}},
                {"type": "function", "function": {"name": "multiply", "arguments": {"a": 1, "b": 1}}}]},
            {"role": "tool", "name": "multiply", "content": "6"}, {"role": "tool", "name": "multiply", "content": "1"},
            {"role": "assistant", "content": "6"}, {"role": "user", "content": "4*5?"}]
    text = tt.render(shot)
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert turn == "Let me see.\n" + call("multiply", a=2, b=3) + "\n" + call("multiply", a=1, b=1)
    _content, calls, errors = tt.parse(ids(chat_tok, turn + "<|im_end|>"))
    assert [c.arguments for c in calls] == [{"a": 2, "b": 3}, {"a": 1, "b": 1}] and not errors
    assert "<|im_start|>user\n<tool_response>\n6\n</tool_response>\n<tool_response>\n1\n</tool_response>" in text
    assert text.endswith("<|im_start|>user\n4*5?<|im_end|>\n<|im_start|>assistant\n")


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_episode_calls_a_tool_and_appends_only_masked_result_tokens(chat_tok, scripted):
    def policy(ctx):
        return "6<|im_end|>" if "</tool_response><|im_end|>" in ctx else call("multiply", a=2, b=3) + "<|im_end|>"

    engine = scripted(chat_tok, policy)
    ex = ToolExecutor([multiply])
    [t] = ex.run(engine, chat_tok, [P("2*3?")], SamplingParams(max_new_tokens=80), TokenBudget(80, 400, 4))
    a1 = ids(chat_tok, call("multiply", a=2, b=3) + "<|im_end|>")
    fb = ids(chat_tok, "\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    a2 = ids(chat_tok, "6<|im_end|>")
    assert t.response_ids.tolist() == a1 + fb + a2
    assert t.loss_mask.tolist() == [True] * len(a1) + [False] * len(fb) + [True] * len(a2)
    assert t.logprobs.tolist() == [-0.5] * len(a1) + [0.0] * len(fb) + [-0.5] * len(a2)
    assert engine.calls[1][0] == [t.prompt_ids.tolist() + a1 + fb]  # turn 2 samples after the exact tokens
    assert t.finish_reason == "stop" and t.info["turns"] == 2 and t.info["tool_calls"] == 1
    conv = t.info["messages"]
    assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"]
    assert conv[1]["tool_calls"][0]["function"]["name"] == "multiply" and conv[2]["content"] == "6"
    m = ex.pop_metrics()
    assert m["tools/multiply/calls"] == 1 and m["tools/multiply/errors"] == 0 and m["tools/rerender"] == 0
    assert m["tools/valid_call_rate"] == 1.0


def test_a_final_answer_cut_at_the_token_budget_is_truncated(chat_tok, scripted):
    """No tool call ends the episode; an answer that had no room to stop did not stop properly."""
    def policy(ctx):
        done = "</tool_response><|im_end|>" in ctx
        return "6 " * 60 + "<|im_end|>" if done else call("multiply", a=2, b=3) + "<|im_end|>"

    [t] = ToolExecutor([multiply]).run(scripted(chat_tok, policy), chat_tok, [P("2*3?")],
                                       SamplingParams(max_new_tokens=80), TokenBudget(80, 400, 4))
    assert t.info["turns"] == 2 and t.info["tool_calls"] == 1 and t.truncated


def test_failures_are_results_not_crashes(chat_tok, scripted):
    def hang(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "late"

    def boom() -> str:
        """Raise."""
        raise RuntimeError("kaput")

    def huge() -> str:
        """Ten megabytes."""
        return "x" * (10 << 20)

    def loud() -> str:
        """Print to stdout."""
        print("NOISE FROM A TOOL")
        return "quiet"

    runner = ToolRunner(ToolSet([multiply, hang, boom, huge, loud]), ToolLimits(4, 0.3, 20), chat_tok)
    calls = [ToolCall("hang", {"seconds": 5}, "c0"), ToolCall("boom", {}, "c1"), ToolCall("huge", {}, "c2"),
             ToolCall("nope", {}, "c3"), ToolCall("multiply", {"a": 1}, "c4")]
    start = time.perf_counter()
    msgs = asyncio.run(runner.run(calls, ["tool call 5: malformed"]))
    assert time.perf_counter() - start < 3
    out = [m["content"] for m in msgs]
    assert out[0] == "error: hang timed out after 0.3 s"
    assert out[1] == "error: boom raised RuntimeError: kaput"
    assert out[2].endswith("...[cut]") and len(ids(chat_tok, out[2].removesuffix(" ...[cut]"))) == 20
    assert out[3].startswith("error: unknown tool 'nope'")
    assert out[4] == "error: tool call 5: malformed"  # the parser's errors, then the calls over the limit
    assert out[5].startswith("error: 1 call(s) not run: at most 4")
    m = runner.stats.metrics()
    assert m["tools/hang/timeouts"] == 1 and m["tools/boom/errors"] == 1 and m["tools/huge/errors"] == 0
    assert m["tools/dropped_calls"] == 1 and m["tools/<invalid>/calls"] == 2


def test_prints_of_tools_do_not_reach_stdout(chat_tok, capsys):
    def loud() -> str:
        """Print to stdout."""
        print("NOISE FROM A TOOL")
        return "quiet"

    msgs = asyncio.run(ToolRunner(ToolSet([loud])).run([ToolCall("loud", {}, "c0")], []))
    assert msgs[0]["content"] == "quiet" and "NOISE" not in capsys.readouterr().out


def test_a_model_emitting_100_calls_is_held_to_the_limit(chat_tok, scripted):
    engine = scripted(chat_tok, lambda ctx: "".join(call("multiply", a=i, b=2) for i in range(100)) + "<|im_end|>")
    ex = ToolExecutor([multiply], ToolLimits(calls_per_episode=5, seconds_per_call=5, tokens_per_result=8))
    [t] = ex.run(engine, chat_tok, [P("go")], SamplingParams(max_new_tokens=8000), TokenBudget(8000, 40000, 2))
    assert t.info["tool_calls"] == 5 and t.info["turns"] == 2 and t.finish_reason == "length"
    tools = [m for m in t.info["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tools[:5]] == ["0", "2", "4", "6", "8"]
    assert tools[5]["content"].startswith("error: 95 call(s) not run")
    m = ex.pop_metrics()
    assert m["tools/multiply/calls"] == 5 and m["tools/dropped_calls"] == 95 + 100


def test_trl_reward_functions_get_the_episode_as_messages(chat_tok, scripted):
    from rlhfkit.rewards.callables import CallableRewardFn
    from rlhfkit.trainers.rl.scoring import Scorer

    def policy(ctx):
        return "6<|im_end|>" if "</tool_response><|im_end|>" in ctx else call("multiply", a=2, b=3) + "<|im_end|>"

    seen = []

    def reward(completions, **kwargs):
        seen.extend(completions)
        return [float(c[-1]["content"] == "6") for c in completions]

    prompt = P("2*3?")
    prompt.raw = [{"role": "user", "content": "2*3?"}]
    trajs = ToolExecutor([multiply]).run(scripted(chat_tok, policy), chat_tok, [prompt],
                                         SamplingParams(max_new_tokens=80), TokenBudget(80, 400, 4))
    prompt.record = {}
    out = Scorer(CallableRewardFn(reward, "test"), chat_tok, 400)([prompt], trajs)
    assert out.rewards.tolist() == [1.0]
    assert [m["role"] for m in seen[0]] == ["assistant", "tool", "assistant"]
    assert seen[0][0]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": '{"a": 2, "b": 3}'}


class Counter:
    """TRL's environment_factory contract: public methods are tools, reset, get_reward."""

    def reset(self, start: int = 0, **row):
        self.n = start
        return f"The counter is at {start}."

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: how much
        """
        self.n += by
        return self.n

    def get_reward(self) -> float:
        return float(self.n == 10)


def test_environment_factory_episodes_have_their_own_instance_and_reward(chat_tok, scripted):
    def policy(ctx):
        if "</tool_response><|im_end|>" in ctx:
            return "done<|im_end|>"
        return call("increment", by=3) + "<|im_end|>"

    ex = ToolExecutor(environment_factory=Counter)
    assert ex.provides_rewards and ex.tools.names == ["increment"]
    prompts = [P("count"), P("count")]
    prompts[0].record, prompts[1].record = {"start": 7}, {"start": 1}
    trajs = ex.run(scripted(chat_tok, policy), chat_tok, prompts, SamplingParams(max_new_tokens=80),
                   TokenBudget(80, 400, 3))
    assert [t.info["agent_reward"] for t in trajs] == [1.0, 0.0]  # 7 + 3 == 10; 1 + 3 != 10
    assert [t.info["messages"][2]["content"] for t in trajs] == ["10", "4"]  # each episode's own counter
    assert "The counter is at 7." in chat_tok.decode(trajs[0].prompt_ids.tolist())


def test_the_tokenizers_own_response_template_is_used_first():
    from rlhfkit.agents.tools import TOOL_PARSERS, detect_parser

    from .conftest import char_tokenizer

    tok = char_tokenizer()
    assert detect_parser(tok) == "hermes"
    tok.response_template = TOOL_PARSERS["mistral"]
    _, calls, _ = parse_tool_calls('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]', tok)
    assert calls == [ToolCall("f", {"x": 1}, "call_0")]
    _, calls, _ = parse_tool_calls(call("f", x=1), tok)  # the Hermes form is not what this template reads
    assert calls == []


def test_tools_printing_in_concurrent_episodes_leave_stdout_as_it_was(chat_tok, scripted):
    """The calls of several episodes run together; their stdout captures interleave. After the
    run, print() reaches the real stdout again (it once stayed swallowed by a capture)."""
    import sys

    def loud(x: int) -> int:
        """Print and answer.

        Args:
            x: a number
        """
        time.sleep(0.01)
        print("NOISE", x)
        return x

    def policy(ctx):
        return "done<|im_end|>" if "</tool_response>" in ctx else call("loud", x=1) + "<|im_end|>"

    before = sys.stdout
    ex = ToolExecutor([loud])
    ex.run(scripted(chat_tok, policy), chat_tok, [P("a"), P("b"), P("c")], SamplingParams(max_new_tokens=200),
           TokenBudget(200, 800, 2))
    assert sys.stdout is before and ex.pop_metrics()["tools/loud/calls"] == 3.0


def test_the_default_prompt_example_call_shows_required_arguments_with_typed_placeholders():
    schema = {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "required": ["query", "k"],
        "properties": {"query": {"type": "string"}, "k": {"type": "integer"}, "exact": {"type": "boolean"}}}}}
    assert example_call(schema) == '{"name": "search", "arguments": {"query": "...", "k": 0}}'
    no_required = {"name": "flip", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}}}
    assert example_call(no_required) == '{"name": "flip", "arguments": {"on": true}}'
    assert example_call({"name": "now"}) == '{"name": "now", "arguments": {}}'
    calc = ToolSet([calculator]).schemas
    assert '{"name": "calculator", "arguments": {"expression": "..."}}' in default_tools_prompt(calc)
