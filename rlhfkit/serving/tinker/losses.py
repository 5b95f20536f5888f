"""The SDK's built-in losses (`forward_backward(data, loss_fn=NAME)`) as rlhfkit's core losses.

Tinker sums each loss over a datum's tokens (no mean: the client scales by its own counts), so
every entry calls a core loss with ``agg="token_mean"`` and ``num_tokens=1``, which is the sum.
Per datum, with ``logp`` the current policy's logprobs of ``target_tokens`` ``[T]``:

| name | Tinker's loss | core loss |
|---|---|---|
| cross_entropy | ``sum(-logp * weights)`` | ``sft_loss`` on ``logp * weights`` |
| importance_sampling | ``-sum(exp(logp - q) * A)`` | ``policy_loss`` without clipping |
| ppo | ``-sum(min(r * A, clip(r, low, high) * A))`` | ``policy_loss``, ``eps_low = 1 - low``, ``eps_high = high - 1`` |
| cispo | ``-sum(sg(clip(r, low, high)) * A * logp)`` | ``cispo_loss`` |
| gspo | ``-sum(min(s_t * A, clip(s_t, low, high) * A))`` | ``policy_loss`` on GSPO-token's ratio |
| dro | ``-sum(logp * A - beta / 2 * (logp - q) ** 2)`` | ``dro_loss`` |

``q`` is the datum's ``logprobs`` input (the sampler's), ``A`` its ``advantages``, ``r = exp(logp - q)``;
``low``/``high`` are ``loss_fn_config``'s ``clip_low_threshold``/``clip_high_threshold`` (default
0.8 / 1.2). GSPO-token (Zheng et al. 2025, arXiv:2507.18071, as Tinker defines it): ``s_t =
sg(s) * exp(logp_t - sg(logp_t))`` with ``s = exp(mean over sequence_ratio_mask of (logp - q))``,
the sequence ratio's value with each token's own gradient. ``beta`` of ``dro`` is required in
``loss_fn_config``. ``stable_reinforce`` (it needs the sampler's per-sequence stability records)
is refused with the list of served losses. Custom losses (``forward_backward_custom``) need no
entry: the SDK sends them as ``cross_entropy`` with the gradient as weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfkit.core.losses import dro_loss, policy_loss, sft_loss
from rlhfkit.core.surrogates import cispo_loss
from rlhfkit.errors import DataError

SUM = {"agg": "token_mean", "num_tokens": 1.0}


def _clip(config: dict) -> tuple[float, float]:
    low = float(config.get("clip_low_threshold", 0.8))
    high = float(config.get("clip_high_threshold", 1.2))
    if not 0.0 <= low <= 1.0 <= high:
        raise DataError(f"loss_fn_config: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got "
                        f"{low}, {high}")
    return low, high


def _cross_entropy(logp, inputs, config):
    weights = inputs["weights"]
    return sft_loss(logp * weights, weights != 0, **SUM)


def _importance_sampling(logp, inputs, config):
    mask = torch.ones_like(logp, dtype=torch.bool)
    return policy_loss(logp, inputs["logprobs"], inputs["advantages"], mask, eps_low=float("inf"), **SUM)


def _ppo(logp, inputs, config):
    low, high = _clip(config)
    mask = torch.ones_like(logp, dtype=torch.bool)
    return policy_loss(logp, inputs["logprobs"], inputs["advantages"], mask, eps_low=1.0 - low,
                       eps_high=high - 1.0, **SUM)


def _cispo(logp, inputs, config):
    low, high = _clip(config)
    mask = torch.ones_like(logp, dtype=torch.bool)
    return cispo_loss(logp, inputs["logprobs"], inputs["advantages"], mask, low, high, **SUM)


def _gspo_base(logp, inputs):
    """The base logprobs that make ``exp(logp - base)`` GSPO-token's ratio: ``logp``'s value
    moved by the sequence log-ratio, so each token's ratio is ``s`` with its own gradient."""
    in_ratio = inputs["sequence_ratio_mask"] != 0
    if not bool(in_ratio.any()):
        raise DataError("gspo: sequence_ratio_mask marks no token; mark the sampled tokens with 1")
    seq = (logp.detach() - inputs["logprobs"])[in_ratio].mean()
    return logp.detach() - seq


def _gspo(logp, inputs, config):
    low, high = _clip(config)
    mask = torch.ones_like(logp, dtype=torch.bool)
    return policy_loss(logp, _gspo_base(logp, inputs), inputs["advantages"], mask, eps_low=1.0 - low,
                       eps_high=high - 1.0, **SUM)


def _gspo_elementwise(logp, inputs, config):
    low, high = _clip(config)
    base = _gspo_base(logp, inputs)
    mask = torch.ones(1, dtype=torch.bool)
    return [float(policy_loss(logp[t:t + 1], base[t:t + 1], inputs["advantages"][t:t + 1], mask,
                              eps_low=1.0 - low, eps_high=high - 1.0, **SUM)[0]) for t in range(logp.shape[0])]


def _dro(logp, inputs, config):
    if "beta" not in config:
        raise DataError("loss_fn 'dro' needs loss_fn_config={'beta': ...}, the weight of its quadratic penalty")
    mask = torch.ones_like(logp, dtype=torch.bool)
    return dro_loss(logp, inputs["logprobs"], inputs["advantages"], mask, float(config["beta"]), **SUM)


@dataclass(frozen=True)
class TinkerLoss:
    """One built-in loss: its function ``(logp [T], inputs {name: [T]}, config) -> (loss, metrics)``,
    the float inputs it needs besides ``target_tokens``, and, for a loss whose tokens are not
    independent (a sequence-level ratio), its per-token losses ``(logp, inputs, config) -> [T]``;
    without one, a token's loss is the loss of that token alone."""

    fn: Callable[[torch.Tensor, dict, dict], tuple[torch.Tensor, dict]]
    inputs: tuple[str, ...]
    elementwise: Callable[[torch.Tensor, dict, dict], list[float]] | None = None


TINKER_LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(_cross_entropy, ("weights",)),
    "importance_sampling": TinkerLoss(_importance_sampling, ("logprobs", "advantages")),
    "ppo": TinkerLoss(_ppo, ("logprobs", "advantages")),
    "cispo": TinkerLoss(_cispo, ("logprobs", "advantages")),
    "gspo": TinkerLoss(_gspo, ("logprobs", "advantages", "sequence_ratio_mask"), _gspo_elementwise),
    "dro": TinkerLoss(_dro, ("logprobs", "advantages")),
}


def lookup_loss(name: str) -> TinkerLoss:
    if name not in TINKER_LOSSES:
        raise DataError(f"loss_fn {name!r} is not served here; use one of {', '.join(TINKER_LOSSES)}")
    return TINKER_LOSSES[name]
