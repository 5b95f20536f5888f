"""Typed configuration of `rlhfkit train opd`: on-policy distillation, an RL run whose reward is the
teacher's (config/rl.py's sections, with presets). The flags of OpenRLHF's `train_opd` are aliases:

    --model.*                  -> --actor.*          (the student)
    --teacher.model_name_or_path, --teacher.offload -> --algo.teacher_model_name_or_path, --algo.teacher_offload
    --opd.topk, --opd.kl_estimator, --opd.kd_temperature -> --algo.teacher_topk, --algo.teacher_kl_estimator,
                                                          --rollout.temperature
    --generate.max_new_tokens, --generate.temperature, --generate.top_p -> --rollout.*

Presets (what makes the run distillation rather than RL): no task reward unless one is given
(--reward.*), the reinforce estimator with gamma 0 and no whitening (each token's advantage is its
own reward -(log p_student - log p_teacher), no baseline: the gradient of OpenRLHF's sampled-token
loss), one sample per prompt, one optimizer step per rollout batch (on-policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.checks import require
from rlhfkit.config.parse import parse_config
from rlhfkit.config.rl import (
    RL_ALIASES,
    AdvantageConfig,
    AlgoConfig,
    CkptConfig,
    RLConfig,
    RolloutConfig,
    TrainConfig,
    validate,
)

# OpenRLHF's train_opd names (and the model section's) for flags of ours.
OPD_ALIASES: dict = {
    **RL_ALIASES,
    **{f"model.{k}": f"actor.{k}" for k in ("model_name_or_path", "gradient_checkpointing_enable")},
    "teacher.model_name_or_path": "algo.teacher_model_name_or_path",
    "teacher.offload": "algo.teacher_offload",
    "opd.topk": "algo.teacher_topk",
    "opd.kl_estimator": "algo.teacher_kl_estimator",
    "opd.kd_temperature": "rollout.temperature",
    **{f"generate.{k}": f"rollout.{k}" for k in ("max_new_tokens", "temperature", "top_p")},
}


@dataclass(frozen=True)
class OPDConfig(RLConfig):
    """`rlhfkit train opd`: on-policy distillation (the student samples, the teacher scores each token)."""

    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(batch_size=16, n_samples_per_prompt=1))
    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig(
        advantage=AdvantageConfig(estimator="reinforce", gamma=0.0, whiten="false")))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=16))
    ckpt: CkptConfig = field(default_factory=lambda: CkptConfig(output_dir="runs/opd"))

    @classmethod
    def from_args(cls, argv: list[str]) -> OPDConfig:
        """The validated config of `rlhfkit train opd ARGV` (our flags, OpenRLHF's train_opd names)."""
        cfg = parse_config(cls, list(argv), aliases=OPD_ALIASES)
        validate_opd(cfg)
        return cfg


def validate_opd(cfg: OPDConfig):
    """train rl's checks, and a teacher; the sampled-token reward needs the full sampling distribution."""
    plan = validate(cfg)
    a, r = cfg.algo, cfg.rollout
    require(a.teacher_model_name_or_path is not None,
             "--teacher.model_name_or_path is required: the teacher to distill from (same tokenizer as the student)")
    require(a.teacher_topk > 0 or (r.top_p == 1.0 and r.top_k == -1),
             "--opd.topk 0 rewards the sampled tokens by their logprobs, which --generate.top_p / --rollout.top_k "
             "truncation would bias: keep top_p 1 and top_k -1, or set --opd.topk K")
    return plan
