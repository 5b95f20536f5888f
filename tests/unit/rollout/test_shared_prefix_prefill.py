"""HFEngine's shared-prefix prefill (rollout.prefix): prompts that start with the same tokens (a
system prompt) prefill those once per chunk; greedy tokens still equal model.generate's, sampled
tokens and logprobs equal the engine's without the sharing."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.prefix import shared_prefix_length

SYSTEM = "You are a careful assistant. Answer briefly and exactly. "
QUESTIONS = ["What is 2+3?", "1+1=", "Hello there, how are you today?", "Name a color."]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=0)


@pytest.fixture(scope="module")
def prompts(tiny):
    """QUESTIONS after one system prompt: they share its tokens."""
    return [tiny[1](SYSTEM + q)["input_ids"] for q in QUESTIONS]


def _prefill_rows(model):
    """Record the [rows, tokens] shape of every forward the model runs."""
    shapes: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    return shapes, hook


def test_shared_prefix_length_by_hand():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]], minimum=1) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]], minimum=1) == 2  # each keeps its last token
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]], minimum=3) == 0  # too short to be worth a forward
    assert shared_prefix_length([[1, 2, 3, 4]], minimum=1) == 0  # one prompt: prefilled once anyway


def test_greedy_equals_model_generate_and_prefix_runs_once(tiny, prompts):
    model, tok = tiny
    shared = shared_prefix_length(prompts)
    assert shared >= 8
    shapes, hook = _prefill_rows(model)
    try:
        trajs = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0))
    finally:
        hook.remove()
    assert shapes[0] == (1, shared)  # the prefix on one row
    assert shapes[1] == (len(prompts), max(len(p) for p in prompts) - shared)  # then each prompt's own tokens
    for p, traj in zip(prompts, trajs):  # each prompt alone: no padding anywhere in model.generate
        exp = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=10, do_sample=False)[0, len(p):]
        assert traj.response_ids.tolist() == exp.tolist()


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_sampled_tokens_and_logprobs_equal_the_unshared_prefill(tiny, prompts, autocast):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3)
    seeds = [11, 12, 13, 14]
    shared = HFEngine(model, tok, autocast_dtype=autocast).generate(prompts, params, seeds=seeds)
    plain = HFEngine(model, tok, autocast_dtype=autocast, share_prefix=False).generate(prompts, params, seeds=seeds)
    tol = 1e-5 if autocast is None else 5e-2
    for a, b in zip(shared, plain):
        assert a.response_ids.tolist() == b.response_ids.tolist()
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=tol, rtol=0)


def test_bf16_logprob_gap_to_the_trainer_no_worse_than_unshared(tiny, prompts):
    """rollout/logprob_gap_mean's quantity (|engine - trainer| over action tokens) under bf16 autocast."""
    from rlhfkit.data.batch import collate
    from rlhfkit.models import response_logprobs

    model, tok = tiny
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3)
    gaps = {}
    for share in (True, False):
        trajs = HFEngine(model, tok, autocast_dtype=torch.bfloat16, share_prefix=share).generate(
            prompts, params, seeds=[1, 2, 3, 4])
        batch = collate(trajs, tok.pad_token_id)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            trainer = response_logprobs(model, batch)[0].float()
        engine = torch.zeros_like(trainer)
        for i, t in enumerate(trajs):
            engine[i, : len(t.logprobs)] = t.logprobs
        mask = batch.loss_mask
        gaps[share] = float(((engine - trainer).abs() * mask).sum() / mask.sum())
    assert 0 < gaps[True] <= 1.25 * gaps[False], gaps
