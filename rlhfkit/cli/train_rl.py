"""`rlhfkit train rl`: parse and validate flags, check the data and files before any model loads,
then `rlhfkit.RLTrainer.from_config(cfg).train()`."""

from __future__ import annotations

from rlhfkit.api.components import load_reward
from rlhfkit.api.rl import RLTrainer
from rlhfkit.config import RLConfig
from rlhfkit.data.prompts import load_prompts
from rlhfkit.errors import ConfigError


def parse_rl_args(argv: list[str]) -> RLConfig:
    return RLConfig.from_args(argv)


def check_inputs(cfg: RLConfig) -> None:
    """Fail fast, before models load, on a missing dataset file or key, or a broken verifier file."""
    d = cfg.data
    if not d.prompt_dataset:
        raise ConfigError("--data.prompt_dataset is required (a .jsonl/.json/.parquet file or a datasets folder)")
    for path, max_samples in ((d.prompt_dataset, d.max_samples), (cfg.eval.dataset, cfg.eval.max_samples)):
        if path:
            load_prompts(path, input_key=d.input_key, label_key=d.label_key, input_template=d.input_template,
                         max_samples=max_samples)
    if cfg.eval.verifier:
        load_reward(cfg.eval.verifier)


def run(argv: list[str]) -> int:
    cfg = parse_rl_args(argv)
    check_inputs(cfg)
    RLTrainer.from_config(cfg).train()
    return 0
