"""verl's PPO trainer overrides and what rlhfkit does with each: one table, as data.

`rlhfkit train rl` takes verl's Hydra overrides as they are (`key=value`, `+key=value`, `++key=value`;
values in Hydra's syntax: `null`, `True`, `[a,b]`, quoted strings). Every leaf key of verl's PPO trainer
config (config/verl_names.py) has a rule here: exact keys in `VERL_RL_RULES`, families of keys (and the
free-form dictionaries Hydra's `+` adds to) in `VERL_RL_PATTERNS` (shell-style patterns, first match wins).
Each rule is an `Alias` (config/parse.py): mapped, noticed (a one-line warning) or refused (a one-line error).

The batch arithmetic (verl's docs/examples/config.rst): `data.train_batch_size` counts prompts per step
(`--rollout.batch_size`); `ppo_mini_batch_size` counts prompts and is multiplied by `rollout.n` into the
samples of one optimizer step (`--train.batch_size`); `*_micro_batch_size_per_gpu` counts samples per device
(`--train.micro_batch_size`); the deprecated global `ppo_micro_batch_size` is divided by the GPU count.

A command with verl overrides starts from verl's defaults where the math depends on them (`VERL_DEFAULTS`),
then the overrides, then rlhfkit's own `--section.name` flags, which win (a warning names each field that
both set). docs/migration.md's verl table is rendered from this module (config/verl_doc.py).
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlhfkit.config.openrlhf import conv, notice, refuse, to
from rlhfkit.config.parse import Alias, apply_flags
from rlhfkit.config.verl_convert import (
    AGG_MODES,
    LOSS_MODES,
    clip_range,
    engine,
    estimator,
    eval_sampling,
    files,
    global_micro,
    hydra_value,
    kl_settings,
    loggers,
    max_samples,
    mini_batch,
    model_overrides,
    named,
    norm_adv,
    overlong,
    pair,
    pick,
    resume,
    reward_function,
    reward_model,
    rollout_is,
    same_as_actor,
    sampling,
    scheduler,
    truncation,
    warmup_steps,
)
from rlhfkit.config.verl_names import VERL_MEGATRON_KEYS, VERL_PPO_KEYS
from rlhfkit.errors import ConfigError

log = logging.getLogger("rlhfkit")
Item = tuple[str, Alias, list[str]]
A, RO, M, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model.", "reward_model."
OFF = ("false", "none")  # hydra_value's False and null


# ------------------------------------------------------------------ notes shared by many keys
ENGINE = "ignored: a vLLM/SGLang engine setting of verl's rollout workers; rlhfkit's engine keeps its own (--vllm.*)"
FSDP = ("ignored: verl's FSDP/Megatron worker setting; rlhfkit shards the policy with --fsdp.enable true "
        "(docs/scaling.md), otherwise one process holds each model (same math)")
OFFLOAD = "ignored: rlhfkit keeps the trainer's weights and optimizer state on the training device (same result)"
GPUS = ("ignored: rlhfkit runs one process per device; shard over GPUs with --fsdp.enable true and add Ray "
        "rollout workers with --rollout.num_workers (docs/scaling.md)")
MICRO = ("ignored: rlhfkit's experience passes (old, reference and critic values) use the training micro-batches "
         "(--train.micro_batch_size, or --train.dynamic_batch_enable); same result")
PROFILER = "ignored: rlhfkit logs each stage's time every step (time/* in metrics.jsonl)"
TARGET = "ignored: Hydra's class path of a config section"
PADDING = "ignored: rlhfkit pads its micro-batches (same result as removing the padding)"
KERNEL = "ignored: a kernel choice of verl's workers; rlhfkit uses the kernels transformers picks (same math)"
CKPT = "ignored: rlhfkit's checkpoints hold the model, optimizer and schedule, RNG and data position"
LOGGERS = ("with wandb in trainer.logger: `--logger.wandb.project`, `--logger.wandb.name`; console and TensorBoard "
           "are always on")
MEGATRON_LORA = ("Megatron's LoRA is not used: set actor_rollout_ref.model.lora_rank, lora_alpha and target_modules "
                 "(peft LoRA, --ds.lora.*)")


# ------------------------------------------------------------------ the rules
def adder(table: dict[str, Alias]) -> Callable[[str, Alias], None]:
    """`add("KEY KEY ...", rule)`: one rule for each of the space-separated keys in `table`."""
    def add(names: str, rule: Alias) -> None:
        for name in names.split():
            table[name] = rule
    return add


VERL_RL_RULES: dict[str, Alias] = {}
_rule = adder(VERL_RL_RULES)


# data
_rule("data.train_files", conv(files("data.prompt_dataset"), "`--data.prompt_dataset` (a list: comma-separated)"))
_rule("data.val_files", conv(files("eval.dataset", single=True), "`--eval.dataset` (one file)"))
_rule("data.prompt_key", to("data.input_key", note="read as a chat (--data.apply_chat_template true)"))
_rule("data.train_max_samples", conv(max_samples("data.max_samples"), "`--data.max_samples` (-1: all)"))
_rule("data.val_max_samples", conv(max_samples("eval.max_samples"), "`--eval.max_samples` (-1: all)"))
_rule("data.max_prompt_length", to("data.prompt_max_len", note="longer prompts: data.truncation"))
_rule("data.max_response_length", to("rollout.max_new_tokens"))
_rule("data.train_batch_size", to("rollout.batch_size", note="prompts per step, as in verl"))
_rule("data.truncation data.filter_overlong_prompts",
      conv(truncation, "`--data.truncation`: skip with filter_overlong_prompts=True, else left, right, middle "
                       "(the prompt's own tokens cut, its chat template's kept) or error (verl's default)"))
_rule("data.image_key", to("data.image_key", note="vision-language prompts"))
_rule("data.reward_fn_key", refuse("rlhfkit passes the record's data_source column to compute_score",
                                   harmless=("data_source",)))
_rule("data.tokenizer", refuse("rlhfkit uses the policy's tokenizer", harmless=OFF))
_rule("data.shuffle data.validation_shuffle data.seed",
      notice("ignored: rlhfkit shuffles the prompts each epoch, seeded by --train.seed", 1))
_rule("data.dataloader_num_workers data.filter_overlong_prompts_workers data.use_shm data.val_batch_size "
      "data.return_raw_input_ids data.return_raw_chat data.return_full_prompt data.return_multi_modal_inputs "
      "data.image_patch_size data.trust_remote_code data.tool_config_path",
      notice("ignored: how verl's workers read the data; rlhfkit reads it in the training process", 1))
_rule("data.video_key", refuse("video prompts are not supported", harmless=("videos",)))
_rule("data.custom_cls.path data.custom_cls.name data.sampler.class_path data.sampler.class_name data.datagen.path "
      "data.datagen.name", refuse("rlhfkit reads its own prompt dataset (no custom dataset, sampler or generator "
                                  "class); convert the data to jsonl/parquet", harmless=OFF))
_rule("data.gen_batch_size", notice("ignored: rlhfkit generates --rollout.batch_size prompts a round and, with "
                                    "--algo.dynamic_filtering_enable, more rounds until the batch is full", 1))
# the model and LoRA
_rule(M + "path", to("actor.model_name_or_path"))
_rule(M + "enable_gradient_checkpointing", to("actor.gradient_checkpointing_enable"))
_rule(M + "lora_rank", to("ds.lora.rank"))
_rule(M + "lora_alpha", to("ds.lora.alpha"))
_rule(M + "target_modules", to("ds.lora.target_modules", note="a list: comma-separated"))
_rule(M + "exclude_modules " + M + "lora_adapter_path",
      refuse("rlhfkit's LoRA starts fresh on --ds.lora.target_modules (no excluded modules, no adapter to load)",
             harmless=OFF))
_rule(M + "lora.rank", refuse(MEGATRON_LORA, harmless=("0",)))
_rule(M + "trust_remote_code", refuse("rlhfkit loads models without remote code", harmless=OFF))
_rule(M + "custom_chat_template", refuse("rlhfkit applies the tokenizer's own chat template", harmless=OFF))
_rule(M + "external_lib", refuse("rlhfkit imports no extra model library", harmless=OFF))
_rule(M + "use_remove_padding", notice(PADDING, 1))
_rule(M + "use_shm " + M + "hf_config_path " + M + "tokenizer_path " + M + "torch_dtype",
      notice("ignored: rlhfkit loads the model, its config and tokenizer from the model path", 1))
_rule(M + "enable_activation_offload", notice(OFFLOAD, 1))
_rule(M + "use_liger " + M + "use_fused_kernels", notice(KERNEL, 1))
_rule(M + "mtp.enable " + M + "mtp.enable_train " + M + "mtp.enable_rollout",
      refuse("multi-token prediction is not supported", harmless=OFF))
# the actor: batches and epochs
_rule(A + "ppo_mini_batch_size", conv(mini_batch, "`--train.batch_size` = ppo_mini_batch_size x "
                                                   "actor_rollout_ref.rollout.n (samples per optimizer step)"))
_rule(A + "ppo_micro_batch_size_per_gpu", to("train.micro_batch_size", note="samples per device, as in verl"))
_rule(A + "ppo_micro_batch_size", conv(global_micro, "`--train.micro_batch_size` = this / (trainer.n_gpus_per_node "
                                                      "x trainer.nnodes), as verl divides it"))
_rule(A + "use_dynamic_bsz", to("train.dynamic_batch_enable"))
_rule(A + "ppo_max_token_len_per_gpu", to("train.max_tokens_per_micro_batch", note="with use_dynamic_bsz"))
_rule(A + "ppo_epochs", to("train.max_epochs", note="passes over each step's samples"))
_rule(A + "shuffle " + A + "data_loader_seed critic.shuffle critic.data_loader_seed",
      notice("ignored: rlhfkit orders each step's mini-batches itself, seeded by --train.seed", 1))
_rule(A + "rollout_n actor_rollout_ref.ref.rollout_n critic.rollout_n",
      notice("ignored: verl fills it from actor_rollout_ref.rollout.n", 1))
# the actor: the loss
_rule(A + "clip_ratio", conv(clip_range, "`--actor.eps_clip_low_high X X` where clip_ratio_low/high are null (verl "
                                          "reads it only then: their defaults are 0.2)"))
_rule(A + "clip_ratio_low", conv(clip_range, "the low half of `--actor.eps_clip_low_high`"))
_rule(A + "clip_ratio_high", conv(clip_range, "the high half of `--actor.eps_clip_low_high`"))
_rule(A + "clip_ratio_c", to("actor.dual_clip", note="dual-clip PPO; verl's default 3.0 is kept"))
_rule(A + "loss_agg_mode", conv(named(AGG_MODES, "actor.loss_agg_mode", "loss aggregation"),
                                "`--actor.loss_agg_mode`: token-mean -> token_mean, seq-mean-token-sum -> "
                                "seq_mean_token_sum, seq-mean-token-mean, seq-mean-token-sum-norm likewise"))
_rule(A + "loss_scale_factor", refuse("rlhfkit's seq_mean_token_sum_norm divides by --rollout.max_new_tokens "
                                      "(verl's default)", harmless=OFF))
_rule(A + "entropy_coeff", to("actor.entropy_coef"))
_rule(A + "calculate_entropy", notice("ignored: rlhfkit logs the policy's entropy", 1))
_rule(A + "policy_loss.loss_mode", conv(named(LOSS_MODES, "actor.policy_loss_type", "policy loss (gpg and "
                                                                                     "bypass_mode are not built)"),
                                        "`--actor.policy_loss_type`: vanilla -> ppo, geo_mean -> gmpo, gspo, "
                                        "clip_cov, kl_cov, cispo, sapo the same"))
_rule(A + "policy_loss.clip_cov_ratio", to("actor.clip_cov_ratio"))
_rule(A + "policy_loss.clip_cov_lb " + A + "policy_loss.clip_cov_ub",
      conv(pair(A + "policy_loss.clip_cov_lb", A + "policy_loss.clip_cov_ub", "1.0", "5.0", "actor.clip_cov_bounds"),
           "`--actor.clip_cov_bounds LB UB`"))
_rule(A + "policy_loss.kl_cov_ratio", to("actor.kl_cov_ratio"))
_rule(A + "policy_loss.ppo_kl_coef", to("actor.kl_cov_coef"))
_rule(A + "tau_pos " + A + "tau_neg",
      conv(pair(A + "tau_pos", A + "tau_neg", "1.0", "1.05", "actor.sapo_temperatures"),
           "`--actor.sapo_temperatures POS NEG`"))
_rule(A + "use_kl_loss " + A + "kl_loss_coef " + A + "kl_loss_type",
      conv(kl_settings, "`--algo.kl.use_loss true --algo.kl.init_coef COEF --algo.kl.estimator E` (low_var_kl -> k3, "
                "kl -> k1, mse -> k2)"))
_rule(A + "freeze_vision_tower", to("actor.freeze_visual_encoder"))
_rule(A + "router_replay.mode", conv(lambda vals, given: {"actor.routing_replay": str(vals[0] != "disabled").lower()},
                                     "`--actor.routing_replay true` unless disabled (rlhfkit replays the rollout's "
                                     "routing, R3)"))
# the actor: optimizer and schedule (the critic's below)
for _part, _ours in ((A + "optim.", "actor."), ("critic.optim.", "critic.")):
    _rule(_part + "lr", to(f"{_ours}adam.lr"))
    _rule(_part + "weight_decay", to(f"{_ours}adam.weight_decay"))
    _rule(_part + "betas", to(f"{_ours}adam.betas"))
    _rule(_part + "clip_grad", to(f"{_ours}max_norm"))
    _rule(_part + "optimizer", refuse("rlhfkit's optimizers are AdamW and Muon (--actor.optim)",
                                      harmless=("AdamW", "adamw")))
    _rule(_part + "optimizer_impl", refuse("rlhfkit uses torch.optim's AdamW", harmless=("torch.optim",)))
    _rule(_part + "total_training_steps", notice("ignored: verl fills it in; rlhfkit's schedule counts the run's "
                                                 "steps", 1))
    _rule(_part + "num_cycles", refuse("rlhfkit's cosine is a half cycle", harmless=("0.5",)))
    _rule(_part + "override_optimizer_config", refuse("rlhfkit's optimizer has no extra settings", harmless=OFF))
_rule(A + "optim.lr_warmup_steps_ratio", to("actor.lr_warmup_ratio"))
_rule(A + "optim.lr_warmup_steps", conv(warmup_steps("actor.lr_warmup_steps"),
                                        "`--actor.lr_warmup_steps` (-1 or null: the ratio), counted in optimizer steps "
                                        "(verl counts trainer steps)"))
_rule(A + "optim.min_lr_ratio", to("actor.min_lr_ratio", note="with a cosine schedule"))
_rule(A + "optim.lr_scheduler_type " + A + "optim.warmup_style " + A + "optim.lr_decay_style",
      conv(scheduler("actor.lr_scheduler"), "`--actor.lr_scheduler`: constant; cosine -> cosine_with_min_lr "
                                             "(with min_lr_ratio)"))
_rule("critic.optim.lr_warmup_steps critic.optim.lr_warmup_steps_ratio critic.optim.min_lr_ratio "
      "critic.optim.lr_scheduler_type critic.optim.warmup_style critic.optim.lr_decay_style",
      notice("ignored: rlhfkit's critic follows the actor's schedule (actor_rollout_ref.actor.optim.*)", 1))
_rule(A + "grad_clip", to("actor.max_norm"))
_rule("critic.grad_clip", to("critic.max_norm"))
_rule(" ".join(f"{p}optim.{k}" for p in (A, "critic.") for k in ("min_lr", "lr_warmup_init", "lr_decay_steps",
                                                                  "lr_wsd_decay_style", "lr_wsd_decay_steps",
                                                                  "weight_decay_incr_style",
                                                                  "use_checkpoint_opt_param_scheduler")),
      refuse("Megatron's schedule settings are not read: use lr_scheduler_type, lr_warmup_steps_ratio, min_lr_ratio",
             harmless=("0.0", "0", "none", "constant", "exponential", "false")))
# rollout
_rule(RO + "name", conv(engine, "`--rollout.engine vllm` (sglang and trtllm too, with a warning) or hf"))
_rule(RO + "n", to("rollout.n_samples_per_prompt"))
_rule(RO + "temperature " + RO + "do_sample",
      conv(sampling, "`--rollout.temperature` (do_sample=False: 0, greedy)"))
_rule(RO + "top_p", to("rollout.top_p"))
_rule(RO + "top_k", to("rollout.top_k"))
_rule(RO + "response_length", to("rollout.max_new_tokens", note="verl fills it from data.max_response_length"))
_rule(RO + "prompt_length", to("data.prompt_max_len", note="verl fills it from data.max_prompt_length"))
_rule(RO + "tensor_model_parallel_size", to("vllm.tensor_parallel_size", note="with --rollout.engine vllm"))
_rule(RO + "gpu_memory_utilization", to("vllm.gpu_memory_utilization", note="with --rollout.engine vllm"))
_rule(RO + "max_num_seqs", to("rollout.max_batch_size", note="sequences decoded at once"))
_rule(RO + "free_cache_engine", to("vllm.enable_sleep", note="frees vLLM's memory while the trainer trains"))
_rule(RO + "enable_rollout_routing_replay", to("actor.routing_replay"))
_rule(RO + "ignore_eos", refuse("rlhfkit stops a response at the end-of-sequence token", harmless=OFF))
_rule(RO + "over_sample_rate", refuse("rlhfkit waits for every sample of a step", harmless=("0", "0.0")))
_rule(RO + "calculate_log_probs", notice("ignored: rlhfkit's engines always return the sampled tokens' logprobs", 1))
_rule(RO + "log_prob_micro_batch_size " + RO + "log_prob_micro_batch_size_per_gpu " + RO + "log_prob_use_dynamic_bsz "
      + RO + "log_prob_max_token_len_per_gpu", notice(MICRO, 1))
_rule(RO + "mode", notice("ignored: rlhfkit's rollout is synchronous unless --train.async_enable", 1))
_rule(RO + "quantization " + RO + "quantization_config_file",
      refuse("rlhfkit's rollout engine runs the policy's own weights, not quantized", harmless=OFF))
_rule(RO + "skip_rollout", refuse("rlhfkit always generates", harmless=OFF))
_rule(RO + "val_kwargs.temperature " + RO + "val_kwargs.do_sample",
      conv(eval_sampling, "`--eval.temperature` (do_sample=False, verl's default: 0, greedy)"))
_rule(RO + "val_kwargs.n", to("eval.n_samples"))
_rule(RO + "val_kwargs.top_p", to("eval.top_p", note="read with do_sample=True"))
_rule(RO + "val_kwargs.top_k", to("eval.top_k", note="read with do_sample=True"))
_rule(RO + "multi_turn.enable", refuse("verl's tool agent loop is not read: rlhfkit's multi-turn tools are "
                                       "--agent.tools with --agent.tool_parser (docs/agents.md)", harmless=OFF))
_rule(RO + "agent.default_agent_loop", refuse("rlhfkit's agents are --agent.func_path (docs/agents.md)",
                                              harmless=("single_turn_agent",)))
# the reference model
_rule("actor_rollout_ref.ref.fsdp_config.param_offload", to("ref.offload", note="the reference model waits on the CPU"))
_rule("actor_rollout_ref.ref.log_prob_micro_batch_size actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu "
      "actor_rollout_ref.ref.log_prob_use_dynamic_bsz actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
      notice(MICRO, 1))
# the critic
_rule("critic.model.path", to("critic.model_name_or_path", note="defaults to the actor, as in verl"))
_rule("critic.cliprange_value", to("critic.value_clip"))
_rule("critic.ppo_mini_batch_size", conv(same_as_actor(A + "ppo_mini_batch_size", "256"),
                                         "accepted when equal to the actor's (rlhfkit updates both on one batch)"))
_rule("critic.ppo_epochs", conv(same_as_actor(A + "ppo_epochs", "1"), "accepted when equal to the actor's"))
_rule("critic.ppo_micro_batch_size critic.ppo_micro_batch_size_per_gpu critic.forward_micro_batch_size "
      "critic.forward_micro_batch_size_per_gpu critic.use_dynamic_bsz critic.ppo_max_token_len_per_gpu "
      "critic.forward_max_token_len_per_gpu", notice(MICRO, 1))
_rule("critic.enable", notice("ignored: rlhfkit trains a critic exactly when the estimator is gae", 1))
_rule("critic.loss_agg_mode", notice("ignored: rlhfkit's value loss is a token mean", 1))
_rule("critic.model.lora_rank", refuse("rlhfkit's LoRA is the policy's (--ds.lora.*)", harmless=("0",)))
_rule("critic.model.trust_remote_code critic.model.external_lib",
      refuse("rlhfkit loads models without remote code or extra libraries", harmless=OFF))
# rewards
_rule("custom_reward_function.path custom_reward_function.name",
      conv(reward_function, "`--reward.remote_url PATH` (a file's compute_score, called as verl calls it), "
                            "`PATH:NAME` with a name"))
_rule(R + "enable " + R + "model.path", conv(reward_model, "`--reward.model_name_or_path` (with enable=True)"))
_rule(R + "reward_manager reward_manager.name",
      refuse("rlhfkit calls the reward function once per sample (naive), or with the batch when it takes verl's "
             "batch names; the dapo manager's overlong penalty is reward_kwargs.overlong_buffer_cfg",
             harmless=("naive", "prime", "batch", "dapo")))
_rule(R + "reward_kwargs.overlong_buffer_cfg.enable " + R + "reward_kwargs.overlong_buffer_cfg.len " + R
      + "reward_kwargs.overlong_buffer_cfg.penalty_factor",
      conv(overlong, "`--reward.overlong_buffer_len`, `--reward.overlong_penalty_factor` (with enable=True)"))
_rule(R + "reward_kwargs.overlong_buffer_cfg.log " + R + "reward_kwargs.max_resp_len",
      notice("ignored: rlhfkit logs the penalty and reads the response budget from --rollout.max_new_tokens", 1))
_rule(R + "sandbox_fusion.url", conv(lambda vals, given: {} if vals[0] == "none" else {
    "reward.code.sandbox": "remote", "reward.code.remote_url": vals[0]},
    "`--reward.code.sandbox remote --reward.code.remote_url URL` (SandboxFusion, for builtin:code)"))
_rule(R + "sandbox_fusion.memory_limit_mb", to("reward.code.memory_mb"))
_rule(R + "sandbox_fusion.max_concurrent", to("reward.code.workers"))
_rule("reward_manager.module.path " + R + "reward_loop_module_path",
      refuse("rlhfkit has no reward-manager plug-ins: put the logic in the reward function", harmless=OFF))
# the algorithm
_rule("algorithm.adv_estimator", conv(estimator, "`--algo.advantage.estimator`: grpo -> group_norm (dr_grpo with "
                                                  "norm_adv_by_std_in_grpo=False), rloo, reinforce_plus_plus -> "
                                                  "reinforce, reinforce_plus_plus_baseline -> reinforce_baseline, gae"))
_rule("algorithm.norm_adv_by_std_in_grpo",
      conv(norm_adv,
           "False with grpo: `--algo.advantage.estimator dr_grpo` (not divided by the group's std)"))
_rule("algorithm.gamma", to("algo.advantage.gamma"))
_rule("algorithm.lam", to("algo.advantage.lambd"))
_rule("algorithm.use_kl_in_reward algorithm.kl_penalty algorithm.kl_ctrl.kl_coef algorithm.kl_ctrl.type "
      "algorithm.kl_ctrl.target_kl algorithm.kl_ctrl.horizon",
      conv(kl_settings, "the KL penalty in the reward: `--algo.kl.init_coef COEF --algo.kl.estimator E` (kl -> k1, "
                        "mse -> k2, low_var_kl -> k3); adaptive: `--algo.kl.target`, `--algo.kl.horizon`"))
_rule("algorithm.rollout_correction.rollout_is algorithm.rollout_correction.rollout_is_threshold",
      conv(rollout_is, "token: `--algo.advantage.is_correction_enable true` (tis, threshold 0 HIGH)"))
_rule("algorithm.rollout_correction.rollout_rs algorithm.rollout_correction.rollout_rs_threshold",
      refuse("rejection sampling on the rollout ratio is not built: use --algo.advantage.is_correction_type icepop",
             harmless=OFF))
_rule("algorithm.rollout_correction.bypass_mode algorithm.rollout_correction.rollout_is_batch_normalize "
      "algorithm.use_pf_ppo", refuse("not built in rlhfkit", harmless=OFF))
_rule("algorithm.rollout_correction.loss_type", refuse("rlhfkit's loss is --actor.policy_loss_type",
                                                       harmless=("ppo_clip",)))
_rule("algorithm.pf_ppo.reweight_method algorithm.pf_ppo.weight_pow",
      notice("ignored: read only with algorithm.use_pf_ppo (refused)", 1))
# the trainer
_rule("trainer.total_epochs", to("train.num_episodes", note="passes over the prompt data"))
_rule("trainer.total_training_steps", to("train.max_steps"))
_rule("trainer.project_name trainer.experiment_name trainer.logger",
      conv(loggers("verl_examples", "gsm8k"), LOGGERS))
_rule("trainer.save_freq", to("ckpt.save_steps", note="-1: only the final model"))
_rule("trainer.test_freq", to("eval.steps", note="-1: before and after training"))
_rule("trainer.default_local_dir", to("ckpt.output_dir"))
_rule("trainer.max_actor_ckpt_to_keep trainer.max_ckpt_to_keep",
      conv(lambda vals, given: {} if vals[0] == "none" else {"ckpt.max_num": vals[0]}, "`--ckpt.max_num`"))
_rule("trainer.resume_mode", conv(resume, "auto: `--ckpt.load_enable true`; disable: false"))
_rule("trainer.resume_from_path", refuse("rlhfkit resumes from <--ckpt.output_dir>/checkpoints (resume_mode=auto)",
                                         harmless=OFF))
_rule("trainer.critic_warmup", to("actor.freezing_steps", note="steps that train only the critic"))
_rule("trainer.n_gpus_per_node trainer.nnodes", notice(GPUS, 1))
_rule("trainer.device", conv(lambda vals, given: {"actor.device": pick({"cuda": "cuda", "cpu": "cpu"}, vals[0],
                                                                        "device")}, "`--actor.device`"))
_rule("trainer.val_before_train", notice("accepted: rlhfkit evaluates before training whenever --eval.dataset is set",
                                         1))
_rule("trainer.val_only", refuse("evaluate with `rlhfkit eval`", harmless=OFF))
_rule("trainer.log_val_generations trainer.rollout_data_dir trainer.validation_data_dir",
      notice("ignored: rlhfkit logs --logger.log_samples completions a step in its run folder", 1))
_rule("trainer.default_hdfs_dir", refuse("rlhfkit writes checkpoints to the local --ckpt.output_dir", harmless=OFF))
_rule("trainer.max_critic_ckpt_to_keep trainer.del_local_ckpt_after_load", notice(CKPT, 1))
_rule("trainer.balance_batch", notice("ignored: rlhfkit balances micro-batches by tokens with "
                                      "--train.dynamic_batch_enable", 1))
_rule("trainer.esi_redundant_time trainer.ray_wait_register_center_timeout trainer.use_legacy_worker_impl "
      "actor_rollout_ref.hybrid_engine actor_rollout_ref.nccl_timeout critic.nccl_timeout reward_model.nccl_timeout",
      notice("ignored: verl's worker plumbing", 1))

# Families of keys, first match wins (after the exact keys); `+key` additions under a dictionary land here too.
VERL_RL_PATTERNS: dict[str, Alias] = {
    "*._target_": notice(TARGET, 1),
    "*profiler.*": notice(PROFILER, 1),
    "*.fsdp_config.*param_offload": notice(OFFLOAD, 1),
    "*.fsdp_config.*optimizer_offload": notice(OFFLOAD, 1),
    "*.fsdp_config.*": notice(FSDP, 1),
    "*.megatron.*": notice(FSDP, 1),
    "*.strategy": notice(FSDP, 1),
    "*ulysses_sequence_parallel_size": notice("ignored: sequence parallelism; each sequence runs on one device", 1),
    "*.checkpoint.*": notice(CKPT, 1),
    "*.load_weight": notice(CKPT, 1),
    "*.use_torch_compile": notice("ignored: --train.compile_enable true compiles the policy's layers", 1),
    "*entropy_from_logits_with_chunking": notice(KERNEL, 1),
    "*entropy_checkpointing": notice(KERNEL, 1),
    "*sum_pi_squared*": notice("ignored: read by verl's optimal token baselines (not built)", 1),
    "*.use_remove_padding": notice(PADDING, 1),
    "*.use_fused_kernels": notice(KERNEL, 1),
    "*.use_prefix_grouper": notice("ignored: rlhfkit computes each prompt once per group "
                                   "(--train.shared_prefix_enable)", 1),
    "*.router_replay.*": notice("ignored: the routing replay files of verl (--actor.routing_replay replays in "
                                "memory)", 1),
    "*tiled_mlp.*": notice(KERNEL, 1),
    "*fused_kernel_options.*": notice(KERNEL, 1),
    "*.optim.override_optimizer_config.*": notice("ignored: Megatron's optimizer offload and precision settings; "
                                                  "rlhfkit keeps float32 optimizer state on the training device", 1),
    M + "override_config*": conv(model_overrides, "`--actor.config_overrides` (one JSON object of the keys; the "
                                                  "policy, reference and vLLM engine load with them)"),
    "critic.model.override_config*": refuse("rlhfkit loads the model's own config", harmless=("{}",)),
    R + "model.override_config*": refuse("rlhfkit loads the model's own config", harmless=("{}",)),
    M + "mtp*": notice("ignored: read only with mtp.enable (refused)", 1),
    M + "lora.*": refuse(MEGATRON_LORA, harmless=OFF + ("0",)),
    "critic.model.lora.*": refuse(MEGATRON_LORA, harmless=OFF + ("0",)),
    "critic.model.*": notice("ignored: the critic loads like the actor (memory and kernel settings of verl's "
                             "critic worker)", 1),
    RO + "multi_turn.*": notice("ignored: read only with multi_turn.enable (refused)", 1),
    RO + "agent.*": notice("ignored: verl's agent loop workers; rlhfkit's agents are --agent.func_path", 1),
    RO + "*": notice(ENGINE, 1),
    R + "rollout.*": notice(ENGINE, 1),
    R + "*": notice("ignored: a setting of verl's reward-model or reward-loop workers; rlhfkit scores in its "
                    "trainer (--reward.*)", 1),
    "reward_manager.*": notice("ignored: verl's reward-manager plumbing", 1),
    "data.apply_chat_template_kwargs*": refuse("rlhfkit renders the chat template without extra arguments",
                                               harmless=("{}",)),
    "transfer_queue.*": notice("ignored: verl's data transfer queue", 1),
    "ray_kwargs.*": notice("ignored: rlhfkit starts Ray itself with --distributed.backend ray", 1),
}

# verl's defaults where rlhfkit's differ and the math depends on them: applied (as overrides) before the user's.
VERL_DEFAULTS = (
    "algorithm.adv_estimator=gae", "algorithm.lam=1.0", "data.train_batch_size=1024",
    A + "ppo_mini_batch_size=256", RO + "n=1", "data.max_prompt_length=512", "data.max_response_length=512",
    "data.prompt_key=prompt", A + "optim.lr_scheduler_type=constant", A + "optim.min_lr_ratio=0.0",
    A + "optim.weight_decay=0.01", A + "optim.betas=[0.9,0.999]", "critic.optim.lr=1e-5",
    "critic.optim.weight_decay=0.01", "critic.optim.betas=[0.9,0.999]", A + "clip_ratio_low=0.2",
    A + "clip_ratio_high=0.2", A + "clip_ratio_c=3.0",
    "trainer.total_epochs=30", "trainer.resume_mode=auto",
)
# What verl's data layout needs in rlhfkit (no verl key sets these): chat prompts, the nested answer as label.
VERL_DATA = {"data.apply_chat_template": "true", "data.label_key": "reward_model.ground_truth"}
# verl's default reward (verl.utils.reward_score, chosen by data_source) where no reward is configured.
DEFAULT_REWARD = "builtin:math"


def find_rule(key: str, rules: Mapping[str, Alias], patterns: Mapping[str, Alias], known: Iterable[str]) -> Alias:
    """The rule of an override `key` (without Hydra's + prefixes): its own in `rules`, else the first of `patterns`
    that matches; an unknown key is a ConfigError naming the closest of `known`."""
    if key in rules:
        return rules[key]
    for pattern, rule in patterns.items():
        if fnmatch.fnmatchcase(key, pattern):
            return rule
    close = difflib.get_close_matches(key, sorted({*known, *rules}), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(f"unknown verl override {key}{hint}")


def verl_rule(key: str) -> Alias:
    """The rule of verl's PPO override `key`."""
    return find_rule(key, VERL_RL_RULES, VERL_RL_PATTERNS, VERL_PPO_KEYS + VERL_MEGATRON_KEYS)


def override_items(tokens: list[str], rule_of: Callable[[str], Alias] = verl_rule) -> list[Item]:
    """verl's overrides `KEY=VALUE` (Hydra's `+KEY=VALUE`, `++KEY=VALUE` too) as parse.read_flags' items."""
    items = []
    for tok in tokens:
        if tok.startswith("~"):
            raise ConfigError(f"{tok}: Hydra's key deletion is not read; drop the key")
        key, eq, raw = tok.partition("=")
        if not eq or not key:
            raise ConfigError(f"unexpected argument {tok!r}: flags look like --section.name VALUE, verl's overrides "
                              "like key.name=VALUE")
        key = key.lstrip("+")
        items.append((key, rule_of(key), [hydra_value(raw)]))
    return items


def layered(base: list[Item], given: list[Item], table: dict[str, Any], flags: Mapping[str, Any],
            data: Mapping[str, str]) -> dict[str, Any]:
    """{our dotted name: raw value}: `data` < verl's defaults `base` < the user's overrides `given`; a warning
    names each field that rlhfkit's own `flags` (which win, in parse_config) set to another value."""
    defaults = apply_flags(base, table, dashes="")
    values = {**data, **apply_flags(base + given, table, dashes="")}
    by_user = {k: v for k, v in values.items() if k not in data and defaults.get(k, values) != v}
    for name in sorted(set(by_user) & set(flags)):
        if str(by_user[name]) != str(flags[name]):
            log.warning("--%s %s wins over the verl overrides' %s", name, flags[name], by_user[name])
    return values


def verl_values(tokens: list[str], table: dict[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """`train rl`'s values of verl's overrides `tokens` over verl's defaults (VERL_DEFAULTS, VERL_DATA, the default
    reward); `flags`: what rlhfkit's own flags set."""
    given = override_items(tokens)
    if "rollout.n_samples_per_prompt" in flags:  # verl's mini-batch arithmetic with the n that runs
        given.append((RO + "n", verl_rule(RO + "n"), [str(flags["rollout.n_samples_per_prompt"])]))
    values = layered(override_items(list(VERL_DEFAULTS)), given, table, flags, VERL_DATA)
    if not any(k in values or k in flags for k in ("reward.remote_url", "reward.model_name_or_path")) and \
            "agent.func_path" not in flags:
        log.warning("verl's default reward (verl.utils.reward_score by data_source): rlhfkit scores with %s "
                    "(GSM8K and MATH answers); set custom_reward_function.path for other data", DEFAULT_REWARD)
        values["reward.remote_url"] = DEFAULT_REWARD
    return values


# Hydra's own flags on a verl command line.
HYDRA_FLAGS = {
    "config-path": notice("ignored: rlhfkit reads verl's overrides over verl's default PPO config", 1),
    "config-name": notice("ignored: rlhfkit reads verl's overrides over verl's default PPO config (Megatron's "
                          "keys are noticed)", 1),
}
