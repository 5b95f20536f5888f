"""HFEngine interruptible generation (partial rollouts): a generation resumed after m tokens gives
the uninterrupted one's tokens when the weights did not change, recomputes none of its first m
tokens (counted), and after a weight update continues from its KV state with each token stamped
with the version whose logits it was sampled from."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine

TEXTS = ["What is 2+3?", "1+1=", "Hello there, how are you?"]
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, n=2)


@pytest.fixture()
def engine():
    model, tok = tiny_model_and_tokenizer(seed=0)
    return HFEngine(model, tok, max_batch_size=4), [tok(t)["input_ids"] for t in TEXTS]


def count_tokens(model):
    """[tokens fed to the model] (prompt and decode positions of every forward, rows x length)."""
    seen = [0]
    model.register_forward_pre_hook(lambda m, a, kw: seen.__setitem__(0, seen[0] + kw["input_ids"].numel()),
                                    with_kwargs=True)
    return seen


def same(a, b):
    return all(torch.equal(x.response_ids, y.response_ids) and torch.equal(x.logprobs, y.logprobs)
               for x, y in zip(a, b))


@pytest.mark.parametrize("m", [1, 3, 7])
def test_resumed_after_m_tokens_equals_uninterrupted_and_recomputes_nothing(engine, m):
    eng, prompts = engine
    seen = count_tokens(eng.model)
    whole = eng.generate(prompts, PARAMS, seeds=[11, 12, 13])
    fed_whole = seen[0]
    seen[0] = 0
    gen = eng.start(prompts, PARAMS, seeds=[11, 12, 13])
    assert eng.resume(gen, max_new_tokens_this_call=m) is None  # chunk 1 (prompts 0-1, 4 rows) mid-way
    fed_first = seen[0]
    rest = eng.resume(gen)
    assert len(rest) == len(whole) == 6 and same(rest, whole)
    assert seen[0] == fed_whole  # the continuation fed only what the first call had not
    assert fed_first < fed_whole
    assert all(t.versions.tolist() == [0] * t.response_length for t in rest)


def test_sliced_to_the_end_in_any_budget_equals_generate_with_a_shared_generator(engine):
    eng, prompts = engine
    whole = eng.generate(prompts, PARAMS, generator=torch.Generator().manual_seed(5))
    gen = eng.start(prompts, PARAMS, generator=torch.Generator().manual_seed(5))
    calls, out = 0, None
    while out is None:
        out, calls = eng.resume(gen, max_new_tokens_this_call=2), calls + 1
    assert same(out, whole) and calls > 5  # two chunks of up to 10 steps, 2 per call


def test_a_weight_update_between_calls_is_used_by_the_later_tokens_stamped_with_its_version(engine):
    eng, prompts = engine
    gen = eng.start(prompts[:1], SamplingParams(max_new_tokens=8, temperature=0.0), seeds=[3])
    assert eng.resume(gen, max_new_tokens_this_call=3) is None
    with torch.no_grad():
        for p in eng.model.parameters():
            p.mul_(1.5)
    eng.update_weights({}, 1)  # the engine shares the module: a version bump
    (traj,) = eng.resume(gen)
    n = traj.response_length
    # tokens 0-2 from version 0; token 3 was sampled from logits computed before the update
    # (the forward after token 2), the later ones from version 1's
    assert traj.versions.tolist() == [0, 0, 0, 0] + [1] * (n - 4) and traj.version == 0
