"""The HF engine's one-token attention on the CPU: the query heads grouped over their shared key /
value head (eager attention's numbers, without copying K/V per head), registered with transformers
under its own name and swapped in for SDPA while the engine decodes."""

from __future__ import annotations

import contextlib
import functools

import torch

from rlhfkit.models.logprobs import attention_implementation

DECODE_ATTENTION = "rlhfkit_cpu_decode"


def decode_attention(model: torch.nn.Module):
    """On CPU, swap a model's SDPA attention for `cpu_decode_attention` while the engine decodes: only
    for a model whose attention layers call transformers' attention interface (its
    `_supports_attention_backend`); one that compares `config._attn_implementation` with "sdpa" in its
    own code (Falcon) would take its eager branch under another name, over a mask made for SDPA."""
    config = getattr(model, "config", None)
    device = next(model.parameters()).device
    if (config is None or device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa"
            or not getattr(model, "_supports_attention_backend", False)):
        return contextlib.nullcontext()
    register_decode_attention()
    return attention_implementation(model, DECODE_ATTENTION)


@functools.cache
def register_decode_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(DECODE_ATTENTION, cpu_decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)  # the boolean masks SDPA gets


# Attention arguments that change the math beyond scores, mask and softmax: such calls go to SDPA
# (which applies them or refuses them as it does without the engine).
_NOT_PLAIN_ATTENTION = ("softcap", "s_aux", "sinks")


def cpu_decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of one new token per row against the KV cache, as eager attention computes it
    (scores, float32 softmax, weighted values) with the query heads grouped over their shared
    key/value head instead of copying K/V per head. torch's CPU SDPA kernel took ~1.5 ms per
    layer per decode step for SmolLM2's [128, 9, 1, 64] queries, this ~0.4 ms (17% of a rollout).
    Prefill (more than one query position), dropout and attention with soft-capping or sinks go
    to transformers' SDPA unchanged. Sliding windows are in the mask (and the cache)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    special = any(kwargs.get(name) is not None for name in _NOT_PLAIN_ATTENTION)
    if q_len != 1 or dropout or heads % kv_heads or special:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = dim**-0.5 if scaling is None else scaling
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # query head h reads key/value head h // group
    scores = torch.matmul(q, key.transpose(-1, -2)) * scale  # [B, KV, group, L]
    if attention_mask is not None:  # boolean [B, 1 or heads, 1, L] (True = attend) or additive float
        mask = attention_mask[:, :, :, : key.shape[-2]]
        if mask.shape[1] != 1:  # a mask of each query head (Doge's dynamic mask): grouped as the queries
            mask = mask.reshape(batch, kv_heads, heads // kv_heads, mask.shape[-1])
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    # eager casts to the query's dtype and autocast then to its own: straight to the values' (the same)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, KV, group, Dv] (Dv may differ from the query's D)
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None
