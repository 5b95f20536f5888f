"""The HF engine's bf16 forward over a copy of the weights (rollout.bf16_decode): under bf16
autocast it samples the tokens, with the logprobs (within bf16 rounding), that the model's own
forward under autocast gives; its copy follows the weights (an optimizer step, a loaded state) and is freed after a
generation; models it does not fit decode through their forward."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.precision import float32_residual, vectors_to_float32
from rlhfkit.rollout import bf16_decode
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.bf16_decode import (
    Bf16Decoder,
    _linear,
    bf16_decode_support,
    packed_kernels,
)
from rlhfkit.rollout.hf import HFEngine

TEXTS = ["What is 2+3?", "1+1=", "Hello there, how are you?"]
SEEDS = [11, 12, 13]


def _model(arch: str = "llama", **kw):
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch, **kw)
    return model.eval(), tok, [tok(t)["input_ids"] for t in TEXTS]


def _generate(model, tok, prompts, params, fast: bool):
    engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16, bf16_decode=fast)
    assert (engine._bf16 is not None) is fast
    return engine.generate(prompts, params, seeds=SEEDS)


def _assert_same(fast, plain):
    """The same tokens; logprobs within bf16's rounding (bit-identical on this project's CPU: oneDNN's
    packed and plain bf16 products may block their sums differently elsewhere)."""
    for a, b in zip(fast, plain, strict=True):
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=2e-3)


@pytest.fixture
def counted(monkeypatch):
    """How many forwards the bf16 copy ran."""
    calls = {"n": 0}
    forward = Bf16Decoder.forward

    def wrapped(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Bf16Decoder, "forward", wrapped)
    return calls


@pytest.mark.parametrize("arch,kw", [("llama", {}), ("llama", {"tie_embeddings": True}), ("qwen2", {})])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_samples_what_the_models_autocast_forward_samples(arch, kw, temperature, counted):
    model, tok, prompts = _model(arch, **kw)
    params = SamplingParams(max_new_tokens=20, temperature=temperature, n=3)
    fast = _generate(model, tok, prompts, params, True)
    steps = counted["n"]
    plain = _generate(model, tok, prompts, params, False)
    assert steps >= 20 and counted["n"] == steps  # the prefill and every decode step ran on the copy
    _assert_same(fast, plain)


def test_bf16_parameters_with_a_float32_residual_decode_as_their_forward(counted):
    model, tok, prompts = _model()
    model.to(torch.bfloat16)
    vectors_to_float32(model)
    assert float32_residual(model)
    assert bf16_decode_support(model) is None  # the residual hook is the one hook it reads through
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=2)
    fast = _generate(model, tok, prompts, params, True)
    assert counted["n"] > 0
    _assert_same(fast, _generate(model, tok, prompts, params, False))


def test_the_copy_follows_the_weights_and_is_freed_after_a_generation():
    model, tok, prompts = _model()
    engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, n=2)
    engine.generate(prompts, params, seeds=SEEDS)
    assert not engine._bf16.ready  # freed: no copy held while the trainer updates the weights
    with torch.no_grad():  # an optimizer step's in-place writes
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    after = engine.generate(prompts, params, seeds=SEEDS)
    _assert_same(after, _generate(model, tok, prompts, params, False))
    # a partial generation: the weights change between two slices; the copy is rebuilt for the second
    gen = engine.start(prompts, params, seeds=SEEDS)
    assert engine.resume(gen, 4) is None and engine._bf16.ready
    stamp = engine._bf16.stamp
    model.load_state_dict({k: v + 0.01 for k, v in model.state_dict().items()})
    engine.resume(gen)
    assert engine._bf16.stamp is None  # released at the end, after a rebuild for the new weights
    assert stamp != engine._bf16._stamp()


def test_a_packed_stack_computes_what_each_linear_computes():
    torch.manual_seed(0)
    mods = [torch.nn.Linear(64, n, bias=True) for n in (64, 16, 16)]
    x = torch.randn(5, 3, 64).to(torch.bfloat16)
    for packed in (False, True) if packed_kernels() else (False,):
        stacked = _linear(mods, packed)
        want = torch.cat([torch.nn.functional.linear(x, m.weight.to(torch.bfloat16), m.bias.to(torch.bfloat16))
                          for m in mods], dim=-1)
        assert torch.equal(stacked(x), want)


@pytest.mark.parametrize("arch", ["qwen3", "gemma2", "phi3", "mistral", "gpt2"])
def test_other_architectures_decode_through_their_forward(arch, counted):
    model, tok, prompts = _model(arch)
    assert bf16_decode_support(model) is not None
    engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16)
    assert engine._bf16 is None
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=4, temperature=1.0, n=2), seeds=SEEDS[:1])
    assert counted["n"] == 0


def test_float32_and_hooked_models_decode_through_their_forward(counted):
    model, tok, _ = _model()
    assert HFEngine(model, tok)._bf16 is None  # float32: no autocast, no copy
    model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert "hooks" in bf16_decode_support(model)
    assert bf16_decode.SUPPORTED == ("LlamaForCausalLM", "Qwen2ForCausalLM")


def _reference_step(dec: Bf16Decoder, token, mask2d, position, cache):
    """A decode step over the copy as transformers' modules compute it: the norm modules, the model's own
    apply_rotary_pos_emb on q and k apart, the boolean mask inverted and filled in every layer."""
    import sys

    from rlhfkit.rollout.decode_attention import cpu_decode_attention

    backbone = dec.model.model
    rope = sys.modules[type(backbone.layers[0].self_attn).__module__].apply_rotary_pos_emb
    h = backbone.embed_tokens(token)
    mask = mask2d.bool()[:, None, None, :]
    cos, sin = backbone.rotary_emb(h, position)
    batch = token.shape[0]
    for layer, (qkv, o, gate_up, down), cache_layer in zip(backbone.layers, dec.layers, cache.layers, strict=True):
        attn, d = layer.self_attn, layer.self_attn.head_dim
        x = qkv(layer.input_layernorm(h).to(torch.bfloat16))
        q_width = attn.config.num_attention_heads * d
        kv_width = (x.shape[-1] - q_width) // 2
        q, k, v = (t.view(batch, 1, -1, d).transpose(1, 2) for t in x.split([q_width, kv_width, kv_width], -1))
        q, k = rope(q, k, cos, sin)
        k, v = cache_layer.update(k, v)
        out, _ = cpu_decode_attention(attn, q, k, v, mask, scaling=attn.scaling)
        h = h + o(out.reshape(batch, 1, -1))
        g, u = gate_up(layer.post_attention_layernorm(h).to(torch.bfloat16)).chunk(2, dim=-1)
        h = h + down(layer.mlp.act_fn(g) * u)
    return dec.head(backbone.norm(h[:, -1]).to(torch.bfloat16)).float()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_decode_step_is_the_modules_arithmetic_in_fewer_ops(arch):
    """Bit for bit the logits of the modules' ops (fused norm, q and k rotated together, the mask made once
    per step), in at most 87% of their aten calls (views included; on SmolLM2's 30 layers 1,952 against
    2,363)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rlhfkit.rollout.decode_attention import decode_attention
    from rlhfkit.rollout.kv_cache import new_cache

    class Count(TorchDispatchMode):
        def __init__(self, counts: list[int]):
            super().__init__()
            self.counts = counts
            counts.append(0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[-1] += 1
            return func(*args, **(kwargs or {}))

    model, _, _ = _model(arch, layers=8)  # enough layers for the per-layer ops to count more than the step's own
    dec = Bf16Decoder(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 6), generator=gen)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, :2] = 0  # a left-padded row
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16), decode_attention(model):
        dec.refresh()
        caches = [new_cache(model, 8), new_cache(model, 8)]
        for cache in caches:
            dec.forward(ids, mask, positions, cache)
        token, position = ids[:, -1:], positions[:, -1:]
        ours, theirs = [], []
        for _ in range(3):
            mask, position = torch.cat([mask, mask.new_ones(3, 1)], dim=1), position + 1
            with Count(ours):
                fast = dec.forward(token, mask, position, caches[0])
            with Count(theirs):
                want = _reference_step(dec, token, mask, position, caches[1])
            assert torch.equal(fast, want)
            token = fast.argmax(-1, keepdim=True)
    assert sum(ours) <= 0.87 * sum(theirs)
