"""A TRL `GRPOConfig` read field by field into `rlhfkit train rl` flags.

`grpo_argv(config)` gives every field of TRL 1.16's `GRPOConfig` one rule of `GRPO_RULES` (those of the
HF `TrainingArguments` it extends shared with SFT and DPO: config/trl_rules.py): mapped, noticed or
refused. `RLConfig.from_trl` parses the flags. A `GRPOConfig` is read by attribute; TRL is not imported.
"""

from __future__ import annotations

import math
from typing import Any

from rlhfkit.config.trl_names import grpo_config_flags
from rlhfkit.config.trl_rules import (
    HF,
    HUB,
    LOG,
    NOT_BUILT,
    Rule,
    apply_rules,
    flag,
    hf_rules,
    mapped,
    notice,
    opt,
    refuse,
    silent,
    table,
)
from rlhfkit.errors import ConfigError


def _generation(c: Any) -> int:
    """TRL's completions per generation: `generation_batch_size`, else per_device_train_batch_size *
    steps_per_generation (itself gradient_accumulation_steps where unset)."""
    steps = getattr(c, "steps_per_generation", None) or int(c.gradient_accumulation_steps)
    return getattr(c, "generation_batch_size", None) or int(c.per_device_train_batch_size) * steps


def _batch(_v: Any, c: Any) -> list[str]:
    """TRL: `per_device_train_batch_size` completions per forward/backward, `gradient_accumulation_steps` of
    them per optimizer step, `generation_batch_size` completions (`num_generations` per prompt) per generation.
    One process: our micro batch, train batch = micro * accumulation, prompts per rollout = generation /
    num_generations; `steps_per_generation` then follows (generation / train batch)."""
    micro, accum, n = int(c.per_device_train_batch_size), int(c.gradient_accumulation_steps), int(c.num_generations)
    generation = _generation(c)
    if generation % n or generation % (micro * accum):
        raise ConfigError(f"TRL generation_batch_size={generation}: needs to be a multiple of num_generations ({n}) "
                          f"and of per_device_train_batch_size * gradient_accumulation_steps ({micro * accum})")
    return ["--train.micro_batch_size", str(micro), "--train.batch_size", str(micro * accum),
            "--rollout.batch_size", str(generation // n), "--rollout.n_samples_per_prompt", str(n),
            "--train.max_epochs", str(int(c.num_iterations))]


def _max_steps(v: Any, c: Any) -> list[str]:
    """TRL counts optimizer steps; one rollout makes generation / (micro * accumulation) * num_iterations. TRL
    passes over the prompts as often as max_steps takes (num_train_epochs unread): as many passes as rollouts
    (each pass is at least one), --train.max_steps the cap."""
    if int(v) <= 0:
        return []
    train_batch = int(c.per_device_train_batch_size) * int(c.gradient_accumulation_steps)
    per_rollout = _generation(c) // train_batch * int(c.num_iterations)
    rollouts = str(math.ceil(int(v) / per_rollout))
    return ["--train.max_steps", rollouts, "--train.num_episodes", rollouts]


def _epochs(v: Any, c: Any) -> list[str]:
    if int(getattr(c, "max_steps", -1)) > 0:
        return []  # TRL: max_steps wins (its rule sets the passes)
    if float(v) != int(v):
        raise ConfigError(f"TRL num_train_epochs={v}: rlhfkit's --train.num_episodes counts whole passes; "
                          "use a whole number or max_steps")
    return ["--train.num_episodes", str(int(v))]


def _beta(v: Any, _c: Any) -> list[str]:
    flags = ["--algo.kl.init_coef", repr(float(v))]
    return flags + (["--algo.kl.use_loss", "true", "--algo.kl.estimator", "k3"] if float(v) else [])


def _scale(v: Any, _c: Any) -> list[str]:
    table = {"group": "group_norm", True: "group_norm", "true": "group_norm", "none": "dr_grpo", False: "dr_grpo",
             "false": "dr_grpo", "batch": "group_mean_batch_std"}
    if v not in table:
        raise ConfigError(f"TRL scale_rewards={v!r}: unknown; valid: group, batch, none")
    return ["--algo.advantage.estimator", table[v]]


def _eval_samples(v: Any, c: Any) -> list[str]:
    """TRL samples its evaluation completions as it samples training ones."""
    if v is None:
        return []
    return ["--eval.n_samples", str(int(v)), "--eval.temperature", repr(float(c.temperature)),
            "--eval.top_p", repr(float(c.top_p)), "--eval.top_k", str(int(c.top_k) or -1)]


_EVAL = "ignored: rlhfkit evaluates with --eval.dataset and --eval.steps"
_VLLM = "ignored: rlhfkit runs one vLLM engine in the trainer's process (--rollout.engine vllm, docs/scaling.md)"
_LOSS = "read by loss_type's rule (rlhfkit.config.trl_names.grpo_config_flags)"
_BATCH = "read by the batch rule (per_device_train_batch_size)"


GRPO_RULES: dict[str, Rule] = {**hf_rules("actor.adam.", "actor.", "actor.", _EVAL), **table(
    ("per_device_train_batch_size", mapped(_batch)),
    ("gradient_accumulation_steps num_generations generation_batch_size steps_per_generation num_iterations",
     silent(_BATCH)),
    ("max_steps", mapped(_max_steps)), ("num_train_epochs", mapped(_epochs)),
    ("max_completion_length", flag("rollout.max_new_tokens")),
    ("max_prompt_length", opt("data.prompt_max_len")),
    ("temperature", flag("rollout.temperature", repr)), ("top_p", flag("rollout.top_p", repr)),
    ("top_k", mapped(lambda v, c: ["--rollout.top_k", str(int(v) if v else -1)])),
    ("repetition_penalty", flag("rollout.repetition_penalty", repr)),
    ("min_p", refuse(f"min_p sampling is {NOT_BUILT}; use top_p / top_k", None)),
    ("beta", mapped(_beta)), ("scale_rewards", mapped(_scale)),
    ("loss_type", mapped(lambda v, c: grpo_config_flags(c))),
    ("importance_sampling_level epsilon epsilon_high delta sapo_temperature_pos sapo_temperature_neg vespo_k_pos "
     "vespo_lambda_pos vespo_k_neg vespo_lambda_neg mask_truncated_completions disable_dropout", silent(_LOSS)),
    ("log_completions", mapped(lambda v, c: [] if not v else
                               ["--logger.log_samples", str(getattr(c, "num_completions_to_print", None) or 4)])),
    ("num_completions_to_print", silent("read by log_completions' rule")),
    ("num_generations_eval", mapped(_eval_samples)),
    ("use_vllm", mapped(lambda v, c: ["--rollout.engine", "vllm" if v else "hf"])),
    ("vllm_gpu_memory_utilization", mapped(lambda v, c: ["--vllm.gpu_memory_utilization", repr(float(v))]
                                           if c.use_vllm else [])),
    ("vllm_tensor_parallel_size", mapped(lambda v, c: ["--vllm.tensor_parallel_size", str(int(v))]
                                         if c.use_vllm else [])),
    ("reward_weights", refuse("rlhfkit takes reward weights beside the reward functions: "
                              "RLTrainer.from_config(cfg, reward_fn=[f1, f2], reward_weights=[...])", None)),
    ("multi_objective_aggregation", refuse("only sum_then_normalize (TRL's default) is built", "sum_then_normalize")),
    ("sync_ref_model top_entropy_quantile entropy_coef use_adaptive_entropy off_policy_mask_threshold "
     "max_tool_calling_iterations cast_lm_head_to_fp32 router_aux_loss_coef generation_kwargs "
     "vllm_importance_sampling_cap", refuse(f"{NOT_BUILT}; leave it at TRL's default")),
    ("ref_model_mixup_alpha ref_model_sync_steps entropy_coef_min entropy_coef_max entropy_coef_delta "
     "entropy_target", silent("read only with sync_ref_model / use_adaptive_entropy, which are refused")),
    ("vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
     "vllm_importance_sampling_clip_min use_bias_correction_kl",
     notice("rlhfkit's rollout/training mismatch correction is --actor.is_correction_* (docs/algorithms.md)")),
    ("ds3_gather_for_generation shuffle_dataset model_init_kwargs trust_remote_code cache_implementation "
     "use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged",
     notice(HF)),
    ("log_completions_hub_repo", notice(HUB)), ("log_multimodal log_unique_prompts", notice(LOG)),
    ("vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_server_base_url vllm_server_host vllm_server_port "
     "vllm_server_timeout vllm_group_port vllm_max_model_length", notice(_VLLM)),
    ("chat_template_kwargs", refuse("rlhfkit renders the chat template without extra arguments", None)),
    ("vllm_structured_outputs_regex", refuse(f"structured outputs are {NOT_BUILT}")),
    ("pad_to_multiple_of", notice("ignored: rlhfkit pads each micro batch to its longest sample", "auto", None)),
)}



def grpo_argv(config: Any) -> list[str]:
    """The `train rl` flags of a TRL `GRPOConfig`, with TRL's prompt column: every field's rule applied (a
    field without one is a ConfigError naming it, so a new TRL field is noticed), noticed fields logged
    once, refusals raised."""
    return ["--data.input_key", "prompt", *apply_rules(config, GRPO_RULES, "GRPOConfig")]
