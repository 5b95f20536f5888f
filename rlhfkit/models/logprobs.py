"""Logprob and entropy forward over any batch layout, computing logits only where needed.

The backbone runs over the batch's rows (padded `TokenBatch`, packed `PackedBatch` or
`SharedPrefixBatch`, whose prompts are computed once per row), but the LM head (the [*, V]
matmul, the largest activation in a small model) runs only at the R positions that predict
response tokens: `batch.hidden_index()` (for a padded row, position P_b + j - 1 predicts
response token j).
"""

from __future__ import annotations

import contextlib

import torch

from rlhfkit.core.lm_head import linear_logprobs_and_entropy
from rlhfkit.core.losses import logprobs_and_entropy

# Config fields that mean the LM head is not a plain linear map of the last hidden state.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


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


def _plain_linear(head: torch.nn.Module | None) -> bool:
    """An LM head the fused logprob path may bypass: a bias-free nn.Linear with no hooks (FSDP
    gathers a sharded head's weight in a forward hook; LoRA and other wrappers are not Linear)."""
    return (type(head) is torch.nn.Linear and head.bias is None and not head._forward_pre_hooks
            and not head._forward_hooks)


def model_inputs(model: torch.nn.Module, batch) -> dict:
    """Keyword arguments of the forward over any batch layout: a padded `TokenBatch` (2-D mask),
    a one-row `PackedBatch` (position ids, no mask) or a `SharedPrefixBatch` (position ids and a
    4-D bool mask, handed to the attention as it is; converted to an additive float mask for
    eager attention, which adds it to the scores)."""
    device = next(model.parameters()).device  # batches are built on the CPU; the model may sit on a GPU
    mask = batch.attention_mask if batch.attention_mask is None else batch.attention_mask.to(device)
    inputs = {"input_ids": batch.input_ids.to(device), "attention_mask": mask, "use_cache": False}
    if getattr(batch, "position_ids", None) is not None:
        inputs["position_ids"] = batch.position_ids.to(device)
    if mask is not None and mask.dim() == 4 and getattr(model.config, "_attn_implementation", "") == "eager":
        dtype = next(model.parameters()).dtype
        inputs["attention_mask"] = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    return inputs


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str):
    """Inside, `model` runs its attention as `name` (a transformers attention implementation, e.g.
    "eager"); the one it had is restored after."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def attention_for(model: torch.nn.Module, batch):
    """Eager attention for a 4-D-masked (shared-prefix) batch on CPU: with a dense custom mask
    over short rows, torch's CPU SDPA kernel was slower than eager attention (forward + backward
    of SmolLM2 on 32 samples: 6.2 s eager vs 7.3 s SDPA, 1 thread; bench/). Elsewhere unchanged."""
    config = getattr(model, "config", None)
    mask = batch.attention_mask
    swap = (config is not None and getattr(config, "_attn_implementation", None) == "sdpa" and mask is not None
            and mask.dim() == 4 and mask.device.type == "cpu")
    return attention_implementation(model, "eager") if swap else contextlib.nullcontext()


def response_hidden(hidden: torch.Tensor, batch) -> torch.Tensor:
    """Outputs [B, R, H] at the positions that predict each response token, from the forward's
    [rows, L, H] outputs of any batch layout (`batch.hidden_index()` indexes the flattened rows)."""
    index = batch.hidden_index().to(hidden.device)
    return hidden.reshape(-1, hidden.shape[-1])[index]


def response_logits(model: torch.nn.Module, batch) -> torch.Tensor:
    """Logits [B, R, V] that predict each response token of `batch` (a TokenBatch, or a
    data.packing PackedBatch / SharedPrefixBatch).

    Llama-like models run backbone + LM head at the R gathered positions only; any other
    model falls back to a full forward and a gather.
    """
    parts = split_backbone(model)
    if parts is None:
        with attention_for(model, batch):
            return response_hidden(model(**model_inputs(model, batch)).logits, batch)
    backbone, head = parts
    return head(backbone_response_hidden(model, backbone, batch))


def backbone_response_hidden(model: torch.nn.Module, backbone: torch.nn.Module, batch) -> torch.Tensor:
    """The backbone's last hidden states [B, R, H] at the positions that predict response tokens
    (`model` holds the config: the LM itself, or the backbone for a critic)."""
    with attention_for(model, batch):
        return response_hidden(backbone(**model_inputs(model, batch)).last_hidden_state, batch)


def response_logprobs(
    model: torch.nn.Module,
    batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each response token under `model` at `temperature`, and optionally entropy.

    Args:
      batch: a `TokenBatch` (input_ids [B, L], response_ids [B, R], ...) or a data.packing layout.
      temperature: logits are divided by it before the softmax (must be > 0); use the rollout
        temperature so the result matches the engine's logprobs.
      entropy_grad: False computes the entropy without a graph (for a metric).
    Returns:
      logp [B, R] float32 and entropy [B, R] float32 (or None). Differentiable. Entries where
      `batch.response_mask` is False are finite but meaningless.
    """
    labels = batch.response_ids
    parts = split_backbone(model)
    head = parts[1] if parts is not None else None
    if _plain_linear(head) and not (with_entropy and entropy_grad):
        # LM head, log-softmax and entropy fused (core.losses.linear_logprobs_and_entropy): the
        # [R, V] logits never kept, the backward written by hand.
        hidden = backbone_response_hidden(model, parts[0], batch)
        return linear_logprobs_and_entropy(hidden, head.weight, labels.to(hidden.device), temperature,
                                           with_entropy=with_entropy)
    logits = response_logits(model, batch)
    return logprobs_and_entropy(logits, labels.to(logits.device), temperature, with_entropy=with_entropy,
                                entropy_grad=entropy_grad)
