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
