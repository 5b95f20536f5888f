"""Logprob and entropy forward for padded batches, computing logits only where needed.

The backbone runs over the whole right-padded batch, but the LM head (the [*, V] matmul, the
largest activation in a small model) runs only at the R positions that predict response
tokens: `batch.response_positions()`, i.e. position P_b + j - 1 for response token j.
"""

from __future__ import annotations

import torch

from rlhfkit.core.losses import entropy_from_logits, logprobs_from_logits

# Config fields that mean the LM head is not a plain linear map of the last hidden state.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Pick hidden states at given positions: hidden [B, L, H], positions [B, R] -> [B, R, H]."""
    index = positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index)


def split_backbone(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(backbone, lm_head) of a decoder-only LM whose logits are `lm_head(last_hidden)`, else None."""
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    backbone, head = get_decoder(), get_head()
    if backbone is None or backbone is model or head is None:
        return None
    return backbone, head


def response_logits(model: torch.nn.Module, batch) -> torch.Tensor:
    """Logits [B, R, V] that predict each response token of `batch` (a TokenBatch, or a
    data.packing.PackedBatch whose single row holds all B samples).

    Llama-like models run backbone + LM head at the R gathered positions only; any other
    model falls back to a full forward and a gather.
    """
    positions = batch.response_positions().to(batch.input_ids.device)
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    if getattr(batch, "position_ids", None) is not None:  # a PackedBatch: one row, B samples
        inputs["position_ids"] = batch.position_ids
    rows = positions.shape[0]
    parts = split_backbone(model)
    if parts is None:
        logits = model(**inputs).logits
        return gather_positions(logits.expand(rows, -1, -1), positions)
    backbone, head = parts
    hidden = backbone(**inputs).last_hidden_state
    return head(gather_positions(hidden.expand(rows, -1, -1), positions))


def response_logprobs(
    model: torch.nn.Module,
    batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each response token under `model` at `temperature`, and optionally entropy.

    Args:
      batch: a right-padded `TokenBatch` (input_ids [B, L], response_ids [B, R], ...).
      temperature: logits are divided by it before the softmax (must be > 0); use the rollout
        temperature so the result matches the engine's logprobs.
    Returns:
      logp [B, R] float32 and entropy [B, R] float32 (or None). Differentiable. Entries where
      `batch.response_mask` is False are finite but meaningless.
    """
    logits = response_logits(model, batch)
    logp = logprobs_from_logits(logits, batch.response_ids, temperature=temperature)
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits.float() / temperature if temperature != 1.0 else logits)
    return logp, entropy
