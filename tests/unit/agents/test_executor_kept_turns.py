"""The multi-turn executors name their episodes to the HF engine, which keeps each episode's KV cache
across its turns: the same episodes as without, fewer prefilled tokens, nothing kept after the run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rlhfkit.agents import AgentInstanceBase, MultiTurnExecutor, TokenBudget
from rlhfkit.agents.textenv import text_env
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

PARAMS = SamplingParams(max_new_tokens=5, temperature=1.0)


class FeedbackAgent(AgentInstanceBase):
    """Feedback of a length that depends on the action, done after 3 turns."""

    def __init__(self, *args, **kwargs):
        self.turn = 0

    async def step(self, states, **kwargs):
        self.turn += 1
        return {"rewards": 0.0, "environment_feedback": f"\nok {len(states['action_text']) % 4 * 'x'}:",
                "done": self.turn >= 3}


class TextPrompt:
    def __init__(self, tok, text):
        self.text, self.label, self.ids = text, None, tok(text, add_special_tokens=False)["input_ids"]


class TalkEnv:
    """A text environment that answers every action, for 3 turns."""

    def reset(self, seed=None):
        self.turn = 0
        return "Say something.", {}

    def step(self, action):
        self.turn += 1
        return f"heard {len(action)}", 0.0, False, self.turn >= 3, {}


def _same(a, b):
    for x, y in zip(a, b):
        assert x.response_ids.tolist() == y.response_ids.tolist() and x.loss_mask.tolist() == y.loss_mask.tolist()
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)


def test_agent_episodes_are_the_same_with_kept_turns_and_prefill_less():
    model, tok = tiny_model_and_tokenizer(seed=0)
    prompts = [TextPrompt(tok, "What is 2+3?"), TextPrompt(tok, "Hello there, how are you?")]
    runs = {}
    for keep in (True, False):
        engine = HFEngine(model, tok, keep_turns=keep)
        trajs = MultiTurnExecutor(FeedbackAgent).run(engine, tok, prompts, replace(PARAMS, n=2),
                                                 TokenBudget(5, 60, 3), seeds=[1, 2])
        runs[keep] = trajs, engine
    _same(runs[True][0], runs[False][0])
    assert all(t.info["turns"] == 3 for t in runs[True][0])
    kept, plain = runs[True][1], runs[False][1]
    assert kept.turns.kept == {}  # every episode finished: nothing outlives the rollout
    assert kept.turns.reused_tokens > 0 and kept.prefilled_tokens == plain.prefilled_tokens - kept.turns.reused_tokens


@pytest.mark.parametrize("overlap", [False, True], ids=["turn_by_turn", "overlap"])
def test_text_environment_episodes_are_the_same_with_kept_turns(chat_tok, overlap):
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.tiny import tiny_config

    config = tiny_config("qwen2")
    config.vocab_size, config.pad_token_id, config.eos_token_id = len(chat_tok), chat_tok.pad_token_id, None
    config.bos_token_id = None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    prompt = type("P", (), {"text": "Play.", "raw": "Play.", "label": None, "ids": [], "record": None})()
    runs = {}
    for keep in (True, False):
        engine = HFEngine(model, chat_tok, keep_turns=keep)
        executor = ToolExecutor(environment_factory=text_env(TalkEnv), overlap=overlap)
        trajs = executor.run(engine, chat_tok, [prompt, prompt], PARAMS, TokenBudget(5, 200, 3), seeds=[3, 4])
        runs[keep] = trajs, engine
    _same(runs[True][0], runs[False][0])
    assert all(t.info["turns"] == 3 for t in runs[True][0])
    assert runs[True][1].turns.reused_tokens > 0 and runs[True][1].turns.kept == {}
