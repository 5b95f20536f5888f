"""Parameter count and memory estimate from a config.json, checked by hand and against torch."""

import pytest

from rlhfkit.models.memory import SMOLLM2_CONFIG, count_params, critic_params, memory_estimate

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=100, tie_word_embeddings=True)


def test_param_count_by_hand():
    # per layer: q 64*64 + k,v 2*64*32 + o 64*64 = 12288; MLP 3*64*96 = 18432; 2 norms 128
    assert count_params(TINY) == 100 * 64 + 2 * (12288 + 18432 + 128) + 64 == 68160
    assert count_params(SMOLLM2_CONFIG) == 134_515_008  # SmolLM2-135M
    assert critic_params(TINY) == 68160 + 64 + 1


@pytest.mark.parametrize("over", [{}, {"tie_word_embeddings": False, "attention_bias": True}])
def test_param_count_matches_transformers(over):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(TINY, **over)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


def test_memory_terms_by_hand():
    est = memory_estimate(TINY, param_dtype="float32", compute_dtype="float32", micro_batch_size=2,
                          decode_batch=3, prompt_len=6, max_new_tokens=4, with_ref=False, with_critic=False)
    # activations: per token and layer 6*64 + 2*32 + 4*96 + 4 heads * 10 tokens = 872 values;
    # 2 layers * 2 seqs * 10 tokens * 872 * 4 bytes = 139520; logits 2 * 2 seqs * 4 * 100 * 4 = 6400
    assert est["activations"] == 139520 + 6400
    assert est["kv_cache"] == 2 * 2 * 2 * 16 * 3 * 10 * 4 == 15360
    assert (est["weights"], est["gradients"], est["optimizer"]) == (272640, 272640, 545280)
    assert est["autocast"] == 0  # compute dtype = parameter dtype
    assert est["peak"] == 272640 + 545280 + max(272640 + 145920, 15360)


def test_ref_and_bf16_change_the_right_terms():
    kw = dict(compute_dtype="bfloat16", micro_batch_size=1, decode_batch=1, prompt_len=1, max_new_tokens=1)
    a = memory_estimate(TINY, param_dtype="bfloat16", with_ref=True, with_critic=False, **kw)
    assert a["weights"] == 2 * 68160 * 2 and a["optimizer"] == 2 * 68160 * 2
    c = memory_estimate(TINY, param_dtype="float32", with_ref=False, with_critic=True, **kw)
    assert c["gradients"] == (68160 + 68160 + 65) * 4
    assert c["autocast"] == 68160 * 2  # fp32 parameters, bf16 compute: autocast caches bf16 copies
    assert a["autocast"] == 0
