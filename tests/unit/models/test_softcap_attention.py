"""A model whose attention soft-caps its scores (Gemma 2) runs eager attention: transformers 5.17's SDPA
attention dropped the soft-cap silently (logprobs 0.37 off), later releases refuse it."""

from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.loading import eager_if_softcapped


def test_a_soft_capped_model_runs_eager_attention():
    gemma2, _ = tiny_model_and_tokenizer(arch="gemma2")
    assert gemma2.config.attn_logit_softcapping and gemma2.config._attn_implementation == "eager"
    gemma2.config._attn_implementation = "sdpa"
    assert eager_if_softcapped(gemma2).config._attn_implementation == "eager"


def test_other_models_keep_their_attention():
    llama, _ = tiny_model_and_tokenizer()
    llama.config._attn_implementation = "sdpa"
    assert eager_if_softcapped(llama).config._attn_implementation == "sdpa"
