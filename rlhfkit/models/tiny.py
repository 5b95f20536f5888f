"""Tiny random causal LMs of several architectures and a character-level tokenizer, built in
code, for tests and demos.

Nothing is read from a hub or from disk. `tiny_model_and_tokenizer(arch=...)` builds a 2-layer
model of any architecture in `ARCHITECTURES` (random weights, small sizes) whose distinctive
parts act even at these sizes: sliding windows narrower than a test's rows, soft-capped
attention and logits, partial rotary embeddings, absolute positions, a head with a bias. The tokenizer has one token per
character of a small alphabet (digits, letters, arithmetic and punctuation, space, newline) plus <pad>, <bos>, <eos>,
and a minimal chat template so `apply_chat_template` works. Both round-trip through
`save_pretrained` / `from_pretrained`.
"""

from __future__ import annotations

import string

import torch

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
ALPHABET = string.digits + string.ascii_letters + " \n+-*/=()?!.,:;'\"<>|_#%"

# One turn per message, closed by EOS; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '" + EOS + "' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def tiny_tokenizer():
    """A char-level `PreTrainedTokenizerFast` over `ALPHABET` with <pad>/<bos>/<eos>/<unk>.

    Padding side is left to callers (default right). Vocab size = 4 + len(ALPHABET).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split into single characters (each character is its own "word").
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
    )
    return tok


# ---------------------------------------------------------------------- architectures
# Each builder gets the shared sizes and returns (config class name, config kwargs). Every model
# gets the same tokenizer; the sizes below are the `tiny_model_and_tokenizer` defaults.

MOE_EXPERTS = 4  # experts per MoE layer of the tiny mixture-of-experts models
SLIDING_WINDOW = 8  # narrower than the rows of a test, so a lost window changes the numbers


def _llama(s):
    return "LlamaConfig", {**_decoder(s)}


def _qwen2(s):  # biases on q/k/v
    return "Qwen2Config", {**_decoder(s)}


def _qwen3(s):  # q/k RMSNorm; a head_dim that is not hidden / heads
    return "Qwen3Config", {**_decoder(s), "head_dim": 2 * s["hidden"] // s["heads"]}


def _mistral(s):  # every layer a sliding window
    return "MistralConfig", {**_decoder(s), "sliding_window": SLIDING_WINDOW}


def _phi3(s):  # fused qkv and gate_up projections
    return "Phi3Config", {**_decoder(s), "sliding_window": None}


def _gemma2(s):  # sliding / full layers, soft-capped attention and logits, tied head, sqrt(H) embedding scale
    return "Gemma2Config", {
        **_decoder(s), "head_dim": s["hidden"] // s["heads"], "query_pre_attn_scalar": 8,
        "sliding_window": SLIDING_WINDOW, "layer_types": _alternating(s["layers"]),
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
        "tie_word_embeddings": True,
    }


def _gemma3(s):  # sliding / full layers with their own RoPE bases, q/k norm, tied head
    return "Gemma3TextConfig", {
        **_decoder(s), "head_dim": s["hidden"] // s["heads"], "query_pre_attn_scalar": 8,
        "sliding_window": SLIDING_WINDOW, "layer_types": _alternating(s["layers"]), "tie_word_embeddings": True,
    }


def _gpt_neox(s):  # partial rotary (25%), parallel residual, biases, no GQA
    return "GPTNeoXConfig", {
        "hidden_size": s["hidden"], "intermediate_size": s["intermediate"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "max_position_embeddings": s["max_positions"],
        "tie_word_embeddings": s["tie"],
    }


def _gpt2(s):  # learned absolute positions, Conv1D projections, tied head, per-layer attention scale
    return "GPT2Config", {
        "n_embd": s["hidden"], "n_inner": s["intermediate"], "n_layer": s["layers"], "n_head": s["heads"],
        "n_positions": s["max_positions"], "scale_attn_by_inverse_layer_idx": True,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    }


def _phi(s):  # an LM head with a bias, partial rotary, LayerNorm
    return "PhiConfig", {
        **_decoder(s), "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    }


def _granite(s):  # logits divided by logits_scaling after the head, muP-style multipliers
    return "GraniteConfig", {**_decoder(s), "logits_scaling": 4.0, "embedding_multiplier": 2.0,
                             "residual_multiplier": 0.5, "attention_multiplier": 0.25}


def _lfm2(s):  # a short-convolution layer before an attention layer (a hybrid cache)
    return "Lfm2Config", {**_decoder(s), "layer_types": ["conv", "full_attention"][: s["layers"]] + [
        "full_attention"] * max(0, s["layers"] - 2), "block_auto_adjust_ff_dim": False}


def _bloom(s):  # ALiBi position biases built from the 2-D mask, no position ids
    return "BloomConfig", {"hidden_size": s["hidden"], "n_layer": s["layers"], "n_head": s["heads"],
                           "tie_word_embeddings": s["tie"]}


def _rwkv(s):  # recurrent: no attention, no KV cache, no position ids
    return "RwkvConfig", {"hidden_size": s["hidden"], "num_hidden_layers": s["layers"],
                          "attention_hidden_size": s["hidden"], "intermediate_size": s["intermediate"],
                          "context_length": s["max_positions"], "tie_word_embeddings": s["tie"]}


def _falcon(s):  # its own SDPA call (not transformers' attention interface), parallel attention + MLP, GQA
    return "FalconConfig", {"hidden_size": s["hidden"], "num_hidden_layers": s["layers"],
                            "num_attention_heads": s["heads"], "num_kv_heads": s["kv_heads"],
                            "new_decoder_architecture": True, "ffn_hidden_size": s["intermediate"],
                            "max_position_embeddings": s["max_positions"], "tie_word_embeddings": s["tie"]}


def _falcon_h1(s):  # a Mamba-2 mixer beside attention in every layer (one cache layer holds both), muP multipliers
    return "FalconH1Config", {**_decoder(s), "head_dim": s["hidden"] // s["heads"], "mamba_d_ssm": 32,
                              "mamba_n_heads": 4, "mamba_d_head": 8, "mamba_d_state": 8, "mamba_chunk_size": 16,
                              "lm_head_multiplier": 0.5}


def _qwen3_next(s):  # gated DeltaNet (recurrent) layers beside full attention, a sparse MoE with a shared expert
    return "Qwen3NextConfig", {**_decoder(s), "head_dim": 16, "layer_types": ["linear_attention", "full_attention"] * (
        s["layers"] // 2) + ["linear_attention"] * (s["layers"] % 2), "linear_num_value_heads": 4,
        "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "num_experts": MOE_EXPERTS, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32}


def _gpt_oss(s):  # attention sinks, sliding / full layers, a biased sparse MoE; masks without position_ids
    return "GptOssConfig", {**_decoder(s), "head_dim": 16, "num_local_experts": MOE_EXPERTS, "num_experts_per_tok": 2,
                            "sliding_window": SLIDING_WINDOW, "layer_types": _alternating(s["layers"])}


def _qwen3_moe(s):  # sparse MoE: 4 experts, top 2 (normalised), every layer; q/k norm
    return "Qwen3MoeConfig", {**_decoder(s), "head_dim": 16, "num_experts": MOE_EXPERTS, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 32, "decoder_sparse_step": 1, "norm_topk_prob": True}


def _mixtral(s):  # sparse MoE: 4 experts, top 2, every layer
    return "MixtralConfig", {**_decoder(s), "num_local_experts": MOE_EXPERTS, "num_experts_per_tok": 2}


def _deepseek_v3(s):  # DeepSeek-V3: a dense first layer, then routed experts beside a shared one (sigmoid router
    # with a bias for the choice), multi-head latent attention (as many key/value heads as query heads)
    return "DeepseekV3Config", {**_decoder(s), "num_key_value_heads": s["heads"], "n_routed_experts": MOE_EXPERTS,
                                "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "kv_lora_rank": 16,
                                "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
                                "norm_topk_prob": True}


def _doge(s):  # a dynamic mask per query head (the attention mask has a head dimension), a sparse MoE of tiny experts
    return "DogeConfig", {**_decoder(s), "num_experts": MOE_EXPERTS, "num_experts_per_tok": 2}


def _llama4_text(s):  # chunked / full layers, no RoPE on the full ones, routed + shared experts; get_decoder() is
    # the LM itself (its base_model_prefix names no attribute)
    return "Llama4TextConfig", {**_decoder(s), "head_dim": s["hidden"] // s["heads"], "intermediate_size_mlp":
                                s["intermediate"], "num_local_experts": MOE_EXPERTS, "num_experts_per_tok": 1,
                                "layer_types": ["chunked_attention", "full_attention"] * (s["layers"] // 2)
                                + ["chunked_attention"] * (s["layers"] % 2)}


def _modernbert_decoder(s):  # an LM head module called `decoder`, full / sliding layers, LayerNorm without biases
    return "ModernBertDecoderConfig", {k: v for k, v in _decoder(s).items() if k != "num_key_value_heads"}


def _roberta(s):  # an encoder as a decoder (is_decoder): its own positions start at pad_token_id + 1
    return "RobertaConfig", {"hidden_size": s["hidden"], "intermediate_size": s["intermediate"],
                             "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
                             "max_position_embeddings": s["max_positions"], "is_decoder": True,
                             "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                             "tie_word_embeddings": s["tie"]}


def _trocr(s):  # learned positions counted from a row's first column (no position ids): left padding shifts them
    return "TrOCRConfig", {"d_model": s["hidden"], "decoder_layers": s["layers"], "decoder_attention_heads": s["heads"],
                           "decoder_ffn_dim": s["intermediate"], "max_position_embeddings": s["max_positions"],
                           "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
                           "tie_word_embeddings": s["tie"]}


def _deepseek_v4(s):  # keys compressed in blocks of 4 / 8 tokens (counted from a row's first column, padding or
    # not) beside a sliding window, hyper-connections, routed experts
    return "DeepseekV4Config", {**_decoder(s), "head_dim": 16, "qk_rope_head_dim": 8, "q_lora_rank": 32,
                                "n_routed_experts": MOE_EXPERTS, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                "index_n_heads": 4, "index_head_dim": 16, "sliding_window": SLIDING_WINDOW,
                                "layer_types": ["heavily_compressed_attention", "compressed_sparse_attention"] * (
                                    s["layers"] // 2) + ["compressed_sparse_attention"] * (s["layers"] % 2),
                                "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}}


def _decoder(s) -> dict:
    return {
        "hidden_size": s["hidden"], "intermediate_size": s["intermediate"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "max_position_embeddings": s["max_positions"], "tie_word_embeddings": s["tie"],
    }


def _alternating(layers: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


ARCHITECTURES = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mistral": _mistral,
    "phi3": _phi3,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
    "phi": _phi,
    "granite": _granite,
    "lfm2": _lfm2,
    "bloom": _bloom,
    "rwkv": _rwkv,
    "falcon": _falcon,
    "falcon_h1": _falcon_h1,
    "gpt_oss": _gpt_oss,
    "qwen3_next": _qwen3_next,
    "qwen3_moe": _qwen3_moe,
    "mixtral": _mixtral,
    "deepseek_v3": _deepseek_v3,
    "doge": _doge,
    "llama4_text": _llama4_text,
    "modernbert_decoder": _modernbert_decoder,
    "roberta": _roberta,
    "trocr": _trocr,
    "deepseek_v4": _deepseek_v4,
}
MOE_ARCHITECTURES = ("qwen3_moe", "mixtral", "deepseek_v3")


def tiny_config(
    arch: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 512,
    tie_embeddings: bool = False,
    init_std: float = 0.1,
    **overrides,
):
    """The transformers config of a tiny `arch` model (see `ARCHITECTURES`) over `tiny_tokenizer`'s
    vocabulary; `overrides` are config fields set over the builder's (e.g. `sliding_window=64`)."""
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    tok = tiny_tokenizer()
    sizes = {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads, "intermediate": intermediate,
             "max_positions": max_positions, "tie": tie_embeddings}
    class_name, kwargs = ARCHITECTURES[arch](sizes)
    return getattr(transformers, class_name)(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        initializer_range=init_std,  # larger than the usual 0.02 so outputs are not near-uniform
        **{**kwargs, **overrides},
    )


def tiny_model_and_tokenizer(
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 512,
    tie_embeddings: bool = False,
    init_std: float = 0.1,
    arch: str = "llama",
    **overrides,
):
    """A randomly initialised causal LM of architecture `arch` (default a `LlamaForCausalLM`;
    see `ARCHITECTURES`), deterministic given `seed`, and its tokenizer (`tiny_tokenizer`).
    `overrides` are config fields (see `tiny_config`).

    The model is in fp32, eval mode, with transformers' default attention for the architecture.
    """
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.loading import eager_if_softcapped

    tok = tiny_tokenizer()
    config = tiny_config(arch, hidden, layers, heads, kv_heads, intermediate, max_positions, tie_embeddings, init_std,
                         **overrides)
    cpu_rng = torch.random.get_rng_state()
    try:  # seed only for the init, then give the caller's global RNG back untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.random.set_rng_state(cpu_rng)
    model.generation_config.pad_token_id = tok.pad_token_id
    return eager_if_softcapped(model).eval(), tok
