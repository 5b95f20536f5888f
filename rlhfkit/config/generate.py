"""Typed configuration of the sampling workflows: `rlhfkit generate`, `rlhfkit train rs` (rejection
sampling / best-of-N) and `rlhfkit train iterative-dpo`.

Each takes the flags of `rlhfkit train rl` (config/rl.py): the policy (--actor.*), the prompts
(--data.*), the sampling (--rollout.*), the reward (--reward.*), the seed and threads (--train.seed,
--train.num_threads) and the run folder (--ckpt.output_dir); the RL-only sections are accepted and
unused. `train rs` adds --rs.* and the SFT stage's --sft.* (config/sft.py's sections);
`train iterative-dpo` adds --iterative.* and the DPO stage's --dpo.* (config/preference.py's).
OpenRLHF's batch_inference flags are aliases (config/openrlhf.py: BATCH_INFERENCE_FLAGS).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.checks import check_device, check_input_template, check_micro_batches, one_of, require
from rlhfkit.config.openrlhf import BATCH_INFERENCE_FLAGS
from rlhfkit.config.parse import Alias, parse_config
from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.config.rl import (
    ADAM_RANGES,
    AUTOCASTS,
    DTYPES,
    ENGINES,
    LOG_LEVELS,
    LOSS_SCALE_RANGES,
    LR_SCHEDULERS,
    MUON_RANGES,
    OPTIMS,
    RL_ALIASES,
    RL_RANGES,
    SEED_RANGE,
    AdamConfig,
    CkptConfig,
    MuonConfig,
    RLConfig,
)
from rlhfkit.config.sft import DSConfig, SupervisedTrainConfig

REF_MODES = ("initial", "round")


@dataclass(frozen=True)
class CSFTConfig:
    """Conditional SFT at generation (OpenRLHF's batch_inference --enable_csft): every prompt asks for a score."""

    enable: bool = False
    """Append --csft.prompt (stripped, then one space) to every rendered prompt, as OpenRLHF's --enable_csft does: a
    policy trained with `train sft --data.reward_template` then answers as its samples of that score did."""
    prompt: str = "<rm_score>: 5.00"
    """The score asked for with --csft.enable (OpenRLHF's --csft_prompt)."""


@dataclass(frozen=True)
class GenerateConfig(RLConfig):
    """`rlhfkit generate`: --rollout.n_samples_per_prompt samples of every prompt of --data.prompt_dataset
    by --actor.model_name_or_path, written to <output_dir>/generations.jsonl."""

    ckpt: CkptConfig = field(default_factory=lambda: CkptConfig(output_dir="runs/generate"))
    csft: CSFTConfig = field(default_factory=CSFTConfig)

    @classmethod
    def from_args(cls, argv: list[str]):
        """The validated config of the command's flags (train rl's, OpenRLHF's batch_inference names)."""
        return validate_generate(parse_config(cls, list(argv), aliases=WORKFLOW_ALIASES))


@dataclass(frozen=True)
class StageDataConfig:
    """The samples the training stage reads (built in memory from the kept samples)."""

    max_len: int = 2048
    """Samples longer than this many tokens (prompt + response) are skipped and counted."""


@dataclass(frozen=True)
class SFTStageConfig:
    """The SFT stage of `train rs` (--rs.sft_enable): `train sft`'s optimisation sections; the model is
    the round's policy with --actor.dtype / --actor.autocast / --actor.device."""

    train: SupervisedTrainConfig = field(default_factory=SupervisedTrainConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=5e-6))
    muon: MuonConfig = field(default_factory=MuonConfig)
    ds: DSConfig = field(default_factory=DSConfig)
    data: StageDataConfig = field(default_factory=StageDataConfig)


@dataclass(frozen=True)
class RSSettings:
    """Rejection sampling: which samples are kept, how many rounds, whether SFT runs on them."""

    threshold: float | None = None
    """Keep every sample whose reward is at least this (none: keep the best sample of each prompt,
    best-of-N with N = --rollout.n_samples_per_prompt, which --rs.best_of_n also sets)."""
    rounds: int = 1
    """Rounds of generate -> score -> select (-> SFT); each round takes the next --rollout.batch_size
    prompts and, with --rs.sft_enable, samples with the previous round's model (OpenRLHF's --iter loop)."""
    sft_enable: bool = False
    """Fine-tune on each round's kept samples (`train sft` with the --sft.* flags) into round_<k>/final."""


@dataclass(frozen=True)
class RSConfig(GenerateConfig):
    """`rlhfkit train rs`: rejection sampling (best-of-N): sample, score with --reward.*, keep the best,
    write <output_dir>/rs_dataset.jsonl (an SFT dataset: input, output), optionally SFT on it."""

    ckpt: CkptConfig = field(default_factory=lambda: CkptConfig(output_dir="runs/rs"))
    rs: RSSettings = field(default_factory=RSSettings)
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)

    @classmethod
    def from_args(cls, argv: list[str]):
        return validate_rs(parse_config(cls, list(argv), aliases=WORKFLOW_ALIASES))


@dataclass(frozen=True)
class DPOLossConfig:
    """The DPO loss of each round."""

    beta: float = 0.1
    """Temperature of the implicit reward beta * log(pi / ref)."""
    ipo_enable: bool = False
    """IPO's squared loss instead of the logistic one."""
    label_smoothing: float = 0.0
    """cDPO's probability that a preference label is flipped."""


@dataclass(frozen=True)
class DPOStageConfig:
    """The DPO stage of each round of `train iterative-dpo`: `train dpo`'s optimisation sections; the
    model is the round's policy with --actor.dtype / --actor.autocast / --actor.device."""

    model: DPOLossConfig = field(default_factory=DPOLossConfig)
    train: SupervisedTrainConfig = field(default_factory=SupervisedTrainConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=5e-7))
    muon: MuonConfig = field(default_factory=MuonConfig)
    ds: DSConfig = field(default_factory=DSConfig)
    data: StageDataConfig = field(default_factory=StageDataConfig)


@dataclass(frozen=True)
class IterativeSettings:
    """Rounds of iterative DPO and its reference model."""

    rounds: int = 2
    """Rounds of generate -> score -> pair (best chosen, worst rejected) -> DPO; round k+1 samples with
    round k's model (<output_dir>/round_<k>/final)."""
    ref: str = "initial"
    """The DPO reference of every round: initial (--actor.model_name_or_path, as OpenRLHF's script) or
    round (the round's starting policy)."""


@dataclass(frozen=True)
class IterativeDPOConfig(GenerateConfig):
    """`rlhfkit train iterative-dpo`: rounds of on-policy preference pairs and DPO."""

    ckpt: CkptConfig = field(default_factory=lambda: CkptConfig(output_dir="runs/iterative_dpo"))
    iterative: IterativeSettings = field(default_factory=IterativeSettings)
    dpo: DPOStageConfig = field(default_factory=DPOStageConfig)

    @classmethod
    def from_args(cls, argv: list[str]):
        return validate_iterative_dpo(parse_config(cls, list(argv), aliases=WORKFLOW_ALIASES))


# train rl's aliases, OpenRLHF's batch_inference flags, and our short names.
WORKFLOW_ALIASES: dict[str, str | Alias] = {**RL_ALIASES, **BATCH_INFERENCE_FLAGS,
                                            "rs.best_of_n": "rollout.n_samples_per_prompt"}


def _stage_ranges(prefix: str) -> dict[str, str]:
    t = {"batch_size": ">= 1", "micro_batch_size": ">= 1", "max_epochs": ">= 1", "max_steps": ">= 1",
         "lr_warmup_ratio": "[0, 1]", "lr_warmup_steps": ">= -1", "min_lr_ratio": "[0, 1]", "max_norm": ">= 0",
         "eval_steps": "-1 or >= 1",
         "seed": SEED_RANGE, "num_threads": ">= 1"}
    return {**{f"{prefix}.train.{k}": v for k, v in t.items()},
            **{f"{prefix}.adam.{k}": v for k, v in ADAM_RANGES.items()},
            **{f"{prefix}.muon.{k}": v for k, v in MUON_RANGES.items()},
            **{f"{prefix}.train.loss_scale.{k}": v for k, v in LOSS_SCALE_RANGES.items()},
            f"{prefix}.ds.lora.rank": ">= 0", f"{prefix}.ds.lora.alpha": "> 0", f"{prefix}.ds.lora.dropout": "[0, 1)",
            f"{prefix}.data.max_len": ">= 1"}


# The ranges of every numeric flag (see config/ranges.py): train rl's and the new sections'.
GENERATE_RANGES = validate_table(dict(RL_RANGES))
RS_RANGES = validate_table({**RL_RANGES, "rs.rounds": ">= 1", "rs.threshold": "[-1e6, 1e6]",
                            **_stage_ranges("sft")})
ITERATIVE_DPO_RANGES = validate_table({**RL_RANGES, "iterative.rounds": ">= 1", **_stage_ranges("dpo"),
                                       "dpo.model.beta": "> 0", "dpo.model.label_smoothing": "[0, 0.5)"})


def validate_generate(cfg: GenerateConfig, ranges=GENERATE_RANGES) -> GenerateConfig:
    """The checks of the settings the sampling workflows read (train rl's batch arithmetic is not one)."""
    check_ranges(cfg, ranges)
    one_of("rollout.engine", cfg.rollout.engine, ENGINES)
    one_of("actor.dtype", cfg.actor.dtype, DTYPES)
    one_of("actor.autocast", cfg.actor.autocast, (*AUTOCASTS, None))
    one_of("logger.log_level", cfg.logger.log_level, LOG_LEVELS)
    check_device("--actor.device", cfg.actor.device)
    check_input_template(cfg.data.input_template)
    require(cfg.distributed.backend == "local" and not cfg.fsdp.enable,
            "the sampling workflows run in one process: drop --distributed.backend ray / --fsdp.enable")
    return cfg


def _validate_stage(stage, flag: str) -> None:
    t = stage.train
    one_of(f"{flag}.train.lr_scheduler", t.lr_scheduler, LR_SCHEDULERS)
    one_of(f"{flag}.train.optim", t.optim, OPTIMS)
    check_micro_batches(f"{flag}.train", t.batch_size, t.micro_batch_size)


def _one_model_per_round(stage, flag: str, rounds: int) -> None:
    """A later round samples with the previous round's final/: a full model, not a LoRA adapter folder."""
    require(rounds == 1 or stage.ds.lora.rank == 0, f"--{flag}.ds.lora.rank {stage.ds.lora.rank} with {rounds} "
            "rounds: the next round cannot sample with an adapter folder yet; drop LoRA or run one round")


def _scored_samples(cfg: GenerateConfig, command: str) -> None:
    """The rounds score each sample with the reward function and train on it as one row."""
    require(cfg.agent.func_path is None, f"--agent.func_path: {command} scores and trains on single-turn or tool "
                                         "episodes; drop it (rlhfkit generate runs agents)")
    require(cfg.agent.on_rerender == "keep", f"--agent.on_rerender {cfg.agent.on_rerender}: {command} trains on one "
                                             "row per episode; drop it")


def validate_rs(cfg: RSConfig) -> RSConfig:
    validate_generate(cfg, RS_RANGES)
    _scored_samples(cfg, "train rs")
    _validate_stage(cfg.sft, "sft")
    require(cfg.rs.rounds == 1 or cfg.rs.sft_enable, f"--rs.rounds {cfg.rs.rounds} without --rs.sft_enable "
            "samples the same policy every round; add --rs.sft_enable true or set --rs.rounds 1")
    _one_model_per_round(cfg.sft, "sft", cfg.rs.rounds)
    return cfg


def validate_iterative_dpo(cfg: IterativeDPOConfig) -> IterativeDPOConfig:
    validate_generate(cfg, ITERATIVE_DPO_RANGES)
    _scored_samples(cfg, "train iterative-dpo")
    _validate_stage(cfg.dpo, "dpo")
    _one_model_per_round(cfg.dpo, "dpo", cfg.iterative.rounds)
    one_of("iterative.ref", cfg.iterative.ref, REF_MODES)
    require(cfg.rollout.n_samples_per_prompt >= 2, "train iterative-dpo pairs the best and worst sample of a "
            f"prompt: set --rollout.n_samples_per_prompt 2 or more (got {cfg.rollout.n_samples_per_prompt})")
    require(not (cfg.dpo.model.ipo_enable and cfg.dpo.model.label_smoothing > 0),
            "--dpo.model.ipo_enable and --dpo.model.label_smoothing are exclusive")
    return cfg
