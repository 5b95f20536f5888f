"""The Evaluator with tool-calling episodes: each sample is an episode, rewards see its messages,
the tool counters come out under eval/, and an environment's get_reward scores without a reward."""

import pytest

from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.data.types import PromptItem
from rlhfkit.rewards.resolve import resolve_reward
from rlhfkit.trainers.evaluate import Evaluator, reward_score_fn, reward_verifier
from tests.unit.agents.test_tools import multiply


def policy(ctx: str) -> str:
    """Calls the tool for 3*4 and answers what it returned; guesses 5*5 without a call."""
    if ctx.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"):
        return ctx.split("<tool_response>\n")[-1].split("\n")[0] + "<|im_end|>"
    if "3*4?" in ctx.rsplit("<|im_start|>user\n", 1)[1]:
        return '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
    return "24<|im_end|>"


def answered(completions, label, **kwargs):
    """TRL's contract: the last assistant message is the label (completions are message lists)."""
    return [float(c[-1]["role"] == "assistant" and c[-1]["content"].strip() == y) for c, y in zip(completions, label)]


def items(tok):
    out = []
    for q, y in (("3*4?", "12"), ("5*5?", "25")):
        msgs = [{"role": "user", "content": q}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(PromptItem(text, tok(text, add_special_tokens=False)["input_ids"], label=y, raw=msgs,
                              record={"label": y}))
    return out


def test_episodes_are_scored_on_their_messages_and_the_tool_counters_reported(chat_tok, scripted):
    reward = resolve_reward(answered)
    ev = Evaluator(items(chat_tok), 100, -1, score_fn=reward_score_fn(reward), verifier=reward_verifier(reward),
                   executor=ToolExecutor([multiply]), budget=TokenBudget(100, 400, 3))
    engine = scripted(chat_tok, policy)
    metrics, rows = ev.evaluate(engine, chat_tok)
    assert metrics["eval/accuracy"] == 0.5 and metrics["eval/pass@1"] == 0.5  # 12 right, 24 wrong
    assert metrics["eval/tool_calls"] == 0.5 and metrics["eval/episodes_with_call"] == 0.5
    assert metrics["eval/tools/multiply/calls"] == 1.0 and metrics["eval/tools/valid_call_rate"] == 1.0
    assert metrics["eval/turns"] == 1.5  # two turns with the call, one without
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == ["user", "assistant", "tool", "assistant"]
    assert first[1]["tool_calls"][0]["function"]["name"] == "multiply" and first[2]["content"] == "12"
    assert rows[0]["tool_calls"] == 1 and rows[1]["tool_calls"] == 0
    assert [r["correct"] for r in rows] == [True, False]
    again, _ = ev.evaluate(engine, chat_tok)  # the counters were popped: the same numbers, not doubled
    assert again["eval/tools/multiply/calls"] == 1.0


class Product:
    def reset(self, label: str = "", **row):
        self.label, self.got = label, None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.got = str(a * b)
        return a * b

    def get_reward(self) -> float:
        return float(self.got == self.label)


def test_an_environment_with_get_reward_scores_the_episodes_without_a_reward_function(chat_tok, scripted):
    ev = Evaluator(items(chat_tok), 100, -1, score_fn=None, executor=ToolExecutor(environment_factory=Product),
                   budget=TokenBudget(100, 400, 3))
    metrics, rows = ev.evaluate(scripted(chat_tok, policy), chat_tok)
    assert metrics["eval/reward"] == 0.5 and metrics["eval/accuracy"] == 0.5
    assert metrics["eval/pass@1"] == 0.5 and [r["correct"] for r in rows] == [True, False]


def test_without_an_executor_a_sample_is_one_generation(chat_tok, scripted):
    reward = resolve_reward(answered)
    ev = Evaluator(items(chat_tok), 100, -1, score_fn=reward_score_fn(reward))
    metrics, rows = ev.evaluate(scripted(chat_tok, policy), chat_tok)
    assert "eval/tool_calls" not in metrics and "messages" not in rows[0]
    assert metrics["eval/accuracy"] == 0.0  # the call's text is the whole response: no answer
    with pytest.raises(KeyError):
        rows[0]["tool_calls"]
