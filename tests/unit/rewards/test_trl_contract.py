"""TRL's reward contract is detected the way TRL calls: by keywords. Any subset of TRL's names (and
dataset columns) plus **kwargs is a TRL reward function; TRL's own reward functions from trl.rewards
run unchanged when trl is importable, and hand-written look-alikes always."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CallableRewardFn, resolve_reward

RAW = ["What is 2+3?", "What is 2+3?"]
PROMPTS = [f"Q: {r}\nA:" for r in RAW]
RESPONSES = [" <think>add</think>5", " 6"]
QUERIES = [p + r for p, r in zip(PROMPTS, RESPONSES)]
IDS = [[5, 5, 5, 5, 5, 5, 5, 5, 5], [1, 2, 3, 4]]  # 9 and 4 tokens; the first repeats itself
KWARGS = dict(responses=RESPONSES, response_lengths=torch.tensor([9.0, 4.0]), group_ids=torch.tensor([0, 0]),
              completion_ids=IDS, raw_prompts=RAW, records=[{"solution": "5"}, {"solution": "5"}])


def call(fn, **over):
    return fn(QUERIES, PROMPTS, ["5", "5"], **{**KWARGS, **over}).rewards.tolist()


class SoftOverlong:
    """A look-alike of the callable trl.rewards.get_soft_overlong_punishment returns (DAPO's Eq. 13)."""

    __name__ = "soft_overlong"

    def __init__(self, max_len: int, cache: int):
        self.max_len, self.cache = max_len, cache

    def __call__(self, completion_ids, **kwargs):
        out = []
        for ids in completion_ids:
            n, start = len(ids), self.max_len - self.cache
            out.append(0.0 if n <= start else (start - n) / self.cache if n <= self.max_len else -1.0)
        return out


def test_completion_ids_and_kwargs_is_trl():
    fn = resolve_reward(SoftOverlong(10, 4))
    assert isinstance(fn, CallableRewardFn) and fn.contract == "trl"
    # 9 tokens: (6 - 9) / 4 = -0.75; 4 tokens: 0
    assert call(fn) == [-0.75, 0.0]


@pytest.mark.parametrize("func,expected", [
    (lambda prompts, **kw: [float(p.startswith("What")) for p in prompts], [1.0, 1.0]),
    (lambda completion_ids: [float(len(i)) for i in completion_ids], [9.0, 4.0]),
    (lambda **kwargs: [float(len(kwargs["completions"][i])) for i in range(2)], [20.0, 2.0]),
    (lambda completions, solution: [float(c.endswith(s)) for c, s in zip(completions, solution)], [1.0, 0.0]),
    (lambda *, completion_ids, trainer_state=None, **kw: [float(trainer_state is None)] * 2, [1.0, 1.0]),
], ids=["prompts+kwargs", "completion_ids", "kwargs-only", "completions+column", "keyword-only"])
def test_any_subset_of_trls_keywords_is_trl(func, expected):
    fn = resolve_reward(func)
    assert fn.contract == "trl"
    assert call(fn) == expected


def test_a_parameter_the_call_cannot_fill_is_refused_naming_the_columns():
    def needs(completion_ids, answer, **kwargs):
        return [0.0] * len(completion_ids)

    with pytest.raises(RewardError, match=r"needs answer, which is neither a keyword rlhfkit passes .* "
                                          r"\(the columns: solution\)"):
        call(resolve_reward(needs))

    def wants_state(completions, trainer_state):
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match="needs trainer_state"):
        call(resolve_reward(wants_state))


def test_what_fits_neither_contract_is_still_refused():
    def positional_only(completion_ids, /):
        return [0.0]

    def unnamed(texts, answers):
        return [0.0]

    for f in (positional_only, unnamed):
        with pytest.raises(RewardError, match="fits neither contract"):
            resolve_reward(f)


def test_trls_own_reward_functions_run_unchanged():
    rewards = pytest.importorskip("trl.rewards")
    overlong = resolve_reward(rewards.get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=4))
    assert overlong.contract == "trl" and call(overlong) == [-0.75, 0.0]
    repetition = resolve_reward(rewards.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0))
    # 9 equal tokens: 8 bigrams, 1 unique -> (1 - 1/8) * -1; 4 distinct tokens: 0
    assert call(repetition) == [pytest.approx(-0.875), 0.0]
    think = resolve_reward(rewards.think_format_reward)
    chats = [[{"role": "user", "content": r}] for r in RAW]
    # conversational prompts give assistant-message completions, as TRL's function expects
    assert call(think, raw_prompts=chats, responses=["<think>add</think>5", "6"]) == [1.0, 0.0]
