"""Mixture-of-experts routing math: the router's load-balancing loss and the experts' load.

`load_balancing_loss` is the auxiliary loss of the Switch Transformer (Fedus et al. 2021,
arXiv:2101.03961, eq. 4) in the top-k form Mixtral uses, and what transformers'
`load_balancing_loss_func` returns as a MoE model's `aux_loss` (which OpenRLHF's `--aux_loss_coef`
weighs): with E experts, top-k routing and L MoE layers over N tokens,

    f_e = (assignments of tokens to expert e, over every layer) / (N * L)     (sums to k)
    P_e = (router probability softmax(logits)_e summed over tokens and layers) / (N * L)
    loss = E * sum_e f_e * P_e

f is counted (no gradient); the gradient flows through P into the router. Uniform routing gives
loss = k; concentrating the tokens on few experts raises it. Padding tokens (mask False) count nowhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def load_balancing_loss(router_logits: Sequence[torch.Tensor], top_k: int,
                        mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The load-balancing loss of one forward's routers (see the module docstring).

    Args:
        router_logits: one ``[N, E]`` tensor per MoE layer (N = tokens of the forward's rows, the
            same N for every layer), the router's logits before its softmax.
        top_k: experts chosen per token.
        mask: ``[N]`` bool, True = a real token (None: all are).

    Returns:
        ``(loss, metrics)``: ``expert_load`` ``[E]`` (each expert's share of the assignments, summing
        to 1; 1/E each when balanced) and ``load_max`` (the busiest expert's share times E: 1 when
        balanced, E when one expert takes every token).
    """
    num_experts = router_logits[0].shape[-1]
    counts = torch.zeros(num_experts, dtype=torch.float32, device=router_logits[0].device)
    probs = torch.zeros_like(counts)
    rows = counts.new_zeros(())
    for logits in router_logits:
        p = torch.softmax(logits.float(), dim=-1)
        w = torch.ones(p.shape[0], device=p.device) if mask is None else mask.reshape(-1).to(p.device, torch.float32)
        chosen = torch.topk(p, top_k, dim=-1).indices
        counts = counts + torch.zeros_like(counts).scatter_add_(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        probs = probs + (p * w.unsqueeze(-1)).sum(dim=0)
        rows = rows + w.sum()
    rows = rows.clamp(min=1)
    f, big_p = counts / rows, probs / rows
    load = (f / top_k).detach()
    return num_experts * (f * big_p).sum(), {"expert_load": load, "load_max": load.max() * num_experts}


# ------------------------------------------------------------------ routing replay (R3): the index math
# A token's recorded experts are stored as small integer codes [tokens, MoE layers, k]: uint8 for up to
# 254 experts, int16 above (DeepSeek-V3's 256); the type's two largest values are not experts:
#   missing_code  the engine did not record this token's experts: the trainer's router chooses them
#   skip_code     a token whose routing reaches no trained logprob (padding, a sample's last token):
#                 the router chooses, and it is not counted in the replay metrics


def expert_code_dtype(num_experts: int) -> torch.dtype:
    """The dtype of the expert codes of a model with `num_experts` routed experts."""
    return torch.uint8 if num_experts <= 254 else torch.int16


def missing_code(dtype: torch.dtype) -> int:
    """The code of a token whose experts the engine did not record."""
    return torch.iinfo(dtype).max


def skip_code(dtype: torch.dtype) -> int:
    """The code of a token whose routing reaches no trained logprob."""
    return torch.iinfo(dtype).max - 1


def replay_indices(own: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The experts a router uses under replay.

    Args:
        own: ``[N, k]`` long, the experts the router chose itself.
        codes: ``[N, k]`` the recorded expert codes of the same tokens (see above).

    Returns:
        ``(indices [N, k] long, replayed [N] bool, counted [N] bool)``: the recorded experts where they
        were recorded (``replayed``), the router's own elsewhere; ``counted``: the tokens that are not
        `skip_code` (the ones the replay metrics count).
    """
    first = codes[:, 0]
    replayed = first < skip_code(codes.dtype)
    counted = first != skip_code(codes.dtype)
    indices = torch.where(replayed.unsqueeze(-1), codes.long(), own)
    return indices, replayed, counted


def replayed_weights(logits: torch.Tensor, indices: torch.Tensor, kind: str, normalize: bool,
                     scale: float = 1.0) -> torch.Tensor:
    """The routing weights ``[N, k]`` (float32) of the experts `indices` ``[N, k]``, computed from the
    router's `logits` ``[N, E]`` as the router computes its own top-k weights, so the gradient reaches
    the router through them (Ma et al. 2025, arXiv:2510.11370, "R3": the recorded experts, the training
    router's weights):

        softmax (Mixtral, Qwen3-MoE):  w_j = p_{i_j},        p = softmax(logits)
        sigmoid (DeepSeek-V3):         w_j = s_{i_j} * scale, s = sigmoid(logits)

    with `normalize`, w_j is first divided by sum_j w_j (DeepSeek-V3 adds 1e-20 to that sum, as it does)."""
    if kind == "softmax":
        w = torch.softmax(logits.float(), dim=-1).gather(1, indices)
        return w / w.sum(dim=-1, keepdim=True) if normalize else w
    if kind == "sigmoid":
        w = torch.sigmoid(logits.float()).gather(1, indices)
        if normalize:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * scale
    raise ValueError(f"unknown router kind {kind!r}; choose softmax or sigmoid")


def changed_choices(own: torch.Tensor, recorded: torch.Tensor) -> torch.Tensor:
    """bool ``[N]``: whether the set of experts `own` ``[N, k]`` differs from `recorded` ``[N, k]``
    (the order within a token's k experts does not matter)."""
    return (own.sort(dim=-1).values != recorded.long().sort(dim=-1).values).any(dim=-1)


def merge_recorded(first: torch.Tensor | None, later: torch.Tensor | None, length: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """The codes ``[length, L, k]`` of a sequence computed in pieces (an agent episode's turns): each
    token keeps the experts of the first forward that recorded it (`first`, the earlier turns' codes),
    `later` fills the tokens it does not know, `missing_code` the rest. Either may be None or shorter
    (not both: the codes' shape comes from them)."""
    sample = first if first is not None else later
    if sample is None:
        raise ValueError("merge_recorded: first and later are both None; give at least one")
    out = torch.full((length, *sample.shape[1:]), missing_code(dtype), dtype=dtype)
    if later is not None:
        n = min(length, later.shape[0])
        out[:n] = later[:n]
    if first is not None:
        n = min(length, first.shape[0])
        known = (first[:n, :, :1] < skip_code(dtype))
        out[:n] = torch.where(known, first[:n], out[:n])
    return out
