"""The SDK's built-in losses (`forward_backward(data, loss_fn=NAME)`) as rlhfkit's core losses.

Tinker sums each loss over a datum's tokens (no mean: the client scales by its own counts), so
every entry calls a core loss with ``agg="token_mean"`` and ``num_tokens=1``, which is the sum.
Per datum, with ``logp`` the current policy's logprobs of ``target_tokens`` ``[T]``:

| name | Tinker's loss | core loss |
|---|---|---|
| cross_entropy | ``sum(-logp * weights)`` | ``sft_loss`` on ``logp * weights`` |
| importance_sampling | ``-sum(exp(logp - q) * A)`` | ``policy_loss`` without clipping |
| ppo | ``-sum(min(r * A, clip(r, low, high) * A))`` | ``policy_loss`` with ``eps_low = 1 - low``, ``eps_high = high - 1`` |
| cispo | ``-sum(sg(clip(r, low, high)) * A * logp)`` | ``cispo_loss`` |

``q`` is the datum's ``logprobs`` input (the sampler's), ``A`` its ``advantages``, ``r = exp(logp - q)``;
``low``/``high`` are ``loss_fn_config``'s ``clip_low_threshold``/``clip_high_threshold`` (default
0.8 / 1.2). The other names the SDK lists (dro, gspo, stable_reinforce, custom) are refused with
the list of supported ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfkit.core.losses import cispo_loss, policy_loss, sft_loss
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


@dataclass(frozen=True)
class TinkerLoss:
    """One built-in loss: its function ``(logp [T], inputs {name: [T]}, config) -> (loss, metrics)``
    and the float inputs it needs besides ``target_tokens``."""

    fn: Callable[[torch.Tensor, dict, dict], tuple[torch.Tensor, dict]]
    inputs: tuple[str, ...]


TINKER_LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(_cross_entropy, ("weights",)),
    "importance_sampling": TinkerLoss(_importance_sampling, ("logprobs", "advantages")),
    "ppo": TinkerLoss(_ppo, ("logprobs", "advantages")),
    "cispo": TinkerLoss(_cispo, ("logprobs", "advantages")),
}


def lookup_loss(name: str) -> TinkerLoss:
    if name not in TINKER_LOSSES:
        raise DataError(f"loss_fn {name!r} is not served here; use one of {', '.join(TINKER_LOSSES)}")
    return TINKER_LOSSES[name]
