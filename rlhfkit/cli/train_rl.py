"""`rlhfkit train rl` (and `train opd`, on-policy distillation): parse and validate flags, check the
data and files before any model loads, then `rlhfkit.RLTrainer.from_config(cfg).train()`
(`OPDTrainer` for opd)."""

from __future__ import annotations

from rlhfkit.api.builder import label_reward, load_reward, prompt_options, prompt_source
from rlhfkit.api.rl import OPDTrainer, RLTrainer
from rlhfkit.api.vision import check_data, policy_folder
from rlhfkit.config import RLConfig
from rlhfkit.config.opd import OPDConfig
from rlhfkit.data.prompts import check_prompts
from rlhfkit.errors import ConfigError


def parse_rl_args(argv: list[str]) -> RLConfig:
    return RLConfig.from_args(argv)


def check_inputs(cfg: RLConfig) -> None:
    """Fail fast, before models load, on a missing dataset or key, a prompt of the wrong type (the checks
    of the real load, with the same flags), or a broken verifier file."""
    d = cfg.data
    own = (cfg.agent.func_path or "").startswith("verifiers:")  # the environment's own dataset
    if not d.prompt_dataset and not own:
        raise ConfigError("--data.prompt_dataset is required (a .jsonl/.json/.parquet file, a datasets folder "
                          "or a hub dataset name; with --agent.func_path verifiers:ENV_ID the environment's own)")
    vision = policy_folder(cfg) is not None  # a VLM: prompts and images; a text model: no images
    for dataset, is_eval in ((prompt_source(cfg), False), (cfg.eval.dataset, True)):
        if dataset:
            check_data(cfg, dataset, vision, eval=is_eval)
            if not vision:
                check_prompts(dataset, **prompt_options(cfg, eval=is_eval), labels_for=label_reward(cfg, is_eval))
    if cfg.eval.verifier:
        load_reward(cfg.eval.verifier)


def run(argv: list[str]) -> int:
    cfg = parse_rl_args(argv)
    check_inputs(cfg)
    RLTrainer.from_config(cfg).train()
    return 0


def run_opd(argv: list[str]) -> int:
    cfg = OPDConfig.from_args(argv)
    check_inputs(cfg)
    OPDTrainer.from_config(cfg).train()
    return 0
