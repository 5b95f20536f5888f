"""maj@k and pass@k aggregation of the Evaluator, with values worked out by hand."""

from types import SimpleNamespace

import pytest
import torch

from rlhfkit.data.types import PromptItem
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.trainers.evaluate import (
    Evaluator,
    maj_at_k,
    normalize_answer,
    reward_verifier,
    task_metrics,
)


def test_maj_at_k_blocks_ties_and_missing_answers():
    answers = ["4", "5", "5", "4", None, None, "7", "4"]
    correct = [True, False, False, True, False, False, False, True]
    # k=4: block 1 votes 4:2, 5:2 -> tie, "4" seen first -> right; block 2 votes 7:1, 4:1 -> "7" -> wrong
    assert maj_at_k(answers, correct, 4) == 0.5
    # k=8: 4 gets 3 votes -> right
    assert maj_at_k(answers, correct, 8) == 1.0
    # k=1: each sample alone; None never right -> 3/8
    assert maj_at_k(answers, correct, 1) == 3 / 8
    assert maj_at_k([None, None], [False, False], 2) == 0.0


def test_task_metrics_over_prompts():
    # prompt 0: 1 of 4 right; prompt 1: 4 of 4 right
    correct = [False, True, False, False] + [True] * 4
    answers = ["1", "2", "1", "1"] + ["9"] * 4
    m = task_metrics(correct, answers, n=4, ks=(1, 2))
    assert m["eval/pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert m["eval/pass@2"] == pytest.approx((1 - 3 / 6 + 1.0) / 2)  # 1 - C(3,2)/C(4,2)
    assert m["eval/maj@2"] == pytest.approx((0.0 + 1.0) / 2)  # prompt 0: blocks (1,2) tie -> "1" wrong; (1,1) wrong
    assert m["eval/maj@1"] == m["eval/pass@1"]


def test_normalize_answer_compares_numbers_exactly():
    assert normalize_answer("12.0") == normalize_answer(12) == "12"
    assert normalize_answer("1,234") == "1234"
    assert normalize_answer("  x  y ") == "x y"
    assert normalize_answer(None) is None


def test_reward_verifier_and_training_reward_are_kept_apart():
    """A reward that pays for length is hacked; the verifier's pass@1 shows it."""
    items = [PromptItem("q:", [1], label="7")]

    def long_is_good(queries, prompts, labels, responses=None, **_):
        r = torch.tensor([min(len(s) / 10, 1.0) for s in responses])
        return RewardOutput(rewards=r, scores=r, extra_logs={})

    def exact(queries, prompts, labels, responses=None, **_):
        r = torch.tensor([float(s.strip() == lbl) for s, lbl in zip(responses, labels)])
        return RewardOutput(rewards=r, scores=r, extra_logs={})

    class Engine:  # returns fixed responses: the token ids are the characters
        version = 0

        def generate(self, prompts, params, generator=None, group_ids=None):
            texts = ["blah blah blah", "7"] * (params.n // 2)
            return [SimpleNamespace(response_ids=torch.tensor([ord(c) for c in t])) for _ in prompts for t in texts]

    class Tok:
        def batch_decode(self, ids, skip_special_tokens=True):
            return ["".join(map(chr, x)) for x in ids]

    from rlhfkit.trainers.evaluate import reward_score_fn
    ev = Evaluator(items, 8, -1, score_fn=reward_score_fn(long_is_good), n_samples=4, temperature=1.0,
                   ks=(1, 4), verifier=reward_verifier(exact))
    metrics, rows = ev.evaluate(Engine(), Tok())
    assert metrics["eval/reward"] == pytest.approx((1.0 + 0.1) / 2)
    assert metrics["eval/pass@1"] == pytest.approx(0.5)
    assert metrics["eval/pass@4"] == pytest.approx(1.0)
    assert metrics["eval/maj@4"] == 1.0  # "blah blah blah" has no answer, so it does not vote
    assert [r["correct"] for r in rows] == [False, True, False, True]


def test_eval_flags_top_p_and_top_k_reach_the_eval_rollout():
    """--eval.top_p / --eval.top_k (verl's val_kwargs) are evaluation's own: the engine is asked for them, not for
    the training rollout's --rollout.top_p / --rollout.top_k."""
    from rlhfkit.api.run_folder import make_evaluator
    from rlhfkit.config.parse import parse_config
    from rlhfkit.config.rl import RL_ALIASES, RLConfig

    asked = []

    class Engine:
        version = 0

        def generate(self, prompts, params, generator=None, group_ids=None):
            asked.append(params)
            return [SimpleNamespace(response_ids=torch.tensor([55])) for _ in prompts for _ in range(params.n)]

    class Tok:
        def batch_decode(self, ids, skip_special_tokens=True):
            return ["".join(map(chr, x)) for x in ids]

    cfg = parse_config(RLConfig, ["--eval.temperature", "0.6", "--eval.top_p", "0.7", "--eval.top_k", "20",
                                  "--eval.n_samples", "2", "--rollout.top_p", "0.9", "--rollout.top_k", "50"],
                       aliases=RL_ALIASES)
    make_evaluator(cfg, [PromptItem("q:", [1], label="7")]).evaluate(Engine(), Tok())
    (params,) = asked
    assert (params.temperature, params.top_p, params.top_k, params.n) == (0.6, 0.7, 20, 2)
