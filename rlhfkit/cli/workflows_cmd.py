"""`rlhfkit generate`, `rlhfkit train rs` and `rlhfkit train iterative-dpo`: parse and validate the
flags, check the prompts and the reward before any model loads, then the public API
(rlhfkit.api.workflows); this module only prints."""

from __future__ import annotations

import time

from rlhfkit.api.builder import label_reward, load_reward, prompt_options, prompt_source
from rlhfkit.api.workflows import IterativeDPO, RejectionSampling, generate
from rlhfkit.config.generate import GenerateConfig, IterativeDPOConfig, RSConfig
from rlhfkit.data.prompts import check_prompts
from rlhfkit.errors import ConfigError

ROUNDS = {"rs": (RSConfig, RejectionSampling), "iterative-dpo": (IterativeDPOConfig, IterativeDPO)}


def check_inputs(cfg: GenerateConfig) -> None:
    """A missing or malformed prompt dataset fails here, before the model loads; so does a reward that scores
    against each prompt's label (builtin:math, builtin:code) without --data.label_key or with a null label, as
    in `train rl` and `plan`."""
    if not cfg.data.prompt_dataset:
        raise ConfigError("--data.prompt_dataset is required (a .jsonl/.json/.parquet file, a datasets folder "
                          "or a hub dataset name)")
    check_prompts(prompt_source(cfg), **prompt_options(cfg), labels_for=label_reward(cfg))


def run_generate(argv: list[str]) -> int:
    cfg = GenerateConfig.from_args(argv)
    check_inputs(cfg)
    t0 = time.perf_counter()
    path = generate(cfg)
    with path.open(encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    print(f"done in {time.perf_counter() - t0:.0f}s: {lines} samples written to {path}")
    return 0


def run_rounds(kind: str, argv: list[str]) -> int:
    """`rlhfkit train rs|iterative-dpo ARGV`."""
    config_class, workflow = ROUNDS[kind]
    cfg = config_class.from_args(argv)
    check_inputs(cfg)
    if cfg.reward.remote_url and not cfg.reward.remote_url.startswith(("http://", "https://")):
        load_reward(cfg.reward.remote_url)  # a broken reward file fails before the models load
    t0 = time.perf_counter()
    rounds = workflow.from_config(cfg).run()
    last = rounds[-1]
    print(f"done in {time.perf_counter() - t0:.0f}s: {len(rounds)} rounds; summary in "
          f"{cfg.ckpt.output_dir}/summary.json" + (f"; model saved to {last['model']}" if last["model"] else ""))
    return 0
