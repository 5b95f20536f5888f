"""Mixture-of-experts models: finding their routers and recording what they do in a forward.

transformers' MoE models name the module whose output holds the router logits in
`_can_record_outputs["router_logits"]` (the class, and the index of the logits in its output): a
`...TopKRouter` returning (logits [N, E], weights [N, k], expert indices [N, k]) in Qwen3-MoE,
Mixtral, DeepSeek-V3 and the others, or the sparse block itself. `record_routing(model)` hooks those
modules for the duration of a `with` block and collects each call's logits and chosen experts, and
the 2-D attention mask the backbone was called with (the tokens that count); dense models record
nothing. `core.moe.load_balancing_loss` turns a record into the auxiliary loss and the experts' load.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from rlhfkit.core.moe import load_balancing_loss
from rlhfkit.models.logprobs import split_backbone, transformers_model


@dataclass
class Forward:
    """The router calls of one backbone forward: `logits` ([N, E] per MoE layer, in layer order),
    `experts` (their chosen experts [N, k], None where the router's output has none) and `mask` ([N]
    bool, the forward's 2-D attention mask flattened; None: every token counts)."""

    mask: torch.Tensor | None = None
    logits: list[torch.Tensor] = field(default_factory=list)
    experts: list[torch.Tensor | None] = field(default_factory=list)


@dataclass
class Routing:
    """What the routers of a model did in the forwards of a `record_routing` block; `top_k`: the
    model's experts per token."""

    top_k: int
    forwards: list[Forward] = field(default_factory=list)


def moe_top_k(model: torch.nn.Module) -> int | None:
    """Experts per token of a transformers MoE model (its config's num_experts_per_tok), else None."""
    config = getattr(transformers_model(model), "config", None)
    k = getattr(config, "num_experts_per_tok", None)
    return int(k) if k else None


def router_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int]]:
    """(module, index of the router logits in its output) of every router of `model`."""
    inner = transformers_model(model)
    recorders = [getattr(type(m), "_can_record_outputs", None) or {} for m in inner.modules()]
    spec = next((r["router_logits"] for r in recorders if "router_logits" in r), None)
    if spec is None:
        return []
    target, index = getattr(spec, "target_class", None), getattr(spec, "index", 0)
    return [(m, index) for m in inner.modules() if target is not None and isinstance(m, target)]


@contextlib.contextmanager
def record_routing(model: torch.nn.Module) -> Iterator[Routing | None]:
    """Record every router call of `model` inside the block (None for a dense model)."""
    k, routers = moe_top_k(model), router_modules(model)
    if not k or not routers:
        yield None
        return
    split_backbone(model)  # its one-time probe forwards run now, unrecorded
    routing = Routing(k)

    def backbone_pre(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        routing.forwards.append(Forward(mask.reshape(-1).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2
                                        else None))

    def router_post(index):
        def hook(module, args, output):
            out = output if isinstance(output, tuple) else (output,)
            if not routing.forwards:
                routing.forwards.append(Forward())
            fwd = routing.forwards[-1]
            if fwd.mask is not None and fwd.mask.numel() != out[index].shape[0]:
                fwd.mask = None  # rows the mask does not describe (e.g. a 4-D mask's): count every token
            fwd.logits.append(out[index])
            fwd.experts.append(out[2] if len(out) > 2 and not out[2].is_floating_point() else None)
        return hook

    inner = transformers_model(model)
    backbone = inner.get_decoder() if hasattr(inner, "get_decoder") else inner
    handles = [backbone.register_forward_pre_hook(backbone_pre, with_kwargs=True)]
    handles += [m.register_forward_hook(router_post(i)) for m, i in routers]
    try:
        yield routing
    finally:
        for h in handles:
            h.remove()


def routing_loss(routing: Routing) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The load-balancing loss of the recorded forwards (`core.moe.load_balancing_loss` of each, averaged:
    one forward per micro-batch, as OpenRLHF adds the model's `aux_loss` per micro-batch) and the metrics
    `moe/aux_loss`, `moe/load_max` (busiest expert's share x E; 1 = balanced) and `moe/load_min`."""
    losses, loads = [], []
    for fwd in routing.forwards:
        if fwd.logits:
            loss, m = load_balancing_loss(fwd.logits, routing.top_k, fwd.mask)
            losses.append(loss)
            loads.append(m["expert_load"])
    if not losses:
        zero = torch.zeros(())
        return zero, {}
    loss = torch.stack(losses).mean()
    load = torch.stack(loads).mean(dim=0)
    e = load.numel()
    return loss, {"moe/aux_loss": loss.detach(), "moe/load_max": load.max() * e, "moe/load_min": load.min() * e}
