"""The typed configuration of `rlhfkit train rl`: one frozen dataclass per component.

Flag names follow OpenRLHF's dotted names where the meaning is the same
(`--actor.model_name_or_path`, `--rollout.n_samples_per_prompt`, `--algo.kl.init_coef`, ...).
`validate()` checks that the settings fit together before any model loads and returns the
derived batch arithmetic of OpenRLHF's PPO loop.

`RLConfig` and its aliases live here; its sections in config/rl_sections.py (what is trained and how)
and config/rl_run_sections.py (how the run runs); the accepted names, ranges and `validate` in
config/rl_checks.py. Every public name of those modules is importable from this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.checks import DEVICE_NAMES, check_device, check_input_template
from rlhfkit.config.openrlhf import RL_FLAGS
from rlhfkit.config.parse import Alias, parse_config
from rlhfkit.config.rl_checks import (
    ADAM_RANGES,
    ADVANTAGE_ESTIMATORS,
    AUTOCASTS,
    BACKENDS,
    CODE_SANDBOXES,
    DTYPES,
    ENGINES,
    GROUP_ESTIMATORS,
    IS_CORRECTION_TYPES,
    KL_ESTIMATORS,
    LOG_LEVELS,
    LOSS_AGG_MODES,
    LOSS_SCALE_RANGES,
    LR_SCHEDULERS,
    MUON_RANGES,
    OPTIMS,
    POLICY_LOSS_TYPES,
    RL_RANGES,
    SEED_RANGE,
    WANDB_MODES,
    WHITEN_MODES,
    BatchPlan,
    validate,
)
from rlhfkit.config.rl_run_sections import (
    BaseLoggerConfig,
    CkptConfig,
    DistributedConfig,
    EvalConfig,
    FSDPConfig,
    LoggerConfig,
    LoraConfig,
    RLDSConfig,
    TrainConfig,
    VLLMConfig,
    WandbConfig,
    lora_targets,
)
from rlhfkit.config.rl_sections import (
    ActorConfig,
    AdamConfig,
    AdvantageConfig,
    AgentConfig,
    AlgoConfig,
    CodeRewardConfig,
    CriticConfig,
    DataConfig,
    KLConfig,
    LossScaleConfig,
    MuonConfig,
    ReasoningGymRewardConfig,
    RefConfig,
    RewardConfig,
    RolloutConfig,
)
from rlhfkit.config.trl_grpo import grpo_argv
from rlhfkit.config.verl import HYDRA_FLAGS, verl_values

__all__ = [
    "ADAM_RANGES", "ADVANTAGE_ESTIMATORS", "AUTOCASTS", "BACKENDS", "CODE_SANDBOXES", "DEVICE_NAMES", "DTYPES",
    "ENGINES", "GROUP_ESTIMATORS", "IS_CORRECTION_TYPES", "KL_ESTIMATORS", "LOG_LEVELS", "LOSS_AGG_MODES",
    "LOSS_SCALE_RANGES", "LR_SCHEDULERS", "MUON_RANGES", "OPTIMS", "POLICY_LOSS_TYPES", "RL_ALIASES", "RL_RANGES",
    "SEED_RANGE",
    "WANDB_MODES", "WHITEN_MODES",
    "ActorConfig", "AdamConfig", "AdvantageConfig", "AgentConfig", "AlgoConfig", "BaseLoggerConfig", "BatchPlan",
    "CkptConfig", "CodeRewardConfig", "CriticConfig", "DataConfig", "DistributedConfig", "EvalConfig", "FSDPConfig",
    "KLConfig", "LossScaleConfig", "LoggerConfig", "LoraConfig", "MuonConfig", "RLConfig", "RLDSConfig", "RefConfig",
    "ReasoningGymRewardConfig", "RewardConfig",
    "RolloutConfig",
    "TrainConfig", "VLLMConfig", "WandbConfig", "check_device", "check_input_template", "lora_targets", "validate",
]


@dataclass(frozen=True)
class RLConfig:
    """Every setting of `rlhfkit train rl`, one section per component (`--section.name VALUE`). verl's Hydra
    overrides (`algorithm.adv_estimator=grpo ...`) are read too; these flags win over them (docs/migration.md)."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    ds: RLDSConfig = field(default_factory=RLDSConfig)

    @classmethod
    def from_args(cls, argv: list[str]) -> RLConfig:
        """Parse the CLI's flags (dotted names, OpenRLHF's flat names, --config FILE.yaml, verl's `key=value`
        overrides) and validate."""
        cfg = parse_config(cls, list(argv), aliases=RL_ALIASES, positional=verl_values)
        validate(cfg)
        return cfg

    @classmethod
    def from_trl(cls, trl_config: object, argv: list[str] | tuple[str, ...] = ()) -> RLConfig:
        """The RL config of a TRL `GRPOConfig` (every field read: config/trl_grpo.py), then our own `argv`
        flags on top (they win), validated."""
        return cls.from_args([*grpo_argv(trl_config), *argv])


# Every flag of OpenRLHF's train_ppo_ray (flat and dotted names: mapped, noticed or refused; see
# config/openrlhf.py), and earlier names of our own flags.
RL_ALIASES: dict[str, str | Alias] = {
    **RL_FLAGS,
    **HYDRA_FLAGS,
    "rollout.dynamic_filtering": "algo.dynamic_filtering_enable",
    "algo.overlong_buffer_len": "reward.overlong_buffer_len",
    "algo.overlong_penalty_factor": "reward.overlong_penalty_factor",
    "distributed.fsdp": "fsdp.enable",
    "device": "actor.device",
    "use-rollout-routing-replay": "actor.routing_replay",  # slime's name (R3)
}
