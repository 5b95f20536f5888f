"""Mixture-of-experts models: finding their routers and recording what they do in a forward.

transformers' MoE models name the module whose output holds the router logits in
`_can_record_outputs["router_logits"]` (the class, and the index of the logits in its output): a
`...TopKRouter` returning (logits [N, E], weights [N, k], expert indices [N, k]) in Qwen3-MoE,
Mixtral, DeepSeek-V3 and the others, or the sparse block itself. `record_routing(model)` hooks those
modules for the duration of a `with` block and collects each call's logits and chosen experts, and
the 2-D attention mask the backbone was called with (the tokens that count); dense models record
nothing. `core.moe.load_balancing_loss` turns a record into the auxiliary loss and the experts' load.

Routing replay (R3, Ma et al. 2025, arXiv:2510.11370): `ExpertRecorder` keeps the experts every router
chose in the generation engine's forwards, and `replay_routing(model, codes)` makes the routers of a
training forward use those experts instead of their own top-k, with the routing weights recomputed from
the router's own logits as the router computes them (`RouterRule`; core.moe.replayed_weights), so the
gradient still reaches the router. Both hook the `...TopKRouter` modules whose output is
(logits, weights, expert indices).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from rlhfkit.core.moe import (
    changed_choices,
    expert_code_dtype,
    load_balancing_loss,
    missing_code,
    replay_indices,
    replayed_weights,
)
from rlhfkit.errors import TrainingError
from rlhfkit.models.logprobs import decoder_backbone, note_once, runnable_layout, split_backbone, transformers_model


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
    backbone = decoder_backbone(inner) or inner  # the module the logprobs call (Llama 4: not get_decoder())
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


# ------------------------------------------------------------------ routing replay (R3)
@dataclass(frozen=True)
class RouterRule:
    """How a router weighs the experts it chose (core.moe.replayed_weights' arguments): `kind` softmax
    (Mixtral, Qwen3-MoE and most others) or sigmoid (DeepSeek-V3 style, scored with a bias for the
    choice), `normalize` (the top-k weights divided by their sum), `scale` (DeepSeek-V3's
    routed_scaling_factor)."""

    kind: str
    normalize: bool
    scale: float = 1.0

    @classmethod
    def of(cls, router: torch.nn.Module) -> RouterRule:
        """The rule of `router`, read from its attributes (checked against its own output on its first call)."""
        if hasattr(router, "e_score_correction_bias"):
            return cls("sigmoid", bool(getattr(router, "norm_topk_prob", True)),
                       float(getattr(router, "routed_scaling_factor", None) or 1.0))
        return cls("softmax", bool(getattr(router, "norm_topk_prob", True)))

    def weights(self, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return replayed_weights(logits, indices, self.kind, self.normalize, self.scale)


_RULE_CHECKED = "_rlhfkit_replay_rule"  # a router whose own weights its RouterRule reproduced, kept on the module


def replayable_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The routers of `model` in layer order, when they return (logits, weights, expert indices) (the
    ...TopKRouter modules of transformers' MoE models); [] for a dense model or other router outputs."""
    routers = router_modules(model)
    return [m for m, index in routers] if routers and all(index == 0 for _, index in routers) else []


def routing_shape(model: torch.nn.Module) -> tuple[int, int, int] | None:
    """(MoE layers, experts, experts per token) of `model`'s replayable routers, else None."""
    routers, k = replayable_routers(model), moe_top_k(model)
    if not routers or not k:
        return None
    return len(routers), int(routers[0].weight.shape[0]), k


def _router_output(module: torch.nn.Module, output) -> tuple:
    if not (isinstance(output, tuple) and len(output) >= 3 and not output[2].is_floating_point()):
        raise TrainingError(f"routing replay: {type(module).__name__} does not return (logits, weights, expert "
                            "indices); turn --actor.routing_replay off for this model")
    return output


class ExpertRecorder:
    """The experts every router of `model` chose in a forward, as codes (core.moe.expert_code_dtype):
    a generation engine runs each forward inside `recording(rows, out)`."""

    def __init__(self, model: torch.nn.Module):
        self.routers = replayable_routers(model)
        shape = routing_shape(model)
        self.dtype = expert_code_dtype(shape[1]) if shape else torch.uint8
        self.top_k = shape[2] if shape else 0

    @contextlib.contextmanager
    def recording(self, rows: int, out: list) -> Iterator[None]:
        """Hooks the routers for one forward over `rows` rows; appends its codes [rows, T, layers, k] to
        `out` after it (None when not every router ran)."""
        calls: list[torch.Tensor] = []

        def hook(module, args, output):
            calls.append(_router_output(module, output)[2].to(self.dtype))

        handles = [m.register_forward_hook(hook) for m in self.routers]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        if len(calls) != len(self.routers):
            out.append(None)
            return
        stacked = torch.stack(calls, dim=1)  # [rows * T, layers, k]
        out.append(stacked.view(rows, -1, *stacked.shape[1:]))


@dataclass
class ReplayCounts:
    """Token-layer counts of the forwards run in a `replay_routing` block (tensors on the model's device):
    `routed` (the tokens that count: not core.moe.skip_code), of them `replayed` (their experts recorded)
    and, of those, `changed` (the router's own top-k would have chosen other experts)."""

    routed: torch.Tensor
    replayed: torch.Tensor
    changed: torch.Tensor

    def metrics(self) -> dict[str, torch.Tensor]:
        """moe/replay_tokens (share of the routed token-layers replayed) and moe/routing_mismatch (share
        of the replayed ones where the router's own choice differs from the recorded experts)."""
        return {"moe/replay_tokens": self.replayed / self.routed.clamp(min=1),
                "moe/routing_mismatch": self.changed / self.replayed.clamp(min=1)}


def _replay_hook(layer: int, codes: torch.Tensor, counts: ReplayCounts, seen: set):
    def hook(module, args, output):
        logits, weights, own = _router_output(module, output)[:3]
        if codes.shape[0] != own.shape[0]:
            raise TrainingError(f"routing replay: the forward routes {own.shape[0]} tokens and the recorded experts "
                                f"cover {codes.shape[0]}; the batch's experts do not belong to its layout")
        rule = RouterRule.of(module)
        if vars(module).get(_RULE_CHECKED) != rule:
            _check_rule(module, rule, logits, weights, own)
        indices, replayed, counted = replay_indices(own, codes[:, layer])
        w = torch.where(replayed.unsqueeze(-1), rule.weights(logits, indices).to(weights.dtype), weights)
        if layer not in seen:  # once per forward (checkpointing runs the router again in backward)
            seen.add(layer)
            with torch.no_grad():
                counts.routed += counted.sum()
                counts.replayed += replayed.sum()
                counts.changed += (changed_choices(own, indices) & replayed).sum()
        return (logits, w, indices, *output[3:])
    return hook


def _check_rule(module: torch.nn.Module, rule: RouterRule, logits, weights, own) -> None:
    """`rule` must give the router's own weights at its own experts; kept on the module once it does."""
    mine = rule.weights(logits.detach(), own)
    if not torch.allclose(mine, weights.detach().float(), rtol=1e-2, atol=1e-3):
        raise TrainingError(f"routing replay: {type(module).__name__} weighs its experts in a way rlhfkit does not "
                            f"recompute ({rule}); turn --actor.routing_replay off for this model")
    vars(module)[_RULE_CHECKED] = rule


@contextlib.contextmanager
def replay_routing(model: torch.nn.Module, codes: torch.Tensor) -> Iterator[ReplayCounts]:
    """Inside the block, every router of `model` routes the tokens of a forward over the batch whose
    expert codes are `codes` [rows, T, layers, k] (its `experts`) to the recorded experts, its own top-k
    where none were recorded; the weights recomputed from its logits (RouterRule). Keep the block open
    through the backward: gradient checkpointing runs the routers again there. Yields the counts."""
    routers = replayable_routers(model)
    if len(routers) != codes.shape[2]:
        raise TrainingError(f"routing replay: the batch records {codes.shape[2]} MoE layers and "
                            f"{type(model).__name__} has {len(routers)} routers")
    split_backbone(model)  # its one-time probe forwards run now, unreplayed
    device = next(model.parameters()).device
    flat = codes.to(device).reshape(-1, *codes.shape[2:])
    zero = torch.zeros((), dtype=torch.float64, device=device)
    counts, seen = ReplayCounts(zero.clone(), zero.clone(), zero.clone()), set()
    handles = [m.register_forward_hook(_replay_hook(i, flat, counts, seen)) for i, m in enumerate(routers)]
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def replayed(model: torch.nn.Module, batch, on: bool = True) -> Iterator[tuple[object, ReplayCounts | None]]:
    """(the batch to run, the replay's counts): with `on` and a batch that carries recorded `experts`,
    the layout `model` runs it in (models.logprobs.runnable_layout) under `replay_routing`; else the
    batch as it is and None (nothing hooked)."""
    if not on or getattr(batch, "experts", None) is None:
        yield batch, None
        return
    batch = runnable_layout(model, batch)
    with replay_routing(model, batch.experts) as counts:
        yield batch, counts


def note_unrecorded(experts: torch.Tensor | None) -> None:
    """One logged line when a batch's tokens lack recorded experts (`experts` None or holding
    core.moe.missing_code): the routers choose those tokens' experts themselves."""
    if experts is None or bool((experts[..., 0, 0] == missing_code(experts.dtype)).any()):
        note_once("--actor.routing_replay: the engine recorded no experts for some tokens (the vllm engine, "
                  "compiled decode steps, trajectories from other sources); the trainer's routers choose those "
                  "tokens' experts (moe/replay_tokens: the share replayed)")
