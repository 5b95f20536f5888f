"""Typed configuration of `rlhfkit train prm`: a process reward model trained on step labels
(sections shared with config/sft.py; OpenRLHF's `train_prm` flags in config/openrlhf.py).
`PRMConfig.from_args(argv)` parses exactly the flags of that command and validates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlhfkit.config.checks import require
from rlhfkit.config.openrlhf import PRM_ALIASES
from rlhfkit.config.parse import Alias
from rlhfkit.config.rl import AdamConfig
from rlhfkit.config.sft import (
    SupervisedCkptConfig,
    SupervisedConfig,
    SupervisedDataConfig,
    refuse_reward_template,
    validate_common,
)


@dataclass(frozen=True)
class PRMDataConfig(SupervisedDataConfig):
    """Step-labelled data: `input_key` holds the text with a placeholder token at the end of each
    step, `label_key` one label per placeholder (a reward token such as "+" / "-", or a float in
    [0, 1], the probability that the step is good, as in Math-Shepherd)."""

    placeholder_token: str = "ки"
    """The token that marks the end of each step in the input (one token of the tokenizer); the
    model's prediction at it is read over the reward tokens."""
    reward_tokens: tuple[str, str] = ("+", "-")
    """The good-step and bad-step tokens (each one token of the tokenizer), in that order: the
    loss is the cross-entropy over these two logits at each placeholder."""


@dataclass(frozen=True)
class PRMConfig(SupervisedConfig):
    """`rlhfkit train prm`: a process reward model trained on step labels."""

    data: PRMDataConfig = field(default_factory=PRMDataConfig)
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=1e-6))
    ckpt: SupervisedCkptConfig = field(default_factory=lambda: SupervisedCkptConfig(output_dir="runs/prm"))
    ALIASES: ClassVar[dict[str, str | Alias]] = PRM_ALIASES

    @staticmethod
    def check(cfg: PRMConfig) -> PRMConfig:
        return validate_prm(cfg)


def validate_prm(cfg: PRMConfig) -> PRMConfig:
    validate_common(cfg)
    d = cfg.data
    require(d.reward_tokens[0] != d.reward_tokens[1], "--data.reward_tokens: the two tokens must differ")
    require(d.placeholder_token not in d.reward_tokens,
            "--data.placeholder_token must differ from the --data.reward_tokens")
    refuse_reward_template(cfg, "train prm")
    require(not d.apply_chat_template and d.input_template is None,
            "train prm reads --data.input_key's text as it is: drop --data.apply_chat_template / "
            "--data.input_template and render the text in the data")
    return cfg
