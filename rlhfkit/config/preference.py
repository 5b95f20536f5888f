"""Typed configuration of `rlhfkit train rm`, `train dpo` and `train kto` (sections shared with
config/sft.py; OpenRLHF's flags in config/openrlhf.py). `RMConfig.from_args(argv)`,
`DPOConfig.from_args(argv, kind)` and `KTOConfig.from_args(argv)` parse exactly the flags of those
commands and validate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlhfkit.config.checks import require
from rlhfkit.config.openrlhf import DPO_ALIASES, KTO_ALIASES, RM_ALIASES
from rlhfkit.config.parse import Alias
from rlhfkit.config.ranges import validate_table
from rlhfkit.config.rl import AdamConfig
from rlhfkit.config.sft import (
    SUPERVISED_RANGES,
    ModelConfig,
    SupervisedCkptConfig,
    SupervisedConfig,
    refuse_reward_template,
    validate_common,
)
from rlhfkit.config.trl_rules import Rule
from rlhfkit.config.trl_supervised import DPO_RULES, KTO_RULES, RM_RULES


@dataclass(frozen=True)
class RMModelConfig(ModelConfig):
    """The reward model being trained and its loss's settings."""

    margin_loss_enable: bool = False
    """Llama 2's margin: the loss is -log sigmoid(r(chosen) - r(rejected) - m), m = the pair's "margin"
    record key (0 where a record has none)."""
    center_rewards_coef: float = 0.0
    """Add this times mean((r(chosen) + r(rejected))^2) to the loss, pulling the scores towards mean zero
    (Eisenstein et al. 2023, Eq. 2; TRL's center_rewards_coefficient, which suggests 0.01)."""


@dataclass(frozen=True)
class RMConfig(SupervisedConfig):
    """`rlhfkit train rm`: Bradley-Terry reward model."""

    model: RMModelConfig = field(default_factory=RMModelConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=9e-6))
    ckpt: SupervisedCkptConfig = field(default_factory=lambda: SupervisedCkptConfig(output_dir="runs/rm"))
    ALIASES: ClassVar[dict[str, str | Alias]] = RM_ALIASES
    TRL_RULES: ClassVar[dict[str, Rule] | None] = RM_RULES
    TRL_NAME: ClassVar[str] = "RewardConfig"
    # TRL's RewardTrainer subtracts a record's "margin" wherever the data has one
    TRL_ARGV: ClassVar[tuple[str, ...]] = ("--model.margin_loss_enable", "true")

    @staticmethod
    def check(cfg: RMConfig) -> RMConfig:
        return validate_rm(cfg)


@dataclass(frozen=True)
class PolicyModelConfig(ModelConfig):
    """The policy being trained and the preference loss's settings."""

    beta: float = 0.1
    """Temperature of the implicit reward beta * log(pi / ref)."""
    ipo_enable: bool = False
    """DPO only: IPO's squared loss instead of the logistic one."""
    label_smoothing: float = 0.0
    """DPO only: cDPO's probability that a preference label is flipped."""
    desirable_weight: float = 1.0
    """KTO only: weight of desirable examples."""
    undesirable_weight: float = 1.0
    """KTO only: weight of undesirable examples."""
    nll_loss_coef: float = 0.0
    """DPO only: add this times the chosen responses' NLL (each response's token-mean, averaged over
    the pairs) to the loss (OpenRLHF's DPO + NLL, as in Pang et al. 2024's iterative RPO)."""


@dataclass(frozen=True)
class RefModelConfig:
    """The frozen reference model."""

    model_name_or_path: str | None = None
    """Frozen reference; defaults to the policy's initial weights."""


@dataclass(frozen=True)
class DPOConfig(SupervisedConfig):
    """`rlhfkit train dpo` (DPO / IPO / cDPO) and `rlhfkit train kto`."""

    model: PolicyModelConfig = field(default_factory=PolicyModelConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=5e-7))
    ckpt: SupervisedCkptConfig = field(default_factory=lambda: SupervisedCkptConfig(output_dir="runs/dpo"))
    ref: RefModelConfig = field(default_factory=RefModelConfig)
    ALIASES: ClassVar[dict[str, str | Alias]] = DPO_ALIASES
    TRL_RULES: ClassVar[dict[str, Rule] | None] = DPO_RULES

    @staticmethod
    def check(cfg: DPOConfig) -> DPOConfig:
        return validate_dpo(cfg, "dpo")

    @classmethod
    def from_args(cls, argv: list[str], kind: str | None = None) -> DPOConfig:
        """The validated config of `rlhfkit train KIND ARGV`; KIND "dpo" or "kto" (KTOConfig's aliases and
        checks), default: this class's."""
        if kind is None:
            return super().from_args(argv)
        require(kind in ("dpo", "kto"), f"DPOConfig.from_args: kind must be 'dpo' or 'kto' (got {kind!r})")
        return (KTOConfig if kind == "kto" else DPOConfig).from_args(argv)


@dataclass(frozen=True)
class KTOConfig(DPOConfig):
    """`rlhfkit train kto`: DPOConfig's sections (KTO reads beta and the desirable / undesirable
    weights), validated as KTO."""

    ALIASES: ClassVar[dict[str, str | Alias]] = KTO_ALIASES
    TRL_RULES: ClassVar[dict[str, Rule] | None] = KTO_RULES

    @staticmethod
    def check(cfg: DPOConfig) -> DPOConfig:
        return validate_dpo(cfg, "kto")


# `train rm`: the shared ranges and the reward model's loss settings.
RM_RANGES = validate_table({**SUPERVISED_RANGES, "model.center_rewards_coef": ">= 0"})


def validate_rm(cfg: RMConfig) -> RMConfig:
    validate_common(cfg, RM_RANGES)
    refuse_reward_template(cfg, "train rm")
    return cfg


# `train dpo|kto`: the shared ranges and those of the policy's loss settings.
DPO_RANGES = validate_table({
    **SUPERVISED_RANGES, "model.beta": "> 0", "model.label_smoothing": "[0, 0.5)",
    "model.desirable_weight": "> 0", "model.undesirable_weight": "> 0", "model.nll_loss_coef": ">= 0",
})


def validate_dpo(cfg: DPOConfig, kind: str = "dpo") -> DPOConfig:
    """Checks of `train dpo`, and with `kind` "kto" those of `train kto`."""
    require(kind in ("dpo", "kto"), f"validate_dpo: kind must be 'dpo' or 'kto' (got {kind!r})")
    validate_common(cfg, DPO_RANGES)
    refuse_reward_template(cfg, f"train {kind}")
    m = cfg.model
    require(not (m.ipo_enable and m.label_smoothing > 0),
            "--model.ipo_enable and --model.label_smoothing are exclusive (cDPO smooths the logistic DPO loss)")
    if kind == "kto":
        require(not m.ipo_enable and m.label_smoothing == 0 and m.nll_loss_coef == 0,
                "--model.ipo_enable / --model.label_smoothing / --model.nll_loss_coef are DPO options; train kto "
                "does not use them")
        require(cfg.train.micro_batch_size >= 2, "train kto needs --train.micro_batch_size >= 2 (its KL reference "
                "point pairs each prompt with another sample's response)")
    return cfg
