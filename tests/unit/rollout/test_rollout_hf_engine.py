"""HFEngine on a tiny Llama: greedy == model.generate, logprobs == the trainer's forward,
determinism, one prefill per prompt, stop tokens, chunking, weight updates."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.data.batch import collate
from rlhfkit.errors import ConfigError
from rlhfkit.models import response_logprobs, tiny_model_and_tokenizer
from rlhfkit.rollout.base import GenerationEngine, SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.sampling import truncate
from tests.unit.rollout.conftest import STOP


def _shape_recorder(model, shapes, rows_only=False):
    def hook(module, args, kwargs):
        shape = tuple(kwargs["input_ids"].shape)
        shapes.append(shape[0] if rows_only else shape)

    return model.register_forward_pre_hook(hook, with_kwargs=True)


def _hf_greedy(model, tok, prompts, max_new):
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    tok.padding_side = "right"
    out = model.generate(**enc, max_new_tokens=max_new, do_sample=False)
    return out[:, enc["input_ids"].shape[1] :]


def test_implements_protocol(tiny):
    assert isinstance(HFEngine(*tiny), GenerationEngine)


def test_greedy_equals_model_generate_left_padded(tiny, prompts):
    model, tok = tiny
    trajs = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    expected = _hf_greedy(model, tok, prompts, 12)
    assert len(trajs) == 3
    for traj, exp in zip(trajs, expected):
        assert traj.response_ids.tolist() == exp.tolist()
        assert traj.finish_reason == "length"
        assert traj.loss_mask.all() and traj.loss_mask.dtype == torch.bool
        assert not traj.logprobs.is_inference() and not traj.response_ids.is_inference()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=8, temperature=1.0, n=3),
        SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9, top_k=20, n=3),  # truncation ignored
        SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(STOP,)),  # greedy: logprob at T=1
        SamplingParams(max_new_tokens=8, temperature=0.9, n=3, repetition_penalty=1.5),  # the model's logprob
    ],
)
@pytest.mark.parametrize("per_prompt_seeds", [False, True], ids=["one_generator", "per_prompt_seeds"])
def test_logprobs_match_trainer_forward(tiny, prompts, params, per_prompt_seeds):
    model, tok = tiny
    engine = HFEngine(model, tok)
    if per_prompt_seeds:  # what the trainer uses
        trajs = engine.generate(prompts, params, seeds=[5, 6, 7])
    else:
        trajs = engine.generate(prompts, params, generator=torch.Generator().manual_seed(0))
    batch = collate(trajs, pad_id=tok.pad_token_id)
    logp, _ = response_logprobs(model, batch, temperature=params.temperature or 1.0)
    width = batch.response_ids.shape[1]
    engine_logp = torch.stack([torch.nn.functional.pad(t.logprobs, (0, width - t.response_length)) for t in trajs])
    m = batch.response_mask
    torch.testing.assert_close(engine_logp[m], logp[m], atol=1e-4, rtol=0)


def test_same_seed_same_samples_different_seed_different(tiny, prompts):
    engine = HFEngine(*tiny)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, n=2)

    def run(seed):
        return [t.response_ids.tolist() for t in engine.generate(prompts, params, torch.Generator().manual_seed(seed))]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_one_prefill_per_prompt_then_one_token_steps(tiny, prompts):
    model, tok = tiny
    shapes = []
    handle = _shape_recorder(model, shapes)
    try:
        HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=5, n=4), torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    width = max(len(p) for p in prompts)
    assert shapes[0] == (3, width)  # prefill: 3 unique prompts, not 12 rows
    assert 1 <= len(shapes) - 1 <= 4  # at most 4 decode steps for 5 tokens (fewer if all hit EOS)
    assert all(rows <= 12 and width == 1 for rows, width in shapes[1:])


def test_stop_tokens_kept_finished_rows_dropped_and_reasons(tiny, prompts):
    model, tok = tiny
    shapes = []
    handle = _shape_recorder(model, shapes, rows_only=True)
    try:
        params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(STOP,))
        trajs = HFEngine(model, tok).generate(prompts, params)
    finally:
        handle.remove()
    full = _hf_greedy(model, tok, prompts, 10)
    assert [t.response_length for t in trajs] == [4, 1, 10]
    assert [t.finish_reason for t in trajs] == ["stop", "stop", "length"]
    assert [t.truncated for t in trajs] == [False, False, True]
    for t, exp in zip(trajs, full):
        assert t.response_ids.tolist() == exp[: t.response_length].tolist()
    assert trajs[0].response_ids[-1] == trajs[1].response_ids[-1] == STOP
    assert shapes == [3, 2, 2, 2, 1, 1, 1, 1, 1, 1]  # row 1 leaves after step 0, row 0 after step 3


def test_eos_always_stops(prompts):
    model, tok = tiny_model_and_tokenizer(seed=0)
    with torch.no_grad():  # EOS ties token 13 and argmax takes the lower id: EOS replaces 13
        model.lm_head.weight[tok.eos_token_id] = model.lm_head.weight[STOP]
    trajs = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0))
    assert [t.response_length for t in trajs] == [4, 1, 10]
    assert [t.finish_reason for t in trajs] == ["stop", "stop", "length"]
    assert trajs[0].response_ids[-1] == tok.eos_token_id


def test_loop_ends_when_all_rows_stop(tiny, prompts):
    model, tok = tiny
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        params = SamplingParams(max_new_tokens=50, temperature=0.0, stop_token_ids=(STOP,))
        trajs = HFEngine(model, tok).generate(prompts[1:2], params)
    finally:
        handle.remove()
    assert trajs[0].response_length == 1 and len(calls) == 1


def test_top_k_1_and_tiny_top_p_equal_greedy(tiny, prompts):
    engine = HFEngine(*tiny)
    greedy_trajs = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    greedy = [t.response_ids.tolist() for t in greedy_trajs]
    for params in (SamplingParams(max_new_tokens=8, top_k=1, n=2), SamplingParams(max_new_tokens=8, top_p=1e-6, n=2)):
        sampled = [t.response_ids.tolist() for t in engine.generate(prompts, params, torch.Generator().manual_seed(5))]
        assert sampled == [g for g in greedy for _ in range(2)]


def test_truncate_by_hand():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])

    def keep(out):
        return torch.isfinite(out)[0].tolist()

    assert keep(truncate(logits, top_k=2, top_p=1.0)) == [True, True, False]
    assert keep(truncate(logits, top_k=-1, top_p=0.7)) == [True, True, False]  # 0.5 < 0.7 <= 0.8
    assert keep(truncate(logits, top_k=0, top_p=0.85)) == [True, True, True]
    assert keep(truncate(logits, top_k=0, top_p=0.5)) == [True, False, False]
    shuffled = logits[:, [2, 0, 1]]
    assert keep(truncate(shuffled, top_k=0, top_p=0.7)) == [False, True, True]


def test_groups_order_version_and_chunking(tiny, prompts):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=6, temperature=0.0, n=2)
    whole = HFEngine(model, tok, version=4).generate(prompts, params, group_ids=[7, 8, 9])
    assert [t.group_id for t in whole] == [7, 7, 8, 8, 9, 9]
    assert all(t.version == 4 for t in whole)
    assert [t.prompt_ids.tolist() for t in whole] == [p for p in prompts for _ in range(2)]
    for engine in (HFEngine(model, tok, max_batch_size=3), HFEngine(model, tok, max_batch_tokens=40)):
        chunked = engine.generate(prompts, params, group_ids=[7, 8, 9])
        assert [t.response_ids.tolist() for t in chunked] == [t.response_ids.tolist() for t in whole]
        assert [t.group_id for t in chunked] == [7, 7, 8, 8, 9, 9]


def test_chunks_respect_limits(tiny):
    engine = HFEngine(*tiny, max_batch_tokens=60)
    prompts = [[5] * 10, [5] * 2, [5] * 3, [5] * 20]
    # n=2, 10 new tokens: rows * (widest prompt + 10) <= 60, at least one prompt per chunk.
    assert list(engine._chunks(prompts, SamplingParams(max_new_tokens=10, n=2))) == [(0, 1), (1, 3), (3, 4)]
    engine = HFEngine(*tiny, max_batch_size=4)
    assert list(engine._chunks(prompts, SamplingParams(n=2))) == [(0, 2), (2, 4)]
    assert list(engine._chunks(prompts, SamplingParams(n=8))) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_eval_and_inference_mode_then_training_mode_restored(tiny, prompts):
    model, tok = tiny
    seen = []
    handle = model.register_forward_pre_hook(
        lambda mod, args: seen.append((mod.training, torch.is_inference_mode_enabled()))
    )
    model.train()
    try:
        HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=3))
    finally:
        handle.remove()
        training = model.training
        model.eval()
    assert training
    assert set(seen) == {(False, True)}


def test_update_weights_shared_and_partial(tiny, prompts):
    model, tok = tiny_model_and_tokenizer(seed=0)
    engine = HFEngine(model, tok)
    engine.update_weights({}, version=3)
    assert engine.version == 3
    new_head = torch.zeros_like(model.lm_head.weight)
    new_head[:, STOP] = 0  # all-zero logits: greedy picks id 0 everywhere
    engine.update_weights({"lm_head.weight": new_head}, version=4)
    assert torch.equal(model.lm_head.weight, new_head)
    trajs = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert trajs[0].version == 4 and trajs[0].response_ids.tolist() == [0, 0, 0]
    assert torch.allclose(trajs[0].logprobs, torch.full((3,), -math.log(len(tok))))
    with pytest.raises(ConfigError, match="lacks"):
        engine.update_weights({"not.a.weight": new_head}, version=5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bf16_and_fp16_autocast_run(tiny, prompts, dtype):
    """Under bf16 or fp16 autocast (fp16: GPUs without bf16) the engine samples with float32 logprobs, which
    match the float32 forward's within the dtype's rounding."""
    model, tok = tiny
    engine = HFEngine(model, tok, autocast_dtype=dtype)
    trajs = engine.generate(prompts, SamplingParams(max_new_tokens=4, n=2), torch.Generator().manual_seed(0))
    assert all(t.logprobs.dtype == torch.float32 and torch.isfinite(t.logprobs).all() for t in trajs)
    assert next(model.parameters()).dtype == torch.float32
    exact = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=4, n=2),
                                          torch.Generator().manual_seed(0))
    same = [(a, b) for a, b in zip(trajs, exact) if torch.equal(a.response_ids, b.response_ids)]
    assert len(same) >= 4  # the same samples (measured: 5 of 6 in bf16, 6 of 6 in fp16)
    # measured gaps: bf16 (8 bits of mantissa) up to 0.015, fp16 (11 bits) up to 0.0021: 8x finer spacing
    gap = max(float((a.logprobs - b.logprobs).abs().max()) for a, b in same)
    assert gap < (0.05 if dtype == torch.bfloat16 else 0.01), gap


def test_bad_inputs_raise_config_error(tiny):
    engine = HFEngine(*tiny)
    with pytest.raises(ConfigError, match="empty prompt"):
        engine.generate([[5], []], SamplingParams())
    with pytest.raises(ConfigError, match="group_ids"):
        engine.generate([[5]], SamplingParams(), group_ids=[1, 2])
    with pytest.raises(ConfigError, match="top_p"):
        engine.generate([[5]], SamplingParams(top_p=0.0))
    assert engine.generate([], SamplingParams()) == []


def test_growing_cache_layer_equals_transformers_dynamic_layer():
    """The in-place KV layer holds exactly what DynamicLayer's concatenation holds, through
    prefill, decode steps past its reserve, row expansion and row dropping."""
    from transformers.cache_utils import DynamicLayer

    from rlhfkit.rollout.kv_cache import growing_layer_class

    g = torch.Generator().manual_seed(0)
    ours, ref = growing_layer_class()(reserve=2), DynamicLayer()

    def step(n, rows):
        k, v = torch.randn(rows, 3, n, 4, generator=g), torch.randn(rows, 3, n, 4, generator=g)
        a, b = ours.update(k, v), ref.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    step(5, 2)  # prefill
    ours.batch_repeat_interleave(3)
    ref.batch_repeat_interleave(3)
    for _ in range(4):  # past the reserve of 2: the buffer grows
        step(1, 6)
    keep = torch.tensor([0, 2, 5])
    ours.batch_select_indices(keep)
    ref.batch_select_indices(keep)
    step(1, 3)
    assert ours.get_seq_length() == ref.get_seq_length() == 10


def test_cpu_decode_attention_equals_eager_attention_and_leaves_prefill_to_sdpa():
    """One query per row against a left-padded cache, 6 query heads over 2 key/value heads: the
    grouped computation gives eager attention's output (which copies K/V per head), for a boolean
    and an additive mask; several query positions (prefill) go to transformers' SDPA as they are."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from rlhfkit.rollout.decode_attention import cpu_decode_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, h, 1 if i == 0 else 7, 8, generator=g) for i, h in enumerate((6, 2, 2)))
    allowed = torch.ones(4, 1, 1, 7, dtype=torch.bool)
    allowed[1, ..., :3] = False  # row 1 is left-padded by 3
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=3, training=False, is_causal=True)
    want, _ = eager_attention_forward(module, q, k, v, additive, scaling=8**-0.5)
    for mask in (allowed, additive, None):
        got, weights = cpu_decode_attention(module, q, k, v, mask, scaling=8**-0.5)
        assert got.shape == (4, 1, 6, 8) and weights is None
        if mask is not None:
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    nomask, _ = eager_attention_forward(module, q, k, v, None, scaling=8**-0.5)
    torch.testing.assert_close(got, nomask, atol=1e-6, rtol=1e-6)
    # row 1 ignores its padded keys: changing them changes nothing
    k2 = k.clone()
    k2[1, :, :3] = 100.0
    torch.testing.assert_close(cpu_decode_attention(module, q, k2, v, allowed, scaling=8**-0.5)[0][1], want[1])
    prefill_q = torch.randn(4, 6, 7, 8, generator=g)
    causal = torch.ones(7, 7, dtype=torch.bool).tril().expand(4, 1, 7, 7)
    torch.testing.assert_close(cpu_decode_attention(module, prefill_q, k, v, causal)[0],
                               sdpa_attention_forward(module, prefill_q, k, v, causal)[0], atol=0, rtol=0)


def test_engine_decodes_with_the_grouped_attention_and_restores_sdpa(tiny, prompts):
    from rlhfkit.rollout import decode_attention as attention

    model, tok = tiny
    seen = []
    real = attention.cpu_decode_attention
    attention.register_decode_attention()
    from transformers import AttentionInterface

    AttentionInterface.register(attention.DECODE_ATTENTION,
                                lambda m, q, *a, **kw: seen.append(q.shape[2]) or real(m, q, *a, **kw))
    try:
        HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    finally:
        AttentionInterface.register(attention.DECODE_ATTENTION, real)
    layers = model.config.num_hidden_layers
    assert seen.count(1) == 2 * layers and len(seen) == 3 * layers  # prefill, then 2 one-token steps
    assert model.config._attn_implementation == "sdpa"


# ------------------------------------------------------------------ repetition penalty
def test_repetition_penalty_by_hand():
    from rlhfkit.rollout.sampling import penalize_repeats, sample, seen_tokens

    logits = torch.tensor([[2.0, -1.0, 1.5, 0.5]])
    seen = seen_tokens([[0, 1, 1]], 4, "cpu")
    assert seen.tolist() == [[True, True, False, False]]
    # seen: 2.0 / 2 = 1.0, -1.0 * 2 = -2.0; unseen kept
    assert penalize_repeats(logits, seen, 2.0).tolist() == [[1.0, -2.0, 1.5, 0.5]]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    tok, lp = sample(logits, greedy, None, seen=seen)
    assert tok.tolist() == [2]  # 1.5 now beats the penalised 1.0
    assert lp.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 2].item())  # the model's logprob
    assert sample(logits, SamplingParams(temperature=0.0), None, seen=seen)[0].tolist() == [0]  # penalty 1: off
    # sampled: the choice follows softmax of the penalised logits; u = 0.5 by hand
    probs = torch.softmax(torch.tensor([1.0, -2.0, 1.5, 0.5]), -1)
    want = int((probs.cumsum(-1) > 0.5).nonzero()[0])
    sampled = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    tok, lp = sample(logits, sampled, None, torch.tensor([0.5]), seen=seen)
    assert tok.tolist() == [want] and lp.item() == pytest.approx(torch.log_softmax(logits, -1)[0, want].item())


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_greedy_with_a_repetition_penalty_equals_model_generate(penalty):
    """transformers' RepetitionPenaltyLogitsProcessor over prompt + response, token for token (prompts of one
    length: transformers would also penalise the padding token of left-padded rows)."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    prompts = [[5, 9, 9, 14, 3, 7], [11, 2, 2, 2, 8, 30]]
    trajs = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=16, temperature=0.0,
                                                                  repetition_penalty=penalty))
    with torch.no_grad():
        expected = model.generate(torch.tensor(prompts), attention_mask=torch.ones(2, 6, dtype=torch.long),
                                  max_new_tokens=16, do_sample=False, repetition_penalty=penalty)[:, 6:]
        plain = model.generate(torch.tensor(prompts), attention_mask=torch.ones(2, 6, dtype=torch.long),
                               max_new_tokens=16, do_sample=False)[:, 6:]
    assert [t.response_ids.tolist() for t in trajs] == expected.tolist()
    assert expected.tolist() != plain.tolist()  # the penalty changed the greedy tokens
