"""verl's reward contract: `compute_score(data_source, solution_str, ground_truth, extra_info=None)` per sample
(or verl's batch manager's plural names), its float / bool / {"score": ...} results, the ground truth from the
label or verl's reward_model.ground_truth, from Python and as a reward file, unmodified."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CallableRewardFn, resolve_reward

PROMPTS = ["user: 1+1=<eos>assistant: ", "user: 2+2=<eos>assistant: ", "user: 3+3=<eos>assistant: "]
RESPONSES = ["2", "5", "6"]
QUERIES = [p + r for p, r in zip(PROMPTS, RESPONSES)]
RECORDS = [{"data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i}} for i in (1, 2, 3)]
KWARGS = dict(responses=RESPONSES, records=RECORDS, group_ids=torch.tensor([0, 1, 2]))


def call(fn, labels=(None, None, None), **over):
    return fn(QUERIES, PROMPTS, list(labels), **{**KWARGS, **over})


def gsm8k_like(data_source, solution_str, ground_truth, extra_info=None):
    """Shaped as verl's gsm8k compute_score: a float."""
    return 1.0 if solution_str.strip() == ground_truth else 0.0


def test_a_verl_function_is_called_per_sample_with_verls_arguments():
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return solution_str == ground_truth  # a bool, as some of verl's scorers return

    fn = resolve_reward(compute_score)
    assert isinstance(fn, CallableRewardFn) and fn.contract == "verl"
    assert call(fn).rewards.tolist() == [1.0, 0.0, 1.0]  # "2" == "2", "5" != "4", "6" == "6"
    assert seen == [("openai/gsm8k", r, str(2 * i), {"index": i}) for i, r in zip((1, 2, 3), RESPONSES)]
    # a label (--data.label_key) wins over the record's reward_model.ground_truth
    assert call(fn, labels=("2", "5", "7")).rewards.tolist() == [1.0, 1.0, 0.0]
    # as a reward server calls it: no records, each response its query past the prompt
    seen.clear()
    assert fn(QUERIES, PROMPTS, ["2", "4", "6"]).rewards.tolist() == [1.0, 0.0, 1.0]
    assert seen == [(None, r, g, None) for r, g in zip(RESPONSES, ["2", "4", "6"])]


def test_a_score_dict_gives_the_reward_and_logs_its_numbers_not_its_strings():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        right = solution_str == ground_truth
        return {"score": 1.0 if right else -1.0, "acc": right, "pred": solution_str}

    out = call(resolve_reward(compute_score))
    assert out.rewards.tolist() == [1.0, -1.0, 1.0] and out.scores.tolist() == [1.0, -1.0, 1.0]
    assert set(out.extra_logs) == {"acc"} and out.extra_logs["acc"].tolist() == [1.0, 0.0, 1.0]
    def no_score(solution_str, **kwargs):
        return {"acc": 1.0}

    with pytest.raises(RewardError, match=r"no_score returned a dict without 'score' for sample 0 "
                                          r"\(keys: \['acc'\]\); verl reads the reward from 'score'"):
        call(resolve_reward(no_score))


def test_batch_and_async_functions_and_only_the_names_a_function_takes():
    def compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        return [float(s == g) + e["index"] / 10 for s, g, e in zip(solution_strs, ground_truths, extra_infos)]

    async def slow(solution_str, ground_truth):
        return len(solution_str) + int(ground_truth)

    assert call(resolve_reward(compute_score)).rewards.tolist() == pytest.approx([1.1, 0.2, 1.3])
    assert call(resolve_reward(slow)).rewards.tolist() == [3.0, 5.0, 7.0]


def test_a_none_score_does_not_apply_within_a_list():
    def only_even(data_source, solution_str, ground_truth, extra_info=None):
        return None if extra_info["index"] % 2 else 10.0

    out = call(resolve_reward([only_even, gsm8k_like]))
    assert out.rewards.tolist() == [1.0, 10.0, 1.0]
    assert math.isnan(out.extra_logs["only_even"][0]) and out.extra_logs["only_even"][1] == 10.0


def test_a_missing_ground_truth_and_an_unfillable_parameter_are_refused_in_one_line():
    fn = resolve_reward(gsm8k_like)
    records = [RECORDS[0], {"data_source": "x"}, RECORDS[2]]
    with pytest.raises(RewardError, match=r"gsm8k_like \(verl's contract\) has no ground_truth for sample 1: .*"
                                          r"set --data.label_key"):
        call(fn, records=records)

    def needs_tokenizer(solution_str, ground_truth, tokenizer):
        return 0.0

    with pytest.raises(RewardError, match=r"needs_tokenizer \(verl's contract\) needs tokenizer, which rlhfkit does "
                                          r"not pass .*give it a default"):
        resolve_reward(needs_tokenizer)


def test_a_verl_reward_file_is_read_unmodified(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'pred': solution_str}\n")
    fn = resolve_reward(str(path))
    assert fn.contract == "verl" and fn.name == "my_reward"
    assert call(fn).rewards.tolist() == [1.0, 0.0, 1.0]
    (tmp_path / "none.py").write_text("def score(x):\n    return 0\n")
    with pytest.raises(RewardError, match=r"reward_func is not defined \(nor compute_score\); .*\(verl\) in it"):
        resolve_reward(str(tmp_path / "none.py"))
