"""What `rlhfkit train rl` accepts: the names of every choice, the range of every numeric flag, and
`validate`, which refuses settings that do not fit together before any model loads and returns the
derived batch arithmetic of OpenRLHF's PPO loop (`BatchPlan`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlhfkit.config.checks import (
    check_device,
    check_gpu_ask,
    check_input_template,
    check_keep_best,
    check_micro_batches,
    check_precision,
    check_qlora,
    divisor_hint,
    one_of,
    require,
)
from rlhfkit.config.ranges import ORDERED, check_ranges, validate_table

if TYPE_CHECKING:
    from rlhfkit.config.rl import RLConfig

# The names the trainer accepts; the math behind each lives in rlhfkit.core.
ENGINES = ("hf", "vllm")
ADVANTAGE_ESTIMATORS = ("gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo",
                        "group_mean_batch_std")
GROUP_ESTIMATORS = ("reinforce_baseline", "rloo", "group_norm", "dr_grpo", "group_mean_batch_std")
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_stable")
LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
POLICY_LOSS_TYPES = ("ppo", "gspo", "cispo", "sapo", "clip_cov", "kl_cov", "gmpo", "vespo")
LR_SCHEDULERS = ("constant", "linear", "cosine", "cosine_with_min_lr")
TRUNCATIONS = ("skip", "error", "left", "right", "middle")  # --data.truncation (data/truncate.py)
DTYPES = ("float32", "bfloat16", "float16")
AUTOCASTS = (*DTYPES, "auto")
WANDB_MODES = ("online", "offline", "disabled")
WHITEN_MODES = ("true", "mean", "false")
OPTIMS = ("adam", "muon")
CRITIC_ESTIMATORS = ("gae",)  # the estimators that train a critic (core.advantages: needs_critic)
IS_CORRECTION_TYPES = ("tis", "icepop", "seq-mask-tis", "seq_mask_tis")  # OpenRLHF's names; underscores too
LOG_LEVELS = ("debug", "info", "warning", "error")
ON_RERENDER = ("keep", "segment")  # agents.tools.agent.ON_RERENDER


@dataclass(frozen=True)
class BatchPlan:
    """Derived batch arithmetic (OpenRLHF's PPO loop), filled in by `validate`."""

    samples_per_rollout: int
    micro_batches_per_step: int
    optimizer_steps_per_rollout: int


ADAM_RANGES = {"lr": "> 0", "betas": "[0, 1)", "eps": "> 0", "weight_decay": ">= 0"}
MUON_RANGES = {"lr": "> 0", "momentum": "[0, 1)", "ns_steps": "[1, 99]"}
LOSS_SCALE_RANGES = {"initial_scale_power": "[0, 64]", "window": ">= 1", "hysteresis": ">= 1", "min_scale": "> 0"}
SEED_RANGE = "[0, 4294967295]"
CODE_SANDBOXES = ("bwrap", "remote", "none")

# The allowed range of every numeric flag of `train rl` (see config/ranges.py); checked first by `validate`.
RL_RANGES = validate_table({
    **{f"actor.adam.{k}": v for k, v in ADAM_RANGES.items()},
    **{f"{part}.muon.{k}": v for part in ("actor", "critic") for k, v in MUON_RANGES.items()},
    **{f"train.loss_scale.{k}": v for k, v in LOSS_SCALE_RANGES.items()},
    "actor.freezing_steps": ">= 0",
    "actor.lr_warmup_ratio": "[0, 1]", "actor.lr_warmup_steps": ">= -1", "actor.min_lr_ratio": "[0, 1]",
    "actor.max_norm": ">= 0",
    "actor.eps_clip_low_high": ("[0, 1]", ">= 0"), "actor.dual_clip": "> 1", "actor.entropy_coef": ">= 0",
    "actor.aux_loss_coef": ">= 0",
    "actor.ema_beta": "[0, 1]", "actor.sapo_temperatures": "> 0", "actor.clip_cov_ratio": "[0, 1]",
    "actor.clip_cov_bounds": ORDERED, "actor.kl_cov_ratio": "[0, 1]", "actor.kl_cov_coef": ">= 0",
    "actor.vespo_k": ">= 0", "actor.vespo_lambda": "> 0",
    **{f"critic.adam.{k}": v for k, v in ADAM_RANGES.items()},
    "critic.value_clip": "> 0", "critic.max_norm": ">= 0",
    "reward.request_timeout": "> 0", "reward.max_retries": ">= 0", "reward.request_batch_size": ">= 1",
    "reward.overlong_buffer_len": ">= 1", "reward.overlong_penalty_factor": ">= 0", "reward.clip_range": ORDERED,
    "reward.stop_properly_penalty_coef": "< 0 or [0, 1]",
    "reward.timeout": "> 0",
    "reward.code.timeout": "> 0", "reward.code.cpu_seconds": ">= 1", "reward.code.memory_mb": ">= 64",
    "reward.code.workers": "[1, 64]",
    "data.max_samples": ">= 1", "data.prompt_max_len": ">= 1", "data.max_images_per_prompt": ">= 1",
    "rollout.batch_size": ">= 1", "rollout.n_samples_per_prompt": ">= 1", "rollout.max_new_tokens": ">= 1",
    "rollout.temperature": ">= 0", "rollout.top_p": "(0, 1]", "rollout.top_k": "-1 or >= 1",
    "rollout.repetition_penalty": "> 0", "rollout.stop_token_ids": ">= 0", "rollout.max_batch_size": ">= 1",
    "rollout.num_workers": ">= 1",
    "algo.advantage.gamma": "[0, 1]", "algo.advantage.lambd": "[0, 1]",
    "algo.advantage.is_correction_threshold": ORDERED,
    "algo.kl.init_coef": ">= 0", "algo.kl.target": "> 0", "algo.kl.horizon": ">= 1",
    "algo.dynamic_filtering_range": ORDERED, "algo.dynamic_filtering_max_rounds": ">= 1",
    "algo.teacher_coef": ">= 0", "algo.teacher_topk": ">= 0",
    "agent.max_turns": ">= 1", "agent.max_response_tokens": ">= 1", "agent.tool_calls_per_episode": ">= 1",
    "agent.tool_timeout": "> 0", "agent.tool_result_tokens": ">= 1", "agent.timeout": "> 0",
    "agent.max_calls": ">= 1", "agent.env_reward_weight": ">= 0",
    "train.batch_size": ">= 1", "train.micro_batch_size": ">= 1", "train.max_tokens_per_micro_batch": ">= 1",
    "train.max_epochs": ">= 1", "train.num_episodes": ">= 1", "train.max_steps": ">= 1", "train.seed": SEED_RANGE,
    "train.num_threads": ">= 1", "train.max_skipped_steps": ">= 0", "train.max_staleness": ">= 0",
    "train.partial_rollout_tokens": ">= 1",
    "ckpt.save_steps": "-1 or >= 1", "ckpt.max_num": ">= 1",
    "logger.log_samples": ">= 0",
    "eval.steps": "-1 or >= 1", "eval.max_samples": ">= 1", "eval.n_samples": ">= 1", "eval.k": ">= 1",
    "eval.temperature": ">= 0", "eval.top_p": "(0, 1]", "eval.top_k": "-1 or >= 1",
    "distributed.num_cpus": ">= 1", "distributed.num_gpus_per_worker": ">= 0", "distributed.num_gpus_trainer": ">= 0",
    "fsdp.num_ranks": ">= 1",
    "vllm.gpu_memory_utilization": "(0, 1]", "vllm.tensor_parallel_size": ">= 1",
    "ds.lora.rank": ">= 0", "ds.lora.alpha": "> 0", "ds.lora.dropout": "[0, 1)",
})


def validate(cfg: RLConfig) -> BatchPlan:
    """Refuse settings that do not fit together; return the derived batch plan."""
    r, t, a = cfg.rollout, cfg.train, cfg.algo
    check_ranges(cfg, RL_RANGES)
    one_of("algo.advantage.estimator", a.advantage.estimator, ADVANTAGE_ESTIMATORS)
    one_of("algo.kl.estimator", a.kl.estimator, KL_ESTIMATORS)
    one_of("algo.teacher_kl_estimator", a.teacher_kl_estimator, KL_ESTIMATORS)
    one_of("actor.loss_agg_mode", cfg.actor.loss_agg_mode, LOSS_AGG_MODES)
    one_of("actor.policy_loss_type", cfg.actor.policy_loss_type, POLICY_LOSS_TYPES)
    one_of("actor.lr_scheduler", cfg.actor.lr_scheduler, LR_SCHEDULERS)
    one_of("data.truncation", cfg.data.truncation, TRUNCATIONS)
    config_overrides(cfg)
    one_of("actor.dtype", cfg.actor.dtype, DTYPES)
    one_of("algo.advantage.whiten", a.advantage.whiten, WHITEN_MODES)
    one_of("algo.advantage.is_correction_type", a.advantage.is_correction_type, IS_CORRECTION_TYPES)
    require(a.advantage.is_correction_threshold[0] >= 0,
            f"--algo.advantage.is_correction_threshold: LOW must be >= 0 (a weight is a ratio of probabilities), "
            f"got {a.advantage.is_correction_threshold[0]}")
    if cfg.actor.autocast is not None:
        one_of("actor.autocast", cfg.actor.autocast, AUTOCASTS)
    check_precision("actor", cfg.actor.dtype, cfg.actor.autocast)
    check_device("--actor.device", cfg.actor.device)
    if a.advantage.estimator in GROUP_ESTIMATORS:
        require(r.n_samples_per_prompt >= 2,
                f"--algo.advantage.estimator {a.advantage.estimator} compares samples of one prompt: "
                f"set --rollout.n_samples_per_prompt to 2 or more (got {r.n_samples_per_prompt})")
    if a.dynamic_filtering_enable:
        require(r.n_samples_per_prompt >= 2,
                "--algo.dynamic_filtering_enable needs --rollout.n_samples_per_prompt >= 2")
    one_of("agent.on_rerender", cfg.agent.on_rerender, ON_RERENDER)
    check_micro_batches("train", t.batch_size, t.micro_batch_size)
    samples = r.batch_size * r.n_samples_per_prompt
    require(samples % t.batch_size == 0,
            f"one rollout makes {samples} samples (--rollout.batch_size {r.batch_size} x "
            f"--rollout.n_samples_per_prompt {r.n_samples_per_prompt}), which --train.batch_size "
            f"({t.batch_size}) must divide; e.g. --train.batch_size {divisor_hint(samples, t.batch_size)}")
    w = cfg.reward
    one_of("reward.code.sandbox", w.code.sandbox, CODE_SANDBOXES)
    require(w.code.sandbox != "remote" or bool(w.code.remote_url),
            "--reward.code.sandbox remote needs --reward.code.remote_url http://HOST:PORT")
    if w.overlong_buffer_len is not None:
        require(0 < w.overlong_buffer_len <= r.max_new_tokens,
                f"--reward.overlong_buffer_len must be in [1, --rollout.max_new_tokens={r.max_new_tokens}]")
    check_input_template(cfg.data.input_template)
    _validate_eval(cfg)
    _validate_distributed(cfg)
    _validate_scale(cfg)
    _validate_lora(cfg)
    _validate_optim(cfg)
    _validate_routing_replay(cfg)
    one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)
    one_of("logger.log_level", cfg.logger.log_level, LOG_LEVELS)
    return BatchPlan(
        samples_per_rollout=samples,
        micro_batches_per_step=t.batch_size // t.micro_batch_size,
        optimizer_steps_per_rollout=samples // t.batch_size * t.max_epochs,
    )


def _validate_eval(cfg: RLConfig) -> None:
    e = cfg.eval
    check_keep_best(cfg.ckpt.keep_best)
    require(e.n_samples == 1 or e.temperature > 0,
            f"--eval.n_samples {e.n_samples} with --eval.temperature 0 draws identical greedy samples; "
            "set --eval.temperature (e.g. 0.7) or --eval.n_samples 1")
    bad = [k for k in e.k if not 1 <= k <= e.n_samples]
    require(not bad, f"--eval.k {','.join(map(str, e.k))}: every k must be in [1, --eval.n_samples "
                     f"{e.n_samples}]; raise --eval.n_samples or drop {bad}")


BACKENDS = ("local", "ray")


def _validate_distributed(cfg: RLConfig) -> None:
    d, t, n = cfg.distributed, cfg.train, cfg.rollout.num_workers
    one_of("distributed.backend", d.backend, BACKENDS)
    require(d.backend == "ray" or (n == 1 and d.address is None),
            "--rollout.num_workers > 1 and --distributed.address need --distributed.backend ray")
    actors = n + (cfg.fsdp.num_ranks if cfg.fsdp.enable else 1)  # each rollout worker and trainer actor: 1 CPU
    require(d.num_cpus is None or d.address is not None or d.backend != "ray" or d.num_cpus >= actors,
            f"--distributed.num_cpus {d.num_cpus} is fewer than the {actors} actors of a local Ray cluster "
            f"({n} rollout worker(s) and the trainer's, one CPU each): Ray would leave the rest waiting forever; "
            f"set it to {actors} or more, or leave it unset")
    if t.async_enable:
        require(d.backend == "ray", "--train.async_enable overlaps generation on Ray rollout workers with "
                                    "training: add --distributed.backend ray (the local backend is synchronous)")
        require(t.max_staleness >= 1, "--train.async_enable trains on samples one policy version old: "
                                      f"set --train.max_staleness 1 or more (got {t.max_staleness})")
    else:
        require(not t.partial_rollout_enable, "--train.partial_rollout_enable continues generations across the "
                "weight updates of async training: add --train.async_enable (and --distributed.backend ray)")
        require(t.max_staleness == 0, f"--train.max_staleness {t.max_staleness} without --train.async_enable: "
                                      "a synchronous run trains on fresh samples only; add --train.async_enable")


def config_overrides(cfg: RLConfig) -> dict | None:
    """--actor.config_overrides as a dict (None when unset); ConfigError for text that is not a JSON object,
    or with Ray's HF rollout workers (they load the model's folder themselves; vLLM takes hf_overrides)."""
    text = cfg.actor.config_overrides
    if not text or text == "none":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        value = exc
    require(isinstance(value, dict), f"--actor.config_overrides {text!r}: expected a JSON object of config fields, "
                                     "e.g. '{\"max_position_embeddings\": 32768}'")
    require(cfg.rollout.engine == "vllm" or cfg.distributed.backend == "local",
            "--actor.config_overrides: the HF engines of Ray rollout workers load the model's folder with its own "
            "config; use --distributed.backend local or --rollout.engine vllm, or write the fields into the "
            "folder's config.json")
    return value


def _validate_scale(cfg: RLConfig) -> None:
    """--rollout.engine, --vllm.*, --fsdp.* (whether vllm imports and torchrun runs is checked at build time)."""
    one_of("rollout.engine", cfg.rollout.engine, ENGINES)
    require(not (cfg.rollout.engine == "vllm" and cfg.train.partial_rollout_enable),
            "--train.partial_rollout_enable continues HF engine generations across weight updates; a vLLM engine "
            "finishes each generation with the weights it started with: drop it or use --rollout.engine hf")
    f = cfg.fsdp
    require(f.num_ranks == 1 or (f.enable and cfg.distributed.backend == "ray"),
            f"--fsdp.num_ranks {f.num_ranks} sets the trainer actors of --fsdp.enable with --distributed.backend ray; "
            "under torchrun, --nproc_per_node sets the ranks: drop it or add both")
    require(not (f.enable and cfg.distributed.backend == "ray") or cfg.train.batch_size % f.num_ranks == 0,
            f"--train.batch_size {cfg.train.batch_size} must be a multiple of --fsdp.num_ranks {f.num_ranks}: each "
            "trainer actor takes an equal share of every optimizer step")
    for name in ("num_gpus_per_worker", "num_gpus_trainer"):
        check_gpu_ask(f"--distributed.{name}", getattr(cfg.distributed, name))


def _validate_optim(cfg: RLConfig) -> None:
    """--actor.optim / --critic.optim, and the critic warm-up of --actor.freezing_steps."""
    for part in ("actor", "critic"):
        one_of(f"{part}.optim", getattr(cfg, part).optim, OPTIMS)
    estimator = cfg.algo.advantage.estimator
    require(cfg.actor.freezing_steps == 0 or estimator in CRITIC_ESTIMATORS,
            f"--actor.freezing_steps {cfg.actor.freezing_steps} warms up the critic, and --algo.advantage.estimator "
            f"{estimator} trains none: drop it, or use --algo.advantage.estimator gae")


def _validate_routing_replay(cfg: RLConfig) -> None:
    """--actor.routing_replay hooks the routers of eager forwards."""
    require(not (cfg.actor.routing_replay and cfg.train.compile_enable),
            "--actor.routing_replay does not combine with --train.compile_enable yet (the compiled layers do not "
            "run the replay's router hooks): drop one of them")


def _validate_lora(cfg: RLConfig) -> None:
    """LoRA in RL runs with the hf engine, in one process (which generates with the adapted weights),
    sharded under FSDP or on Ray rollout workers (which hold the same adapters, over the same 4-bit base
    with QLoRA), and with the vllm engine, in the trainer's process or on Ray rollout workers (which
    load the adapters merged into their layers at every weight sync; with QLoRA into the dequantized
    4-bit base)."""
    check_qlora(cfg.ds)
