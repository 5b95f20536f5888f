"""TRL's GRPO loss settings as `rlhfkit train rl` flags.

TRL's `GRPOConfig` picks its policy loss with `loss_type` (which also fixes how per-token losses are
averaged) and `importance_sampling_level` (one ratio per token, or GSPO's one per sequence), with the
clip range `epsilon` / `epsilon_high`, two-sided clipping `delta` and the SAPO / VESPO parameters.
`trl_loss_flags` writes the same loss in rlhfkit's flags; `grpo_config_flags` reads them from a
`GRPOConfig` (or any object with those attributes). Read from TRL 1.16's `GRPOConfig` documentation
and `GRPOTrainer._compute_loss`.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.errors import ConfigError

# TRL loss_type -> (rlhfkit --actor.policy_loss_type at token level, at sequence level, --actor.loss_agg_mode).
# TRL's bnpo averages over the tokens of the local batch; rlhfkit's token_mean over the whole optimizer step
# (the same when one micro-batch makes the step).
TRL_LOSS_TYPES: dict[str, tuple[str | None, str | None, str]] = {
    "grpo": ("ppo", "gspo", "seq_mean_token_mean"),
    "bnpo": ("ppo", "gspo", "token_mean"),
    "dr_grpo": ("ppo", "gspo", "seq_mean_token_sum_norm"),
    "dapo": ("ppo", "gspo", "token_mean"),
    "luspo": ("ppo", "gspo", "seq_mean_token_sum"),
    "cispo": ("cispo", None, "token_mean"),
    "sapo": ("sapo", None, "seq_mean_token_mean"),
    "vespo": ("vespo", None, "token_mean"),
}
_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def trl_loss_flags(loss_type: str = "dapo", importance_sampling_level: str = "token", epsilon: float = 0.2,
                   epsilon_high: float | None = None, delta: float | None = None,
                   max_completion_length: int | None = None, sapo_temperature_pos: float = 1.0,
                   sapo_temperature_neg: float = 1.05, vespo_k_pos: float = 2.0, vespo_lambda_pos: float = 3.0,
                   vespo_k_neg: float = 3.0, vespo_lambda_neg: float = 2.0) -> list[str]:
    """The `train rl` flags of TRL's GRPO loss `loss_type` (defaults are TRL's).

    The clipped losses (grpo, bnpo, dr_grpo, dapo, luspo) are ppo, or gspo with
    `importance_sampling_level="sequence"`, with TRL's averaging; `delta` (TRL's cap on the ratio) is
    dual clip: with `delta > 1 + epsilon_high` it changes only negative-advantage tokens, where both cap
    the loss at `delta * |A|`. cispo clamps the weight at `epsilon_high` from above only (`eps_low` 1,
    `eps_high` = `epsilon_high - 1`). dr_grpo's constant is `max_completion_length`
    (`--rollout.max_new_tokens`). A setting rlhfkit cannot reproduce raises ConfigError.
    """
    if loss_type not in TRL_LOSS_TYPES:
        raise ConfigError(f"TRL loss_type {loss_type!r}: unknown; valid: {', '.join(TRL_LOSS_TYPES)}")
    if importance_sampling_level not in ("token", "sequence"):
        raise ConfigError(f"TRL importance_sampling_level {importance_sampling_level!r}: valid: token, sequence")
    token_loss, seq_loss, agg = TRL_LOSS_TYPES[loss_type]
    ours = token_loss if importance_sampling_level == "token" else seq_loss
    if ours is None:
        raise ConfigError(f"TRL loss_type {loss_type!r} with importance_sampling_level='sequence': rlhfkit's "
                          f"{token_loss} has token-level ratios only; use importance_sampling_level='token'")
    high = epsilon if epsilon_high is None else epsilon_high
    flags = ["--actor.policy_loss_type", ours, "--actor.loss_agg_mode", agg]
    if loss_type == "cispo":
        flags += ["--actor.eps_clip_low_high", "1.0", repr(float(high) - 1.0)]
    else:
        flags += ["--actor.eps_clip_low_high", repr(float(epsilon)), repr(float(high))]
    if delta is not None:
        if loss_type not in _CLIPPED or not delta > 1.0 + high:
            raise ConfigError(f"TRL delta={delta}: rlhfkit's dual clip reproduces it for the clipped losses with "
                              f"delta > 1 + epsilon_high ({1.0 + high}); drop delta or raise it")
        flags += ["--actor.dual_clip", repr(float(delta))]
    if loss_type == "dr_grpo" and max_completion_length is not None:
        flags += ["--rollout.max_new_tokens", str(int(max_completion_length))]
    if loss_type == "sapo":
        flags += ["--actor.sapo_temperatures", repr(float(sapo_temperature_pos)), repr(float(sapo_temperature_neg))]
    if loss_type == "vespo":
        flags += ["--actor.vespo_k", repr(float(vespo_k_pos)), repr(float(vespo_k_neg)),
                  "--actor.vespo_lambda", repr(float(vespo_lambda_pos)), repr(float(vespo_lambda_neg))]
    return flags


_FIELDS = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "max_completion_length",
           "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
           "vespo_lambda_neg")


def grpo_config_flags(config: Any) -> list[str]:
    """`trl_loss_flags` of a TRL `GRPOConfig` (read by attribute; missing ones take TRL's defaults),
    `mask_truncated_completions` and `disable_dropout` (TRL's default False keeps the model's dropout in
    training; ours is true)."""
    flags = trl_loss_flags(**{k: getattr(config, k) for k in _FIELDS if hasattr(config, k)})
    if getattr(config, "mask_truncated_completions", False):
        flags += ["--actor.mask_truncated_completions", "true"]
    if hasattr(config, "disable_dropout"):
        flags += ["--actor.disable_dropout", str(bool(config.disable_dropout)).lower()]
    return flags
