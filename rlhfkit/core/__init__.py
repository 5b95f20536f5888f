"""Pure tensor math: masks, aggregation, KL / advantage estimators, losses, distillation, shaping, EMA; tables.
May import torch and the standard library only (docs/architecture.md)."""

from rlhfkit.core.advantages import (
    ESTIMATORS,
    GROUP_BASELINES,
    EstimatorSpec,
    Whiten,
    compute_advantages,
    discounted_returns,
    gae,
    group_baseline,
    token_rewards,
)
from rlhfkit.core.aggregate import AGGREGATIONS, aggregate_loss
from rlhfkit.core.distill import forward_kl_from_logits, linear_forward_kl, topk_reverse_kl
from rlhfkit.core.ema import ema_update
from rlhfkit.core.kl import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, approx_kl
from rlhfkit.core.lm_head import linear_logprobs_and_entropy
from rlhfkit.core.losses import (
    IS_KINDS,
    POLICY_LOSSES,
    RATIO_LEVELS,
    PolicyLossSpec,
    behaviour_weights,
    decoupled_policy_loss,
    dpo_loss,
    entropy_from_logits,
    is_weights,
    kto_loss,
    logprobs_and_entropy,
    logprobs_from_logits,
    pairwise_loss,
    policy_loss,
    sft_loss,
    value_loss,
)
from rlhfkit.core.masks import masked_mean, masked_sum, masked_whiten
from rlhfkit.core.shaping import overlong_penalty, stop_properly_penalty
from rlhfkit.core.tables import lookup

__all__ = [
    "AGGREGATIONS",
    "ESTIMATORS",
    "GROUP_BASELINES",
    "IS_KINDS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "RATIO_LEVELS",
    "AdaptiveKLController",
    "EstimatorSpec",
    "FixedKLController",
    "PolicyLossSpec",
    "Whiten",
    "aggregate_loss",
    "approx_kl",
    "compute_advantages",
    "discounted_returns",
    "dpo_loss",
    "ema_update",
    "forward_kl_from_logits",
    "entropy_from_logits",
    "gae",
    "group_baseline",
    "behaviour_weights",
    "decoupled_policy_loss",
    "is_weights",
    "kto_loss",
    "linear_forward_kl",
    "linear_logprobs_and_entropy",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "lookup",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "overlong_penalty",
    "pairwise_loss",
    "policy_loss",
    "sft_loss",
    "stop_properly_penalty",
    "token_rewards",
    "topk_reverse_kl",
    "value_loss",
]
