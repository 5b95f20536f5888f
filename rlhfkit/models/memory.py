"""Parameter count and a memory estimate of an RL run, from a HF `config.json` alone.

Counts are exact for Llama-style decoders (Llama, Qwen2, Mistral, SmolLM2: q/k/v/o projections,
a gated MLP, RMSNorm; `attention_bias` adds q/k/v/o biases as Llama does). The memory terms are estimates of
what one process holds at its peak; they name the assumption each makes:

  weights      parameters x bytes of --actor.dtype (actor; + reference when KL > 0; + critic for gae)
  gradients    trainable parameters x bytes of the parameter dtype
  optimizer    AdamW: two moments per trainable parameter, in the parameter dtype (torch.optim.AdamW)
  activations  one training micro-batch kept for backward, no activation checkpointing: per layer
               and token ~ 6h + 2*kv + 4*i values (norm inputs, q/k/v, attention output, residuals,
               gate/up/act/product) + heads*T attention probabilities (eager/math attention), in the
               compute dtype; plus the fp32 logits and log-softmax of the response positions
               (2 x T x vocab x 4 bytes per sequence)
  autocast     bf16 copies of the weights that torch.autocast caches during a forward pass, when the
               compute dtype differs from the parameter dtype (parameters x 2 bytes)
  kv_cache     rollout: 2 (k, v) x layers x kv_heads x head_dim x bytes, per token of every
               sequence decoded together (no prefix sharing; an upper bound)
  peak         weights + optimizer + autocast + max(gradients + activations, kv_cache): rollout
               and update take turns. The Python/torch runtime itself (~0.25 GB RSS) is not counted.

Imports nothing internal; plain integers in, plain integers out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GiB = 1024**3

# SmolLM2-135M-Instruct's config.json (the fields this module reads), for `smollm2` before it is
# converted into the cache.
SMOLLM2_CONFIG = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
    "attention_bias": False, "max_position_embeddings": 8192,
}


def _dims(cfg: Mapping[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    try:
        h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
        heads, vocab = cfg["num_attention_heads"], cfg["vocab_size"]
    except KeyError as e:
        raise ValueError(f"config.json has no {e.args[0]!r}; only Llama-style decoders are estimated") from e
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or h // heads
    return h, i, n, heads, kv_heads, head_dim, vocab


def count_params(cfg: Mapping[str, Any]) -> int:
    """Parameters of a Llama-style causal LM described by `cfg` (a config.json mapping)."""
    h, i, n, heads, kv, d, vocab = _dims(cfg)
    attn = h * heads * d + 2 * h * kv * d + heads * d * h
    if cfg.get("attention_bias"):
        attn += heads * d + 2 * kv * d + h  # q, k, v and o_proj biases (Llama)
    layer = attn + 3 * h * i + 2 * h
    embed = vocab * h
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * h
    return embed + n * layer + h + head


def critic_params(cfg: Mapping[str, Any]) -> int:
    """The critic: the backbone without the LM head, plus a value head (Linear(h, 1) with bias)."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * h
    return count_params(cfg) - head + h + 1


def activation_bytes(cfg: Mapping[str, Any], seqs: int, seq_len: int, response_len: int, compute_bytes: int) -> int:
    """Activations kept for backward by `seqs` sequences of `seq_len` tokens (see module doc)."""
    h, i, n, heads, kv, d, vocab = _dims(cfg)
    per_token_layer = 6 * h + 2 * kv * d + 4 * i + heads * seq_len
    layers = n * seqs * seq_len * per_token_layer * compute_bytes
    logits = 2 * seqs * response_len * vocab * 4
    return layers + logits


def kv_cache_bytes(cfg: Mapping[str, Any], seqs: int, seq_len: int, compute_bytes: int) -> int:
    """KV cache of `seqs` sequences of `seq_len` tokens decoded together."""
    _, _, n, _, kv, d, _ = _dims(cfg)
    return 2 * n * kv * d * seqs * seq_len * compute_bytes


def memory_estimate(
    cfg: Mapping[str, Any],
    *,
    param_dtype: str,
    compute_dtype: str,
    micro_batch_size: int,
    decode_batch: int,
    prompt_len: int,
    max_new_tokens: int,
    with_ref: bool,
    with_critic: bool,
    params: int | None = None,
    frozen: int = 0,
    extra_activations: int = 0,
) -> dict[str, int]:
    """Bytes per term (weights, gradients, optimizer, activations, kv_cache) and the peak,
    weights + optimizer + autocast + max(gradients + activations, kv_cache).

    The critic, when present, adds its weights, gradients, AdamW state and activations (without
    the logits term: it has no LM head). A vision-language model: `cfg` is its text config,
    `params` all its parameters (default: count_params(cfg)), `frozen` the ones that get no gradients
    (a frozen vision tower), `extra_activations` the vision tower's activations kept for backward.
    """
    pb, cb = BYTES[param_dtype], BYTES[compute_dtype]
    p = count_params(cfg) if params is None else params
    trainable = p - frozen + (critic_params(cfg) if with_critic else 0)
    seq = prompt_len + max_new_tokens
    act = activation_bytes(cfg, micro_batch_size, seq, max_new_tokens, cb) + extra_activations
    if with_critic:
        act += activation_bytes(cfg, micro_batch_size, seq, 0, cb)
    out = {
        "weights": (p * (2 if with_ref else 1) + (critic_params(cfg) if with_critic else 0)) * pb,
        "gradients": trainable * pb,
        "optimizer": 2 * trainable * pb,
        "activations": act,
        "autocast": p * cb if compute_dtype != param_dtype else 0,
        "kv_cache": kv_cache_bytes(cfg, decode_batch, seq, cb),
    }
    # Rollout and update do not overlap: the KV cache is freed before the backward passes.
    out["peak"] = (out["weights"] + out["optimizer"] + out["autocast"]
                   + max(out["gradients"] + out["activations"], out["kv_cache"]))
    return out
