"""normalize_reward_output: every accepted form, and each way a result can be unusable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import RewardFn, RewardOutput, normalize_reward_output


def check(out, rewards, scores, extra=None):
    assert isinstance(out, RewardOutput)
    for t in [out.rewards, out.scores, *out.extra_logs.values()]:
        assert t.dtype == torch.float32 and t.ndim == 1
    torch.testing.assert_close(out.rewards, torch.tensor(rewards), rtol=0, atol=0)
    torch.testing.assert_close(out.scores, torch.tensor(scores), rtol=0, atol=0)
    assert sorted(out.extra_logs) == sorted(extra or {})
    for name, values in (extra or {}).items():
        torch.testing.assert_close(out.extra_logs[name], torch.tensor(values), rtol=0, atol=0)


@pytest.mark.parametrize(
    "value",
    [
        [1, 0.5, -2.0],
        (1.0, 0.5, -2.0),
        torch.tensor([1.0, 0.5, -2.0], dtype=torch.float64),
        np.array([1.0, 0.5, -2.0]),
        [torch.tensor(1.0), np.float32(0.5), np.int64(-2)],
    ],
)
def test_plain_forms_give_scores_equal_to_rewards(value):
    check(normalize_reward_output(value, 3, "f"), [1.0, 0.5, -2.0], [1.0, 0.5, -2.0])


def test_bool_and_int_tensors_become_float():
    check(normalize_reward_output(torch.tensor([True, False]), 2, "f"), [1.0, 0.0], [1.0, 0.0])
    check(normalize_reward_output(torch.tensor([3, -1]), 2, "f"), [3.0, -1.0], [3.0, -1.0])


def test_dict_form_with_scores_and_extra_logs():
    out = normalize_reward_output(
        {
            "rewards": torch.tensor([1.0, -1.0]),
            "scores": [1, 0],
            "extra_logs": {"format_ok": [1, 0], "acc": torch.tensor([1.0, 0.0]), "k": 2.5},
        },
        2,
        "f",
    )
    check(out, [1.0, -1.0], [1.0, 0.0], {"format_ok": [1.0, 0.0], "acc": [1.0, 0.0], "k": [2.5, 2.5]})


def test_dict_without_scores_copies_rewards():
    out = normalize_reward_output({"rewards": [0.25, 0.75]}, 2, "f")
    check(out, [0.25, 0.75], [0.25, 0.75])
    out.scores[0] = 9.0
    assert out.rewards[0] == 0.25  # not aliased


def test_reward_output_passes_through_checked():
    given = RewardOutput(torch.tensor([1.0]), torch.tensor([0.0]), {"x": torch.tensor([2.0])})
    check(normalize_reward_output(given, 1, "f"), [1.0], [0.0], {"x": [2.0]})
    bad = RewardOutput(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(RewardError, match="non-finite"):
        normalize_reward_output(bad, 1, "f")


def test_wrong_length_names_source_and_counts():
    with pytest.raises(RewardError, match=r"my_rm\.py returned 2 rewards for a batch of 3"):
        normalize_reward_output([1.0, 2.0], 3, "my_rm.py")
    with pytest.raises(RewardError, match=r"returned 1 scores for a batch of 2"):
        normalize_reward_output({"rewards": [1, 2], "scores": [1]}, 2, "f")
    with pytest.raises(RewardError, match=r"extra_logs\['acc'\]"):
        normalize_reward_output({"rewards": [1, 2], "extra_logs": {"acc": [1, 2, 3]}}, 2, "f")


@pytest.mark.parametrize("bad, index", [(float("nan"), 2), (float("inf"), 2), (-float("inf"), 2)])
def test_non_finite_names_source_and_index(bad, index):
    with pytest.raises(RewardError, match=rf"rm\.py returned a non-finite value in rewards at index {index}"):
        normalize_reward_output([0.0, 1.0, bad], 3, "rm.py")
    with pytest.raises(RewardError, match=rf"in scores at index {index}"):
        normalize_reward_output({"rewards": [0, 0, 0], "scores": torch.tensor([0, 1, bad])}, 3, "f")


def test_non_numbers_and_wrong_types():
    with pytest.raises(RewardError, match="str at index 1"):
        normalize_reward_output([1.0, "1.0"], 2, "f")
    with pytest.raises(RewardError, match="NoneType at index 0"):
        normalize_reward_output([None], 1, "f")
    with pytest.raises(RewardError, match="returned NoneType"):
        normalize_reward_output(None, 1, "f")
    with pytest.raises(RewardError, match="returned float"):
        normalize_reward_output(1.0, 1, "f")
    with pytest.raises(RewardError, match=r"without 'rewards' \(keys: \['reward'\]\)"):
        normalize_reward_output({"reward": [1.0]}, 1, "f")
    with pytest.raises(RewardError, match=r"shape \(2, 1\)"):
        normalize_reward_output(torch.zeros(2, 1), 2, "f")
    with pytest.raises(RewardError, match="extra_logs of type list"):
        normalize_reward_output({"rewards": [1.0], "extra_logs": [1.0]}, 1, "f")


def test_protocol_is_runtime_checkable():
    def fn(queries, prompts, labels, **kwargs):
        return normalize_reward_output([0.0] * len(queries), len(queries), "fn")

    assert isinstance(fn, RewardFn)
