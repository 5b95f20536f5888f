"""What a hostile policy (or an unlucky tool) does to tool-calling episodes: every case is a result
the model reads or a bounded episode end, never a crash of the run and never a call made up."""

import json

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools import parse_tool_calls
from rlhfkit.agents.tools.agent import ToolExecutor
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
