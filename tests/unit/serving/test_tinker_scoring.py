"""serving.tinker.scoring: prompt logprobs and top-k rows from logits, with values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlhfkit.errors import DataError
from rlhfkit.serving.tinker.scoring import MAX_TOPK, check_topk, score, topk_rows
from rlhfkit.serving.tinker.wire import TOPK_MASK, SampleOptions

# A 3-token vocabulary whose logits depend only on the last input token: after token j the
# logits are LOGITS[j], so every position's distribution is known by hand.
LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]]))


def fake_forward(calls: list[int]):
    def forward(rows: list[list[int]]) -> torch.Tensor:
        calls.append(len(rows))
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        return LOGITS[ids]  # [b, W, 3]
    return forward


def test_topk_rows_best_first_and_sentinel_past_the_vocabulary():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]))
    two = topk_rows(logp, 2)
    assert two.ids.tolist() == [[0, 1], [1, 2]] and two.ids.dtype == np.int32
    np.testing.assert_allclose(two.logprobs, np.log([[0.5, 0.3], [0.6, 0.3]]), rtol=1e-6)
    five = topk_rows(logp, 5)  # k above the vocabulary: the last two cells stay empty
    assert five.ids[:, 3:].tolist() == [[0, 0], [0, 0]] and (five.logprobs[:, 3:] == TOPK_MASK).all()


def test_check_topk_bounds():
    assert check_topk(0, "k") == 0 and check_topk(MAX_TOPK, "k") == MAX_TOPK
    for bad in (-1, MAX_TOPK + 1, 2.0, True, "3"):
        with pytest.raises(DataError, match="give an integer from 0"):
            check_topk(bad, "topk_sample_logprobs")


def test_prompt_logprobs_and_topk_rows_by_hand():
    calls: list[int] = []
    prompt, samples = [0, 1, 2], [[1, 0], [2]]
    got = score(fake_forward(calls), prompt, samples, SampleOptions(True, 2, 1), temperature=2.0, batch_tokens=100)
    # prompt: p(1 | ..0) = 0.3, p(2 | ..1) = 0.3
    np.testing.assert_allclose(got.prompt_logprobs[1:], [math.log(0.3), math.log(0.3)], rtol=1e-6)
    assert math.isnan(got.prompt_logprobs[0])
    assert got.prompt_topk.ids.tolist() == [[0, 0], [0, 1], [1, 2]]
    assert (got.prompt_topk.logprobs[0] == TOPK_MASK).all()
    np.testing.assert_allclose(got.prompt_topk.logprobs[1:], np.log([[0.5, 0.3], [0.6, 0.3]]), rtol=1e-6)
    # samples at T = 2: after token j the distribution is LOGITS[j] / 2 renormalised
    def at_t2(j: int) -> np.ndarray:
        p = np.sqrt(np.exp(LOGITS[j].numpy()))
        return np.log(p / p.sum())
    first, second = got.sample_topk
    assert first.ids.tolist() == [[2], [1]]  # after prompt's last token 2, then after sampled 1
    np.testing.assert_allclose(first.logprobs[:, 0], [at_t2(2)[2], at_t2(1)[1]], rtol=1e-6)
    assert second.ids.tolist() == [[2]] and calls == [2]  # one forward of both samples' rows


def test_rows_cut_into_forwards_of_batch_tokens_and_nothing_asked_runs_none():
    calls: list[int] = []
    samples = [[1, 1, 1], [2, 2], [0, 0, 0, 0]]
    got = score(fake_forward(calls), [0, 1], samples, SampleOptions(topk_sample=1), temperature=1.0, batch_tokens=8)
    assert calls == [2, 1]  # rows of 4, 3 and 5 tokens: 2 x 4 fit in 8, then 1 x 5 alone
    assert [t.ids.shape for t in got.sample_topk] == [(3, 1), (2, 1), (4, 1)]
    assert got.prompt_logprobs is None and got.prompt_topk is None
    calls.clear()
    none = score(fake_forward(calls), [0, 1], samples, SampleOptions(), temperature=1.0, batch_tokens=8)
    assert calls == [] and none.sample_topk is None
    one = score(fake_forward(calls), [2], [[1]], SampleOptions(True, 3), temperature=1.0, batch_tokens=8)
    assert calls == [] and math.isnan(one.prompt_logprobs[0]) and one.prompt_topk.ids.shape == (1, 3)
