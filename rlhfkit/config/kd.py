"""Typed configuration of `rlhfkit train kd`: knowledge distillation from a teacher on SFT data
(the sections of config/sft.py plus `teacher` and `kd`). `KDConfig.from_args(argv)` parses exactly
the flags of `rlhfkit train kd`; OpenRLHF's `train_kd` flags (`--teacher_model`, `--kd_coef`,
`--teacher_offload` and train_sft's) are aliases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlhfkit.config.checks import require
from rlhfkit.config.openrlhf import KD_ALIASES
from rlhfkit.config.parse import Alias
from rlhfkit.config.ranges import validate_table
from rlhfkit.config.sft import (
    SUPERVISED_RANGES,
    SFTModelConfig,
    SupervisedCkptConfig,
    SupervisedConfig,
    validate_common,
)


@dataclass(frozen=True)
class TeacherConfig:
    """The frozen teacher (train kd, train opd). It must share the student's tokenizer."""

    model_name_or_path: str | None = None
    """The teacher: HF folder, a .gguf file or `smollm2`; required."""
    offload: bool = False
    """Keep the teacher on the CPU between its passes and move it to the student's device for each
    (less device memory, one copy per pass); off: it stays on the student's device."""


@dataclass(frozen=True)
class KDSection:
    """The distillation loss: (1 - coef) * SFT NLL + coef * KL(teacher || student) on response tokens."""

    coef: float = 0.4
    """Weight of the forward KL to the teacher; 1 - coef weighs the SFT NLL of the data's responses."""
    chunk_size: int = 1024
    """Response positions whose [positions, vocabulary] logits are made at once when computing the KL
    (peak memory grows with chunk_size x vocabulary, not with the sequence length)."""


@dataclass(frozen=True)
class KDConfig(SupervisedConfig):
    """`rlhfkit train kd`: knowledge distillation from a teacher on prompts and responses."""

    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    ckpt: SupervisedCkptConfig = field(default_factory=lambda: SupervisedCkptConfig(output_dir="runs/kd"))
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    kd: KDSection = field(default_factory=KDSection)
    ALIASES: ClassVar[dict[str, str | Alias]] = KD_ALIASES

    @staticmethod
    def check(cfg: KDConfig) -> KDConfig:
        return validate_kd(cfg)


KD_RANGES = validate_table({**SUPERVISED_RANGES, "kd.coef": "[0, 1]", "kd.chunk_size": ">= 1"})


def validate_kd(cfg: KDConfig) -> KDConfig:
    validate_common(cfg, KD_RANGES)
    require(cfg.teacher.model_name_or_path is not None,
            "--teacher.model_name_or_path is required (OpenRLHF: --teacher_model): the model to distill from")
    return cfg
