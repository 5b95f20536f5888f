"""A TRL `GRPOConfig` read field by field into `rlhfkit train rl` flags.

`grpo_argv(config)` gives every field of TRL 1.16's `GRPOConfig` (and the HF `TrainingArguments` it
extends) one rule in `GRPO_RULES`: mapped (a function of the value and the whole config -> flags),
noticed (HF Trainer machinery that does not change the math: a one-line warning when the value is
not TRL's default) or refused (math rlhfkit cannot honour: a one-line ConfigError when the value is
not TRL's default, or not one of the values the rule accepts). `RLConfig.from_trl` parses the flags.
A `GRPOConfig` is read by attribute; TRL is not imported here.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Callable
from typing import Any

from rlhfkit.config.trl_names import grpo_config_flags
from rlhfkit.errors import ConfigError

log = logging.getLogger("rlhfkit")
Mapper = Callable[[Any, Any], list[str]]


@dataclasses.dataclass(frozen=True)
class Rule:
    """kind: mapped (`to(value, config)` -> flags), noticed or refused (`note`, acted on when the value is
    not one of `same`, or of TRL's default when `same` is empty) or silent (set by TRL itself, e.g. derived
    in `__post_init__`, or read by another field's rule)."""

    kind: str
    to: Mapper | None = None
    note: str = ""
    same: tuple = ()


def _m(to: Mapper) -> Rule:
    return Rule("mapped", to=to)


def _flag(name: str, conv: Callable[[Any], str] = str) -> Rule:
    return Rule("mapped", to=lambda v, c: [f"--{name}", conv(v)])


def _notice(note: str, *same: Any) -> Rule:
    return Rule("noticed", note=note, same=same)


def _refuse(note: str, *same: Any) -> Rule:
    return Rule("refused", note=note, same=same)


def _silent(note: str) -> Rule:
    return Rule("silent", note=note)


def _plain(value: Any) -> Any:
    value = value.value if isinstance(value, enum.Enum) else value
    return None if value in ([], "", "none", ["none"], {}) else value


def _batch(_v: Any, c: Any) -> list[str]:
    """TRL: `per_device_train_batch_size` completions per forward/backward, `gradient_accumulation_steps` of
    them per optimizer step, `generation_batch_size` completions (`num_generations` per prompt) per generation.
    One process: our micro batch, train batch = micro * accumulation, prompts per rollout = generation /
    num_generations; `steps_per_generation` then follows (generation / train batch)."""
    micro, accum, n = int(c.per_device_train_batch_size), int(c.gradient_accumulation_steps), int(c.num_generations)
    steps = getattr(c, "steps_per_generation", None) or accum
    generation = getattr(c, "generation_batch_size", None) or micro * steps
    if generation % n or generation % (micro * accum):
        raise ConfigError(f"TRL generation_batch_size={generation}: needs to be a multiple of num_generations ({n}) "
                          f"and of per_device_train_batch_size * gradient_accumulation_steps ({micro * accum})")
    return ["--train.micro_batch_size", str(micro), "--train.batch_size", str(micro * accum),
            "--rollout.batch_size", str(generation // n), "--rollout.n_samples_per_prompt", str(n),
            "--train.max_epochs", str(int(c.num_iterations))]


def _max_steps(v: Any, c: Any) -> list[str]:
    """TRL counts optimizer steps; one rollout makes generation / (micro * accumulation) * num_iterations."""
    if int(v) <= 0:
        return []
    accum = int(c.gradient_accumulation_steps)
    generation = (getattr(c, "generation_batch_size", None)
                  or int(c.per_device_train_batch_size) * (getattr(c, "steps_per_generation", None) or accum))
    per_rollout = generation // (int(c.per_device_train_batch_size) * accum) * int(c.num_iterations)
    return ["--train.max_steps", str(math.ceil(int(v) / per_rollout))]


def _epochs(v: Any, c: Any) -> list[str]:
    if int(getattr(c, "max_steps", -1)) > 0:
        return []  # TRL: max_steps wins
    if float(v) != int(v):
        raise ConfigError(f"TRL num_train_epochs={v}: rlhfkit's --train.num_episodes counts whole passes; "
                          "use a whole number or max_steps")
    return ["--train.num_episodes", str(int(v))]


def _scheduler(v: Any, _c: Any) -> list[str]:
    kind = _plain(v)
    if kind not in ("constant", "cosine", "constant_with_warmup"):
        raise ConfigError(f"TRL lr_scheduler_type={kind!r} (TRL's default is linear): rlhfkit has constant, cosine "
                          "(to 0) and cosine_with_min_lr; set lr_scheduler_type='constant' or 'cosine'")
    return ["--actor.lr_scheduler", "cosine" if kind == "cosine" else "constant"]


def _warmup(v: Any, c: Any) -> list[str]:
    """TRL's warmup_steps below 1 is a ratio of all steps; its `constant` schedule has no warmup."""
    if _plain(getattr(c, "lr_scheduler_type", "linear")) == "constant":
        return ["--actor.lr_warmup_steps", "0"]
    if float(v) >= 1 or not v:
        return ["--actor.lr_warmup_steps", str(int(v))]
    return ["--actor.lr_warmup_ratio", repr(float(v)), "--actor.lr_warmup_steps", "-1"]


def _precision(_v: Any, c: Any) -> list[str]:
    if getattr(c, "bf16", False) and getattr(c, "fp16", False):
        raise ConfigError("TRL bf16 and fp16 both set: choose one")
    dtype = "bfloat16" if getattr(c, "bf16", False) else "float16" if getattr(c, "fp16", False) else "float32"
    return ["--actor.autocast", dtype] if dtype != "float32" else []


def _beta(v: Any, _c: Any) -> list[str]:
    flags = ["--algo.kl.init_coef", repr(float(v))]
    return flags + (["--algo.kl.use_loss", "true", "--algo.kl.estimator", "k3"] if float(v) else [])


def _scale(v: Any, _c: Any) -> list[str]:
    table = {"group": "group_norm", True: "group_norm", "true": "group_norm", "none": "dr_grpo", False: "dr_grpo",
             "false": "dr_grpo"}
    if v not in table:
        raise ConfigError(f"TRL scale_rewards={v!r}: rlhfkit scales by the group's std (group) or not at all "
                          "(none); batch scaling is not built")
    return ["--algo.advantage.estimator", table[v]]


def _report(v: Any, c: Any) -> list[str]:
    targets = [v] if isinstance(v, str) else list(v or [])
    targets = [t for t in targets if t not in ("none", "all")] if "all" not in targets else ["wandb"]
    if set(targets) - {"wandb"}:
        log.warning("TRL report_to=%s: rlhfkit logs to wandb, tensorboard (--logger.tensorboard_dir) and "
                    "metrics.jsonl; the others are ignored", v)
    return ["--logger.wandb.project", str(getattr(c, "project", "huggingface"))] if "wandb" in targets else []


def _eval_samples(v: Any, c: Any) -> list[str]:
    """TRL samples its evaluation completions as it samples training ones."""
    if v is None:
        return []
    return ["--eval.n_samples", str(int(v)), "--eval.temperature", repr(float(c.temperature)),
            "--eval.top_p", repr(float(c.top_p)), "--eval.top_k", str(int(c.top_k) or -1)]


def _opt(name: str) -> Rule:
    return _m(lambda v, c: [] if v is None else [f"--{name}", str(v)])


_HF = "ignored: HF Trainer machinery that rlhfkit's own loop replaces (the math is unchanged)"
_HUB = "ignored: rlhfkit does not push to the Hub; upload --ckpt.output_dir yourself"
_EVAL = "ignored: rlhfkit evaluates with --eval.dataset and --eval.steps"
_LOG = "ignored: rlhfkit logs every RL step to metrics.jsonl (--logger.*)"
_DIST = "ignored: rlhfkit's layout is set by --distributed.* / --fsdp.* (docs/scaling.md)"
_VLLM = "ignored: rlhfkit runs one vLLM engine in the trainer's process (--rollout.engine vllm, docs/scaling.md)"
_POST = "set by TRL/transformers in __post_init__ or read by another field's rule"
_LOSS = "read by loss_type's rule (rlhfkit.config.trl_names.grpo_config_flags)"
_BATCH = "read by the batch rule (per_device_train_batch_size)"
_NOT = "not built in rlhfkit"


def _table(*groups: tuple[str, Rule]) -> dict[str, Rule]:
    return {name: rule for names, rule in groups for name in names.split()}


GRPO_RULES: dict[str, Rule] = _table(
    ("per_device_train_batch_size", _m(_batch)),
    ("gradient_accumulation_steps num_generations generation_batch_size steps_per_generation num_iterations",
     _silent(_BATCH)),
    ("max_steps", _m(_max_steps)), ("num_train_epochs", _m(_epochs)),
    ("learning_rate", _flag("actor.adam.lr", repr)), ("lr_scheduler_type", _m(_scheduler)),
    ("warmup_steps", _m(_warmup)),
    ("warmup_ratio", _m(lambda v, c: ["--actor.lr_warmup_ratio", repr(float(v)), "--actor.lr_warmup_steps", "-1"]
                        if v else [])),
    ("weight_decay", _flag("actor.adam.weight_decay", repr)), ("adam_epsilon", _flag("actor.adam.eps", repr)),
    ("adam_beta1", _m(lambda v, c: ["--actor.adam.betas", repr(float(v)), repr(float(c.adam_beta2))])),
    ("adam_beta2", _silent("read by adam_beta1's rule")),
    ("max_grad_norm", _flag("actor.max_norm", repr)), ("seed", _flag("train.seed")),
    ("bf16", _m(_precision)), ("fp16", _silent("read by bf16's rule")),
    ("gradient_checkpointing", _flag("actor.gradient_checkpointing_enable", lambda v: str(bool(v)).lower())),
    ("activation_checkpointing", _silent(_POST)),
    ("output_dir", _opt("ckpt.output_dir")),
    ("save_steps", _m(lambda v, c: ["--ckpt.save_steps", str(int(v))] if float(v) >= 1 else [])),
    ("save_total_limit", _opt("ckpt.max_num")),
    ("report_to", _m(_report)), ("project", _silent("read by report_to's rule")),
    ("run_name", _opt("logger.wandb.name")),
    ("max_completion_length", _flag("rollout.max_new_tokens")),
    ("max_prompt_length", _opt("data.prompt_max_len")),
    ("temperature", _flag("rollout.temperature", repr)), ("top_p", _flag("rollout.top_p", repr)),
    ("top_k", _m(lambda v, c: ["--rollout.top_k", str(int(v) if v else -1)])),
    ("repetition_penalty", _flag("rollout.repetition_penalty", repr)),
    ("min_p", _refuse(f"min_p sampling is {_NOT}; use top_p / top_k", None)),
    ("beta", _m(_beta)), ("scale_rewards", _m(_scale)),
    ("loss_type", _m(lambda v, c: grpo_config_flags(c))),
    ("importance_sampling_level epsilon epsilon_high delta sapo_temperature_pos sapo_temperature_neg vespo_k_pos "
     "vespo_lambda_pos vespo_k_neg vespo_lambda_neg mask_truncated_completions disable_dropout", _silent(_LOSS)),
    ("log_completions", _m(lambda v, c: [] if not v else
                           ["--logger.log_samples", str(getattr(c, "num_completions_to_print", None) or 4)])),
    ("num_completions_to_print", _silent("read by log_completions' rule")),
    ("num_generations_eval", _m(_eval_samples)),
    ("use_vllm", _m(lambda v, c: ["--rollout.engine", "vllm" if v else "hf"])),
    ("vllm_gpu_memory_utilization", _m(lambda v, c: ["--vllm.gpu_memory_utilization", repr(float(v))]
                                       if c.use_vllm else [])),
    ("vllm_tensor_parallel_size", _m(lambda v, c: ["--vllm.tensor_parallel_size", str(int(v))] if c.use_vllm else [])),
    ("reward_weights", _refuse("rlhfkit takes reward weights beside the reward functions: "
                               "RLTrainer.from_config(cfg, reward_fn=[f1, f2], reward_weights=[...])", None)),
    ("multi_objective_aggregation", _refuse(f"only sum_then_normalize (TRL's default) is {'built'}",
                                            "sum_then_normalize")),
    ("optim", _refuse("rlhfkit's actor optimizer is AdamW (--actor.optim adam) or muon; use an adamw optim",
                      "adamw_torch_fused", "adamw_torch", "adamw_hf")),
    ("optim_args optim_target_modules lr_scheduler_kwargs label_smoothing_factor neftune_noise_alpha "
     "sync_ref_model top_entropy_quantile entropy_coef use_adaptive_entropy off_policy_mask_threshold "
     "max_tool_calling_iterations cast_lm_head_to_fp32 router_aux_loss_coef generation_kwargs "
     "vllm_importance_sampling_cap", _refuse(f"{_NOT}; leave it at TRL's default")),
    ("ref_model_mixup_alpha ref_model_sync_steps entropy_coef_min entropy_coef_max entropy_coef_delta "
     "entropy_target", _silent("read only with sync_ref_model / use_adaptive_entropy, which are refused")),
    ("vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
     "vllm_importance_sampling_clip_min use_bias_correction_kl",
     _notice("rlhfkit's rollout/training mismatch correction is --actor.is_correction_* (docs/algorithms.md)")),
    ("average_tokens_across_devices ds3_gather_for_generation shuffle_dataset "
     "tf32 torch_compile torch_compile_backend torch_compile_mode use_liger_kernel liger_kernel_config use_cache "
     "torch_empty_cache_steps auto_find_batch_size activation_checkpointing_kwargs gradient_checkpointing_kwargs "
     "full_determinism data_seed dataloader_drop_last dataloader_num_workers dataloader_persistent_workers "
     "dataloader_prefetch_factor dataloader_multiprocessing_context dataloader_in_order remove_unused_columns "
     "label_names train_sampling_strategy length_column_name skip_memory_metrics do_train do_eval do_predict "
     "resume_from_checkpoint model_init_kwargs trust_remote_code chat_template_kwargs cache_implementation "
     "use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged "
     "ignore_data_skip restore_callback_states_from_checkpoint enable_jit_checkpoint save_only_model "
     "save_on_each_node save_strategy load_best_model_at_end metric_for_best_model greater_is_better",
     _notice(_HF)),
    ("push_to_hub hub_token hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision "
     "log_completions_hub_repo", _notice(_HUB)),
    ("eval_strategy eval_steps eval_delay per_device_eval_batch_size prediction_loss_only eval_on_start "
     "eval_do_concat_batches eval_use_gather_object eval_accumulation_steps include_for_metrics batch_eval_metrics "
     "bf16_full_eval fp16_full_eval", _notice(_EVAL)),
    ("logging_strategy logging_steps logging_first_step log_on_each_node logging_nan_inf_filter "
     "include_num_input_tokens_seen log_level log_level_replica trackio_space_id trackio_bucket_id "
     "trackio_static_space_id log_multimodal log_unique_prompts debug", _notice(_LOG)),
    ("parallelism_config ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph "
     "ddp_backend ddp_timeout fsdp fsdp_config deepspeed local_rank", _notice(_DIST)),
    ("vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_server_base_url vllm_server_host vllm_server_port "
     "vllm_server_timeout vllm_group_port vllm_max_model_length", _notice(_VLLM)),
    ("vllm_structured_outputs_regex", _refuse(f"structured outputs are {_NOT}")),
    ("pad_to_multiple_of", _notice("ignored: rlhfkit pads each micro batch to its longest sample", "auto", None)),
    ("use_cpu accelerator_config dataloader_pin_memory disable_tqdm", _silent(_POST)),
)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def grpo_argv(config: Any) -> list[str]:
    """The `train rl` flags of a TRL `GRPOConfig`, with TRL's prompt column: every field's rule applied (a
    field without one is a ConfigError naming it, so a new TRL field is noticed), noticed fields logged
    once, refusals raised."""
    fields = dataclasses.fields(config) if dataclasses.is_dataclass(config) else ()
    unknown = [f.name for f in fields if f.name not in GRPO_RULES and not f.name.startswith("_")]
    if unknown:
        raise ConfigError(f"TRL GRPOConfig fields rlhfkit has no rule for: {', '.join(unknown)}; "
                          "set them as rlhfkit flags (docs/migration.md)")
    argv: list[str] = ["--data.input_key", "prompt"]  # TRL's GRPO datasets hold their prompts in "prompt"
    for f in fields:
        rule = GRPO_RULES.get(f.name)
        if rule is None:
            continue
        value = getattr(config, f.name)
        if rule.kind == "mapped":
            argv += rule.to(value, config)
            continue
        same = rule.same or (_plain(_default(f)),)
        if rule.kind == "silent" or _plain(value) in same:
            continue
        if rule.kind == "refused":
            raise ConfigError(f"TRL {f.name}={value!r}: {rule.note}")
        log.warning("TRL %s=%r: %s", f.name, value, rule.note)
    return argv
