"""Per-prompt seeds: a prompt's samples depend only on its ids, the weights and its seed, so any
sharding or ordering of the prompts over engines (or chunks) gives the same samples."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.agents.executor import episode_seeds
from rlhfkit.errors import ConfigError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.sampling import chunk_uniforms

TEXTS = ["What is 2+3?", "1+1=", "Hello there, how are you?", "abc", "7*7 is"]
STOP = 13  # finishes some rows early (see test_rollout_hf_engine), so groups shrink at different steps
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, n=3, stop_token_ids=(STOP,))
SEEDS = [11, 22, 33, 44, 55]


@pytest.fixture(scope="module")
def setup():
    model, tok = tiny_model_and_tokenizer(seed=0)
    return model, tok, [tok(t)["input_ids"] for t in TEXTS]


def _key(trajs):
    return [(t.response_ids.tolist(), t.finish_reason) for t in trajs]


def _by_prompt(trajs, n):
    return [_key(trajs[i * n:(i + 1) * n]) for i in range(len(trajs) // n)]


def test_chunk_uniforms_are_the_per_step_draws():
    """[p, t, s] is the s-th of the n uniforms prompt p's generator gave at its t-th per-step draw of n,
    the values the decode loop used when it drew at every step: the samples are the same."""
    seeds, max_new, n = (1, 2, 3), 5, 3
    u = chunk_uniforms([torch.Generator().manual_seed(s) for s in seeds], max_new, n)
    assert u.shape == (3, max_new, n)
    for p, seed in enumerate(seeds):
        g = torch.Generator().manual_seed(seed)
        for t in range(max_new):
            assert torch.equal(u[p, t], torch.rand(n, generator=g))


def test_same_samples_under_any_sharding_ordering_and_chunking(setup):
    model, tok, prompts = setup
    whole = HFEngine(model, tok).generate(prompts, PARAMS, seeds=SEEDS)
    ref = _by_prompt(whole, 3)
    assert len({str(r) for r in ref}) == len(ref)  # the prompts do get different samples
    # two shards, as an engine pool with 2 workers would split them
    a = HFEngine(model, tok).generate(prompts[:2], PARAMS, seeds=SEEDS[:2])
    b = HFEngine(model, tok).generate(prompts[2:], PARAMS, seeds=SEEDS[2:])
    assert _by_prompt(a + b, 3) == ref
    # reversed order, and one prompt at a time through chunking
    rev = HFEngine(model, tok).generate(prompts[::-1], PARAMS, seeds=SEEDS[::-1])
    assert _by_prompt(rev, 3)[::-1] == ref
    assert _by_prompt(HFEngine(model, tok, max_batch_size=3).generate(prompts, PARAMS, seeds=SEEDS), 3) == ref
    # a re-issued prompt alone regenerates exactly its samples, logprobs included
    again = HFEngine(model, tok).generate([prompts[3]], PARAMS, seeds=[SEEDS[3]])
    assert _key(again) == ref[3]
    for x, y in zip(again, whole[9:12]):  # a few float32 ulps: attention sums over other left padding
        torch.testing.assert_close(x.logprobs, y.logprobs, rtol=1e-6, atol=1e-6)


def test_seed_changes_only_its_prompt(setup):
    model, tok, prompts = setup
    ref = _by_prompt(HFEngine(model, tok).generate(prompts, PARAMS, seeds=SEEDS), 3)
    other = _by_prompt(HFEngine(model, tok).generate(prompts, PARAMS, seeds=SEEDS[:4] + [99]), 3)
    assert other[:4] == ref[:4] and other[4] != ref[4]


def test_greedy_ignores_seeds(setup):
    model, tok, prompts = setup
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, n=2)
    engine = HFEngine(model, tok)
    assert _key(engine.generate(prompts, greedy, seeds=SEEDS)) == _key(engine.generate(prompts, greedy))


def test_seed_count_checked(setup):
    model, tok, prompts = setup
    with pytest.raises(ConfigError, match="seeds has 1 entries for 5 prompts"):
        HFEngine(model, tok).generate(prompts, PARAMS, seeds=[1])


def test_episode_seeds_depend_on_the_prompt_seed_only():
    a = episode_seeds(7, 3, 4)
    assert len(a) == 3 and all(len(row) == 4 for row in a)
    assert a == episode_seeds(7, 3, 4) and a != episode_seeds(8, 3, 4)
    assert len({s for row in a for s in row}) == 12


def test_inverse_cdf_by_hand_never_picks_a_zero_probability_token():
    from rlhfkit.rollout.sampling import inverse_cdf

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]]).expand(5, -1)
    u = torch.tensor([0.0, 0.49, 0.5, 0.75, 0.999999])
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 3, 3]
    unnormalised = torch.tensor([[2.0, 0.0, 6.0]]).expand(3, -1)  # cdf 2, 2, 8: u*8 in [0,2) -> 0, else 2
    assert inverse_cdf(unnormalised, torch.tensor([0.2, 0.25, 0.9])).tolist() == [0, 2, 2]


def test_sampled_frequencies_follow_the_softmax():
    from rlhfkit.rollout.base import SamplingParams
    from rlhfkit.rollout.sampling import sample

    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0, -30.0]]).expand(40000, -1)
    tok, logp = sample(logits, SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))
    want = torch.softmax(logits[0] / 0.7, dim=-1)
    freq = torch.bincount(tok, minlength=5).float() / tok.numel()
    assert (freq - want).abs().max() < 0.01  # 40k draws: standard error < 0.0025
    torch.testing.assert_close(logp, torch.log(want)[tok])


def test_inverse_cdf_in_blocks_equals_the_whole_row_cumsum():
    """Blocks of 4 over 10 tokens (the last block padded): the token picked is the one a float64
    cumulative sum over the whole row picks, for uniforms on and around every boundary."""
    from rlhfkit.rollout.sampling import inverse_cdf

    probs = torch.tensor([0.1, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.4])  # blocks [.3, .3, .4] (2nd: only token 7)
    u = torch.tensor([0.0, 0.05, 0.1, 0.2999, 0.3, 0.3001, 0.5999, 0.6, 0.6001, 0.999999])
    picked = inverse_cdf(probs.expand(len(u), -1), u, block=4)
    whole = torch.searchsorted(probs.double().cumsum(0).expand(len(u), -1).contiguous(),
                               (u.double() * probs.double().sum()).unsqueeze(-1), right=True).squeeze(-1)
    assert picked.tolist() == whole.tolist() == [0, 0, 2, 2, 7, 7, 7, 9, 9, 9]
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 1000, generator=g) * 3, dim=-1)
    u = torch.rand(64, generator=g)
    whole = torch.searchsorted(p.double().cumsum(-1), (u.double() * p.double().sum(-1)).unsqueeze(-1), right=True)
    assert torch.equal(inverse_cdf(p, u, block=256), whole.squeeze(-1))
