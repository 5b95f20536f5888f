"""OpenRLHF's command-line flags and what rlhfkit does with each: one table, as data.

Every flag of OpenRLHF's `train_ppo_ray`, `train_sft`, `train_rm`, `train_dpo` (and `train_kto`
and `train_prm`, which releases up to 0.9.x had) in the releases 0.8.0 to 0.11.0 is here, both the flat names
(`--zero_stage`, up to 0.10.1) and the dotted ones (`--ds.zero_stage`, from 0.10.2). Each is an
`Alias` (config/parse.py) of one of three kinds:

- mapped: same meaning, set through our flag (`--normalize_reward` is not: see its note);
- noticed: cluster layout, engine tuning, or a feature that is not built yet: accepted, its values
  consumed, a one-line warning says what rlhfkit does instead;
- refused: changes the math in a way rlhfkit cannot honour: a one-line error naming what to use
  (values that change nothing, such as `--actor.optim adam`, are accepted).

`RL_FLAGS` and `SUPERVISED_FLAGS[command]` are the alias tables of `rlhfkit train rl` and
`rlhfkit train sft|rm|dpo|kto|prm`; docs/migration.md is rendered from them (config/openrlhf_doc.py).
Each flag's number of values follows OpenRLHF's declaration (a switch, one value, two, or a list).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from rlhfkit.config.defaults import PROMPT_MAX_LEN
from rlhfkit.config.openrlhf_names import OPENRLHF_COMMANDS
from rlhfkit.config.parse import Alias, convert
from rlhfkit.errors import ConfigError


# ------------------------------------------------------------------ how a row is written
def to(target: str, nargs=1, note: str = "") -> Alias:
    """Mapped onto our flag `target` (often OpenRLHF's dotted name itself)."""
    return Alias("mapped", nargs, to=target, note=note)


def conv(convert, note: str, nargs=1, weak: bool = False) -> Alias:
    """Mapped through `convert(values, given)`; `note` says to what."""
    return Alias("mapped", nargs, convert=convert, note=note, weak=weak)


def notice(note: str, nargs=0, convert=None, weak: bool = False) -> Alias:
    return Alias("noticed", nargs, convert=convert, note=note, weak=weak)


def refuse(note: str, nargs=1, harmless: tuple[str, ...] = ()) -> Alias:
    return Alias("refused", nargs, note=note, harmless=harmless)


def both(*targets: str):
    """One value set on several of our flags (OpenRLHF's one flag for actor and critic)."""
    return lambda vals, given: {t: " ".join(vals) for t in targets}


def _given(given: Mapping[str, list], *names: str) -> list | None:
    """The values of the first of `names` on the command line (a switch: []), else None."""
    return next((given[n] for n in names if n in given), None)


# ------------------------------------------------------------------ notes shared by many flags
GPUS = ("ignored: rlhfkit runs one process per device; shard the policy over GPUs with --fsdp.enable true "
        "(under torchrun, or on Ray with --fsdp.num_ranks N trainer actors), and add Ray rollout workers "
        "(--rollout.num_workers); see docs/scaling.md")
ACTOR_GPUS = ("with --distributed.backend ray and --fsdp.enable true: --fsdp.num_ranks, nodes x GPUs per node "
              "trainer actors sharding the policy; otherwise " + GPUS)
COLOCATE = ("ignored: by default every model shares one process and device (the hf engine generates with "
            "the policy's own weights); see docs/scaling.md")
VLLM_ENGINES = ("with --distributed.backend ray: the rollout worker actors, --rollout.num_workers (each a vLLM "
                "engine with --rollout.engine vllm, on --vllm.tensor_parallel_size GPUs); otherwise ignored: one "
                "engine in the trainer's process")
VLLM_SYNC = "ignored: rlhfkit's vllm engine receives weights through vLLM's collective_rpc"
ZERO = ("ignored: DeepSpeed is not used; to shard the policy over GPUs (ZeRO-3's role) run under torchrun with "
        "--fsdp.enable true, or on Ray with --fsdp.num_ranks N too (docs/scaling.md), otherwise one process holds "
        "the whole model")
SUP_ZERO = "ignored: DeepSpeed is not used; train sft|rm|dpo|kto hold the whole model in one process"
DEEPSPEED = "ignored: DeepSpeed tuning; rlhfkit trains with plain PyTorch (same math)"
REENTRANT = "ignored: rlhfkit's gradient checkpointing is the non-reentrant kind (same gradients)"
OFFLOAD = "not supported yet: models and optimizer state stay on the training device (same result)"
SLEEP = ("not supported yet: the trainer's weights stay on the GPU while vLLM generates "
         "(--vllm.enable_sleep true frees vLLM's memory during training)")
ATTN = "ignored: rlhfkit uses the attention kernel transformers picks (SDPA); same math"
LIGER = "ignored: Liger kernels are not used (same math, more memory)"
RING = "not supported: context parallelism; each sequence runs on one device"
TP = "not supported: tensor parallelism in training; one process holds each model (train rl can shard with FSDP2)"
LOCAL_RANK = "ignored: set by DeepSpeed's launcher; under torchrun rlhfkit reads the rank from the environment"
MODELSCOPE = "ignored: rlhfkit loads from the Hugging Face hub or local folders, not ModelScope"
DETERMINISM = "ignored: rlhfkit's runs are seeded by --train.seed (bit for bit on CPU)"
FAST_TOKENIZER = "ignored: rlhfkit loads the tokenizer transformers picks (the fast one when there is one)"
WORKERS = "ignored: rlhfkit reads the data in the training process"
LOGGING_STEPS = "ignored: rlhfkit logs every step (metrics.jsonl, TensorBoard)"
DS_CKPT = "ignored: rlhfkit writes no DeepSpeed checkpoints; its checkpoints are HF folders plus trainer state"
DS_CKPT_PATH = "ignored: rlhfkit keeps checkpoints in <--ckpt.output_dir>/checkpoints"
CKPT_MEM = "ignored: rlhfkit keeps the newest --ckpt.max_num checkpoints (no size limit)"
VALUE_HEAD = ("ignored: rlhfkit names the heads itself (a reward model's is transformers' "
              "sequence-classification `score`)")
MOE = "ignored: transformers picks the MoE experts' kernel"


def weights_dtype(model_field: str, doing: str):
    """The conversion of OpenRLHF's --bf16 / --param_dtype into `model_field` for a command that only runs the
    model (no loss to scale): bf16 -> bfloat16, fp16 -> float16 (another dtype is refused)."""
    def convert(vals, given):
        value = vals[0] if vals else "bf16"
        if value in ("bf16", "bfloat16", "fp16", "float16"):
            return {model_field: "float16" if value in ("fp16", "float16") else "bfloat16"}
        raise ConfigError(f"rlhfkit {doing} in float32, bfloat16 or float16, not {value}: pass bf16 or fp16 (or "
                          "drop it for float32)")
    return convert


def param_dtype(section: str):
    """The conversion of OpenRLHF's --param_dtype / --bf16 for `train`: bf16 -> --SECTION.dtype bfloat16; fp16 ->
    --SECTION.dtype float16 and --SECTION.autocast float16 (unless that flag is given: losses, softmaxes and norms
    in float32, the matmuls in fp16), with the loss scaling of DeepSpeed's fp16 mode (--train.loss_scale.*)."""
    dtype = weights_dtype(f"{section}.dtype", "trains")

    def convert(vals, given):
        out = dtype(vals, given)
        if out[f"{section}.dtype"] == "float16" and f"{section}.autocast" not in given:
            out[f"{section}.autocast"] = "float16"
        return out
    return convert


def fp16_note(section: str) -> str:
    """The docs' note of --param_dtype fp16 for the model flags of `section`."""
    return (f"fp16: `--{section}.dtype float16 --{section}.autocast float16` (float16 parameters, float32 master "
            "weights, DeepSpeed's dynamic loss scaling: --train.loss_scale.*)")


def _margin(vals, given):
    """OpenRLHF's --margin_loss switch; its logexpsigmoid loss ignores the margin."""
    loss = _given(given, "loss", "model.loss_type")
    on = (vals[0] if vals else "true") if not (loss and loss[0] == "logexpsigmoid") else "false"
    return {"model.margin_loss_enable": on}


def _lora_targets(vals, given):
    return {"ds.lora.target_modules": ",".join(vals) or "all-linear"}


# ------------------------------------------------------------------ train_ppo_ray -> rlhfkit train rl
def _ema(vals, given):
    beta = _given(given, "ema_beta", "train.ema_beta")
    return {"actor.ema_beta": beta[0] if beta else "0.992"}


def _ema_beta(vals, given):
    return {"actor.ema_beta": vals[0]} if _given(given, "enable_ema", "train.enable_ema") is not None else {}


def _wandb_on(default_project: str):
    return lambda vals, given: {"logger.wandb.project": (_given(given, "wandb_project") or [default_project])[0]}


def _wandb(field: str):
    return lambda vals, given: {field: vals[0]} if _given(given, "use_wandb", "logger.wandb.key") else {}


def _wandb_switch(default_project: str) -> Alias:
    """--use_wandb KEY; `default_project`: the command's --wandb_project default."""
    return notice(f"turns wandb logging on (project {default_project} unless --wandb_project); the key is not "
                  "used: log in with `wandb login` or WANDB_API_KEY", 1, _wandb_on(default_project), weak=True)


def add_wandb_rules(add, default_project: str) -> None:
    """OpenRLHF's wandb flags, the same for every command; `default_project`: its --wandb_project default."""
    add("use_wandb logger.wandb.key", _wandb_switch(default_project))
    add("wandb_project", conv(_wandb("logger.wandb.project"), "`--logger.wandb.project`, with --use_wandb"))
    add("logger.wandb.project", to("logger.wandb.project", note="rlhfkit logs to wandb whenever a project is set"))
    add("wandb_run_name", conv(_wandb("logger.wandb.name"), "`--logger.wandb.name`, with --use_wandb"))
    add("logger.wandb.run_name", to("logger.wandb.name"))
    add("wandb_group", conv(_wandb("logger.wandb.group"), "`--logger.wandb.group`, with --use_wandb"))
    add("logger.wandb.group", to("logger.wandb.group"))
    add("wandb_org logger.wandb.org", notice("ignored: set the wandb entity with WANDB_ENTITY", 1))


def add_muon_rules(add, prefix: str, optim_field: str) -> None:
    """OpenRLHF's optimizer choice and Muon flags: `--{prefix}optim` onto our `optim_field`, `--{prefix}muon.*`
    onto ours of the same names (prefix "actor." / "critic." for train rl, "" for the supervised commands)."""
    add(f"{prefix}optim", to(optim_field, note="adam or muon: Muon for the 2-D hidden matrices, AdamW for embeddings, "
                                               "LM head, norms and biases, as OpenRLHF splits them"))
    for key in ("lr", "momentum", "ns_steps"):
        add(f"{prefix}muon.{key}", to(f"{prefix}muon.{key}"))
    add(f"{prefix}muon.nesterov", to(f"{prefix}muon.nesterov", 0))
    add(f"{prefix}muon.no_nesterov", conv(lambda vals, given: {f"{prefix}muon.nesterov": "false"},
                                          f"`--{prefix}muon.nesterov false`", 0))


def add_ckpt_rules(add) -> None:
    """OpenRLHF's checkpoint flags, the same for `train rl` and `train sft|rm|dpo|kto`."""
    add("save_steps ckpt.save_steps", to("ckpt.save_steps"))
    add("max_ckpt_num ckpt.max_num", to("ckpt.max_num"))
    add("load_checkpoint ckpt.load_enable", to("ckpt.load_enable", 0, "resumes from <--ckpt.output_dir>/checkpoints"))
    add("ckpt_path ckpt.path", notice(DS_CKPT_PATH, 1))
    add("max_ckpt_mem ckpt.max_mem", notice(CKPT_MEM, 1))


def _max_len(vals, given):
    """OpenRLHF's total cap (prompt + response) as rlhfkit's two bounds, where they are not given."""
    total = int(float(vals[0]))
    new = _given(given, "rollout.max_new_tokens", "max_new_tokens", "generate_max_len")
    if new is not None:
        return {"data.prompt_max_len": str(max(1, total - int(new[0])))}
    prompt = _given(given, "data.prompt_max_len", "prompt_max_len")
    return {"rollout.max_new_tokens": str(max(1, total - int(prompt[0] if prompt else PROMPT_MAX_LEN)))}


def _best_metric(vals, given):
    """OpenRLHF's --ckpt.best_metric_key (greater is better) as --ckpt.keep_best."""
    key = vals[0].strip() if vals else ""
    if key == "none":
        return {}
    k = re.fullmatch(r"eval_.*_pass(\d+)", key or "eval__pass1")
    return {"ckpt.keep_best": f"eval/pass@{k.group(1)}:max" if k else f"{key}:max"}


def _is_threshold(vals, given):
    """OpenRLHF's IS threshold: LOW HIGH, or (releases before the two-value form) HIGH alone."""
    low, high = (0.0, float(vals[0])) if len(vals) == 1 else (float(vals[0]), float(vals[1]))
    return {"algo.advantage.is_correction_threshold": f"{low} {high}"}


RL_FLAGS: dict[str, Alias] = {}


def _rl(names: str, rule: Alias) -> None:
    for name in names.split():
        RL_FLAGS[name] = rule


def _num_engines(vals, given):
    """OpenRLHF's vLLM engine actors: Ray rollout workers where the run has them."""
    backend = _given(given, "distributed.backend")
    return {"rollout.num_workers": vals[0]} if backend and backend[0] == "ray" else {}


def _actor_ranks(vals, given):
    """OpenRLHF's actor GPUs (--actor_num_nodes x --actor_num_gpus_per_node): FSDP's trainer actors on Ray."""
    backend, sharded = _given(given, "distributed.backend"), _given(given, "fsdp.enable", "distributed.fsdp")
    if not (backend and backend[0] == "ray" and sharded and convert("fsdp.enable", sharded[0], bool)):
        return {}
    nodes = _given(given, "actor_num_nodes", "actor.num_nodes") or ["1"]
    per_node = _given(given, "actor_num_gpus_per_node", "actor.num_gpus_per_node") or ["1"]
    return {"fsdp.num_ranks": str(int(nodes[0]) * int(per_node[0]))}


# layout, engines, DeepSpeed
_rl("ref_num_nodes ref_num_gpus_per_node reward_num_nodes reward_num_gpus_per_node critic_num_nodes "
    "critic_num_gpus_per_node ref.num_nodes ref.num_gpus_per_node reward.num_nodes reward.num_gpus_per_node "
    "critic.num_nodes critic.num_gpus_per_node", notice(GPUS, 1))
_rl("actor_num_nodes actor_num_gpus_per_node actor.num_nodes actor.num_gpus_per_node",
    notice(ACTOR_GPUS, 1, convert=_actor_ranks, weak=True))
_rl("colocate_actor_ref colocate_critic_reward colocate_all_models train.colocate_actor_ref "
    "train.colocate_critic_reward train.colocate_all", notice(COLOCATE))
_rl("vllm_num_engines vllm.num_engines", notice(VLLM_ENGINES, 1, convert=_num_engines, weak=True))
_rl("vllm_tensor_parallel_size vllm.tensor_parallel_size", to("vllm.tensor_parallel_size"))
_rl("vllm_sync_backend vllm.sync_backend", notice(VLLM_SYNC, 1))
_rl("vllm_sync_with_ray vllm.sync_with_ray", notice(VLLM_SYNC))
_rl("enable_prefix_caching vllm.enable_prefix_caching",
    notice("ignored: rlhfkit's vllm engine always caches prompt prefixes"))
_rl("enforce_eager vllm.enforce_eager", notice("ignored: rlhfkit's vllm engine keeps vLLM's default (CUDA graphs)"))
_rl("vllm_enable_sleep vllm.enable_sleep", to("vllm.enable_sleep", 0, "only with --rollout.engine vllm; GPU only"))
_rl("vllm_gpu_memory_utilization vllm.gpu_memory_utilization", to("vllm.gpu_memory_utilization"))
_rl("vllm_generate_batch_size rollout.vllm_generate_batch_size",
    notice("ignored: rlhfkit generates --rollout.batch_size prompts per rollout (no over-sampling)", 1))
_rl("zero_stage ds.zero_stage", notice(ZERO, 1))
_rl("zpg ds.zpg grad_accum_dtype ds.grad_accum_dtype", notice(DEEPSPEED, 1))
_rl("overlap_comm ds.overlap_comm", notice(DEEPSPEED))
_rl("deepcompile ds.deepcompile",
    notice("ignored: DeepSpeed's compiler is not used; --train.compile_enable true compiles the policy's layers"))
_rl("ds_tensor_parallel_size ds.tensor_parallel_size", notice(TP, 1))
_rl("ring_attn_size ring_head_stride ds.ring_attn_size ds.ring_attn_head_stride", notice(RING, 1))
_rl("gradient_checkpointing actor.gradient_checkpointing_enable", to("actor.gradient_checkpointing_enable", 0))
_rl("gradient_checkpointing_use_reentrant actor.gradient_checkpointing_reentrant", notice(REENTRANT))
_rl("adam_offload ds.adam_offload", notice(OFFLOAD))
_rl("ref_reward_offload", conv(lambda vals, given: {"ref.offload": "true", "reward.offload": "true"},
                               "`--ref.offload true --reward.offload true`", 0))
_rl("ref.offload", to("ref.offload", 0))
_rl("reward.offload", to("reward.offload", 0))
_rl("deepspeed_enable_sleep ds.enable_sleep", notice(SLEEP))
_rl("actor_init_on_gpu", notice("ignored: rlhfkit loads models on the training device"))
_rl("flash_attn", notice(ATTN))
_rl("attn_implementation ds.attn_implementation", notice(ATTN, 1))
_rl("ds.experts_implementation", notice(MOE, 1))
_rl("use_liger_kernel ds.use_liger_kernel", notice(LIGER))
_rl("packing_samples ds.packing_samples",
    notice("ignored: rlhfkit's RL micro-batches are padded and compute each prompt once for its group "
           "(--train.shared_prefix_enable); same result"))
_rl("local_rank", notice(LOCAL_RANK, 1))
_rl("use_ms", notice(MODELSCOPE))
_rl("perf", notice("ignored: rlhfkit logs each stage's time every step (time/* in metrics.jsonl)"))
_rl("full_determinism train.full_determinism_enable", notice(DETERMINISM))
_rl("disable_fast_tokenizer data.disable_fast_tokenizer", notice(FAST_TOKENIZER))
_rl("dataloader_num_workers data.dataloader_num_workers", notice(WORKERS, 1))
_rl("load_in_4bit ds.load_in_4bit", to("ds.load_in_4bit", 0, "QLoRA: with --ds.lora.rank > 0"))
for _key in ("rank", "alpha", "dropout"):
    _rl(f"lora_{_key} ds.lora.{_key}", to(f"ds.lora.{_key}"))
_rl("target_modules ds.lora.target_modules", Alias("mapped", "*", to="ds.lora.target_modules", convert=_lora_targets,
                                                   note="the names comma-separated"))
_rl("ds.value_head_prefix value_head_prefix", notice(VALUE_HEAD, 1))
_rl("param_dtype ds.param_dtype", conv(param_dtype("actor"), "bf16: `--actor.dtype bfloat16` (bf16 parameters, "
                                     "float32 master weights as DeepSpeed keeps them); " + fp16_note("actor")))
_rl("bf16", conv(param_dtype("actor"), "`--actor.dtype bfloat16` (bf16 parameters, float32 master weights as "
                                            "DeepSpeed keeps them)", 0))
# checkpoints and logging
_rl("save_path ckpt.output_dir", to("ckpt.output_dir"))
add_ckpt_rules(_rl)
_rl("save_hf_ckpt ckpt.save_hf disable_ds_ckpt ckpt.disable_ds use_ds_universal_ckpt ds.use_universal_ckpt",
    notice(DS_CKPT))
_rl("best_metric_key ckpt.best_metric_key", conv(_best_metric, "`--ckpt.keep_best METRIC:max`; OpenRLHF's "
                                                                "eval_NAME_passK (and empty: the first pass1) is "
                                                                "eval/pass@K, none: off"))
_rl("logging_steps logger.logging_steps", notice(LOGGING_STEPS, 1))
_rl("eval_steps eval.steps", to("eval.steps", note="-1: before and after training"))
_rl("use_tensorboard logger.tensorboard_dir",
    to("logger.tensorboard_dir", note="rlhfkit always writes TensorBoard events"))
add_wandb_rules(_rl, "openrlhf_train_ppo")
# models, data, rollout
_rl("pretrain actor.model_name_or_path", to("actor.model_name_or_path"))
_rl("reward_pretrain reward.model_name_or_path", to("reward.model_name_or_path", note="one reward model: a folder from "
                                                   "`rlhfkit train rm` or an HF sequence-classification model"))
_rl("remote_rm_url reward.remote_url", to("reward.remote_url"))
_rl("critic_pretrain critic.model_name_or_path",
    to("critic.model_name_or_path", note="defaults to the actor; OpenRLHF's to the reward model, if any"))
_rl("agent_func_path train.agent_func_path", to("agent.func_path"))
_rl("prompt_data data.prompt_dataset", to("data.prompt_dataset"))
_rl("prompt_data_probs data.prompt_probs", to("data.prompt_probs", note="with comma-separated --data.prompt_dataset"))
_rl("prompt_split data.prompt_split", to("data.prompt_split"))
_rl("eval_split eval.split", to("eval.split"))
_rl("eval_dataset eval.dataset", to("eval.dataset"))
_rl("eval_temperature eval.temperature", to("eval.temperature"))
_rl("eval_n_samples_per_prompt eval.n_samples_per_prompt", to("eval.n_samples"))
for _key in ("input_key", "label_key", "input_template"):
    _rl(f"{_key} data.{_key}", to(f"data.{_key}"))
_rl("apply_chat_template data.apply_chat_template", to("data.apply_chat_template", 0))
_rl("max_samples data.max_samples", to("data.max_samples"))
_rl("prompt_max_len", to("data.prompt_max_len", note="longer prompts are skipped and counted, not truncated"))
_rl("generate_max_len max_new_tokens rollout.max_new_tokens", to("rollout.max_new_tokens"))
_rl("max_len data.max_len", notice(
    "rlhfkit has no total cap on prompt + response: with --rollout.max_new_tokens M given, prompts over "
    "max_len - M tokens are skipped; without it, M is set to max_len - --data.prompt_max_len",
    1, _max_len, weak=True))
_rl("image_key data.image_key", to("data.image_key"))
_rl("freeze_visual_encoder actor.freeze_visual_encoder", to("actor.freeze_visual_encoder", 0))
_rl("max_images_per_prompt data.max_images_per_prompt", to("data.max_images_per_prompt"))
_rl("rollout_batch_size rollout.batch_size", to("rollout.batch_size"))
for _key in ("n_samples_per_prompt", "temperature", "top_p"):
    _rl(f"{_key} rollout.{_key}", to(f"rollout.{_key}"))
_rl("micro_rollout_batch_size rollout.micro_batch_size", notice(
    "ignored: experience passes use --train.micro_batch_size and decoding takes up to --rollout.max_batch_size "
    "sequences at once; same result", 1))
_rl("rollout_max_tokens_per_gpu rollout.max_tokens_per_gpu",
    notice("ignored: experience passes use the training micro-batches (--train.max_tokens_per_micro_batch)", 1))
_rl("dynamic_filtering algo.dynamic_filtering_enable", to("algo.dynamic_filtering_enable", 0))
_rl("dynamic_filtering_reward_range algo.dynamic_filtering_range", to("algo.dynamic_filtering_range", 2))
# training
_rl("train_batch_size train.batch_size", to("train.batch_size"))
_rl("micro_train_batch_size train.micro_batch_size", to("train.micro_batch_size"))
for _key in ("max_epochs", "num_episodes", "seed"):
    _rl(f"{_key} train.{_key}", to(f"train.{_key}"))
_rl("use_dynamic_batch train.dynamic_batch_enable", to("train.dynamic_batch_enable", 0))
_rl("train_max_tokens_per_gpu train.max_tokens_per_gpu", to("train.max_tokens_per_micro_batch"))
_rl("async_train train.async_enable",
    to("train.async_enable", 0, "also needs --distributed.backend ray and --train.max_staleness 1 or more"))
_rl("async_queue_size train.async_queue_size",
    notice("ignored: rlhfkit bounds how many policy versions a sample may lag with --train.max_staleness", 1))
_rl("partial_rollout train.partial_rollout_enable",
    to("train.partial_rollout_enable", 0, "with --train.async_enable (Ray rollout workers)"))
_rl("enable_ema train.enable_ema", conv(_ema, "`--actor.ema_beta` (0.992 unless --ema_beta)", 0))
_rl("ema_beta train.ema_beta", conv(_ema_beta, "`--actor.ema_beta`, with --enable_ema"))
# optimizer and schedule (OpenRLHF's flat flags set the actor's and the critic's)
_rl("actor_learning_rate actor.adam.lr", to("actor.adam.lr"))
_rl("critic_learning_rate critic.adam.lr", to("critic.adam.lr"))
_rl("adam_betas", conv(both("actor.adam.betas", "critic.adam.betas"), "`--actor.adam.betas`, "
                                                                       "`--critic.adam.betas`", 2))
_rl("l2", conv(both("actor.adam.weight_decay", "critic.adam.weight_decay"),
               "`--actor.adam.weight_decay`, `--critic.adam.weight_decay`"))
_rl("max_norm", conv(both("actor.max_norm", "critic.max_norm"), "`--actor.max_norm`, `--critic.max_norm`"))
_rl("lr_scheduler actor.lr_scheduler",
    to("actor.lr_scheduler", note="constant, linear, cosine or cosine_with_min_lr; the critic's too"))
_rl("lr_warmup_ratio actor.lr_warmup_ratio", to("actor.lr_warmup_ratio", note="the critic's too"))
_rl("actor.min_lr_ratio", to("actor.min_lr_ratio", note="the critic's too"))
for _part in ("actor", "critic"):
    for _key in ("adam.eps", "adam.weight_decay", "max_norm"):
        _rl(f"{_part}.{_key}", to(f"{_part}.{_key}"))
    _rl(f"{_part}.adam.betas", to(f"{_part}.adam.betas", 2))
    add_muon_rules(_rl, f"{_part}.", f"{_part}.optim")
_rl("critic.lr_scheduler critic.lr_warmup_ratio critic.min_lr_ratio",
    notice("ignored: rlhfkit's critic follows the actor's schedule (--actor.lr_scheduler, --actor.lr_warmup_ratio, "
           "--actor.min_lr_ratio)", 1))
# the algorithm
_rl("advantage_estimator algo.advantage.estimator", to("algo.advantage.estimator", note="the same names"))
_rl("gamma algo.advantage.gamma", to("algo.advantage.gamma"))
_rl("lambd algo.advantage.lambd", to("algo.advantage.lambd"))
_rl("no_advantage_std_norm algo.advantage.no_std_norm",
    conv(lambda vals, given: {"algo.advantage.whiten": "mean"}, "`--algo.advantage.whiten mean`", 0))
_rl("init_kl_coef algo.kl.init_coef", to("algo.kl.init_coef", note="0 loads no reference model"))
for _key in ("estimator", "target", "horizon"):
    _rl(f"kl_{_key} algo.kl.{_key}", to(f"algo.kl.{_key}"))
_rl("use_kl_loss algo.kl.use_loss", to("algo.kl.use_loss", 0))
_rl("eps_clip actor.eps_clip", conv(lambda vals, given: {"actor.eps_clip_low_high": f"{vals[0]} {vals[0]}"},
                                    "`--actor.eps_clip_low_high X X`, unless the low/high pair is given",
                                    weak=True))
_rl("eps_clip_low_high actor.eps_clip_low_high", to("actor.eps_clip_low_high", 2))
_rl("dual_clip actor.dual_clip", to("actor.dual_clip"))
_rl("value_clip critic.value_clip", to("critic.value_clip"))
_rl("policy_loss_type actor.policy_loss_type", to("actor.policy_loss_type"))
_rl("entropy_loss_coef actor.entropy_coef", to("actor.entropy_coef"))
_rl("aux_loss_coef actor.aux_loss_coef", to("actor.aux_loss_coef", note="mixture-of-experts policies"))
_rl("ptx_coef", notice("ignored: it has no effect in OpenRLHF's releases that have it (no pretraining data)", 1))
_rl("freezing_actor_steps critic.freezing_steps",
    conv(lambda vals, given: {"actor.freezing_steps": str(max(0, int(float(vals[0]))))},
         "`--actor.freezing_steps` (the critic's warm-up; -1 = 0 = off)"))
_rl("save_value_network critic.save_value_network",
    notice("not supported yet: the final model is the policy (and its EMA); the critic is only in checkpoints"))
# rewards
_rl("normalize_reward reward.normalize_enable", notice(
    "accepted: a reward model's score is always divided by the mean/std stored with it (what this flag does in "
    "OpenRLHF) and a reward function's is left as it is, as there; --reward.normalize is a running "
    "normalisation"))
_rl("reward_clip_range reward.clip_range", to("reward.clip_range", 2))
_rl("overlong_buffer_len reward.overlong_buffer_len", to("reward.overlong_buffer_len"))
_rl("overlong_penalty_factor reward.overlong_penalty_factor", to("reward.overlong_penalty_factor"))
_rl("stop_properly_penalty_coef reward.stop_properly_penalty_coef",
    to("reward.stop_properly_penalty_coef", note="an agent's episode that ran out of tokens or turns counts as "
                                                 "truncated; OpenRLHF's multi-turn episodes never do"))
# importance-sampling correction of the sampler's mismatch
_rl("enable_vllm_is_correction algo.advantage.is_correction_enable", to("algo.advantage.is_correction_enable", 0))
_rl("vllm_is_correction_type algo.advantage.is_correction_type", to("algo.advantage.is_correction_type"))
_rl("vllm_is_truncated_threshold",
    conv(_is_threshold, "--algo.advantage.is_correction_threshold; one value (older releases) is HIGH, LOW = 0",
         (1, 2)))
_rl("algo.advantage.is_correction_threshold", to("algo.advantage.is_correction_threshold", 2))
_rl("use_icepop", conv(lambda vals, given: {"algo.advantage.is_correction_type": "icepop"},
                       "`--algo.advantage.is_correction_type icepop` (with --enable_vllm_is_correction)", 0))


# ------------------------------------------------------------------ train_sft|rm|dpo|kto
def _supervised_rules() -> dict[str, Alias]:
    """Every supervised command's OpenRLHF flags (one table: a command takes the rows of its own flags)."""
    rules: dict[str, Alias] = {}

    def add(names: str, rule: Alias) -> None:
        for name in names.split():
            rules[name] = rule

    for group in (_supervised_runtime_rules, _supervised_data_rules, _supervised_training_rules):
        group(add)
    return rules


def _supervised_runtime_rules(add: Callable[[str, Alias], None]) -> None:
    """DeepSpeed, devices and kernels; checkpoints and logging."""
    add("zero_stage ds.zero_stage", notice(SUP_ZERO, 1))
    add("zpg ds.zpg grad_accum_dtype ds.grad_accum_dtype", notice(DEEPSPEED, 1))
    add("overlap_comm ds.overlap_comm deepcompile ds.deepcompile", notice(DEEPSPEED))
    add("ds_tensor_parallel_size ds.tensor_parallel_size", notice(TP, 1))
    add("ring_attn_size ring_head_stride ds.ring_attn_size ds.ring_attn_head_stride", notice(RING, 1))
    add("gradient_checkpointing model.gradient_checkpointing_enable", to("model.gradient_checkpointing_enable", 0))
    add("gradient_checkpointing_use_reentrant model.gradient_checkpointing_reentrant", notice(REENTRANT))
    add("adam_offload ds.adam_offload ref_offload ref.offload", notice(OFFLOAD))
    add("flash_attn", notice(ATTN))
    add("attn_implementation ds.attn_implementation", notice(ATTN, 1))
    add("ds.experts_implementation", notice(MOE, 1))
    add("use_liger_kernel ds.use_liger_kernel", notice(LIGER))
    add("local_rank", notice(LOCAL_RANK, 1))
    add("use_ms", notice(MODELSCOPE))
    add("full_determinism train.full_determinism_enable", notice(DETERMINISM))
    add("disable_fast_tokenizer data.disable_fast_tokenizer", notice(FAST_TOKENIZER))
    add("dataloader_num_workers data.dataloader_num_workers", notice(WORKERS, 1))
    add("load_in_4bit ds.load_in_4bit", to("ds.load_in_4bit", 0, "QLoRA: with --ds.lora.rank > 0"))
    add("bf16", conv(param_dtype("model"), "`--model.dtype bfloat16` (bf16 parameters, float32 master "
                                           "weights as DeepSpeed keeps them)", 0))
    add("param_dtype ds.param_dtype",
        conv(param_dtype("model"), "bf16: `--model.dtype bfloat16`; " + fp16_note("model")))
    add("value_head_prefix ds.value_head_prefix", notice(VALUE_HEAD, 1))
    # checkpoints and logging
    add("save_path ckpt.output_dir", to("ckpt.output_dir"))
    add_ckpt_rules(add)
    add("save_hf_ckpt ckpt.save_hf disable_ds_ckpt ckpt.disable_ds use_ds_universal_ckpt ds.use_universal_ckpt",
        notice(DS_CKPT))
    add("logging_steps logger.logging_steps", notice(LOGGING_STEPS, 1))
    add("eval_steps eval.steps", to("train.eval_steps"))
    add("use_tensorboard logger.tensorboard_dir", to("logger.tensorboard_dir"))
    add_wandb_rules(add, "openrlhf_train_sft")


def _supervised_data_rules(add: Callable[[str, Alias], None]) -> None:
    """The model, the data and LoRA."""
    add("pretrain model.model_name_or_path", to("model.model_name_or_path"))
    add("ref_pretrain ref.model_name_or_path", to("ref.model_name_or_path"))
    add("dataset data.dataset", to("data.dataset"))
    add("eval_dataset eval.dataset", to("data.eval_dataset"))
    add("dataset_probs data.dataset_probs", to("data.dataset_probs", note="with comma-separated --data.dataset"))
    add("dataset_split data.dataset_split train_split", to("data.dataset_split"))
    add("eval_split eval.split", to("data.eval_dataset_split"))
    for key in ("input_key", "output_key", "prompt_key", "chosen_key", "rejected_key", "label_key", "input_template",
                "max_samples"):
        add(key if key == "label_key" else f"{key} data.{key}", to(f"data.{key}"))  # KTO had no dotted names
    add("apply_chat_template data.apply_chat_template", to("data.apply_chat_template", 0))
    add("max_len data.max_len", to("data.max_len", note="longer samples are skipped and counted, not truncated"))
    add("tokenizer_chat_template data.tokenizer_chat_template",
        to("data.tokenizer_chat_template", note="read with --data.apply_chat_template, as in OpenRLHF"))
    add("multiturn data.multiturn",
        notice("accepted: rlhfkit's SFT trains every assistant turn of a message list already"))
    add("pretrain_mode model.pretrain_mode_enable", to("model.pretrain_mode_enable", 0))
    add("packing_samples ds.packing_samples", to("ds.packing_samples", 0))
    for key in ("rank", "alpha", "dropout"):
        add(f"lora_{key} ds.lora.{key}", to(f"ds.lora.{key}"))
    add("target_modules ds.lora.target_modules", Alias("mapped", "*", to="ds.lora.target_modules",
                                                       convert=_lora_targets, note="the names comma-separated"))


def _supervised_training_rules(add: Callable[[str, Alias], None]) -> None:
    """Batches, the optimizer and schedule, the losses, knowledge distillation."""
    add("train_batch_size train.batch_size", to("train.batch_size"))
    add("micro_train_batch_size train.micro_batch_size", to("train.micro_batch_size"))
    for key in ("max_epochs", "seed"):
        add(f"{key} train.{key}", to(f"train.{key}"))
    for key in ("max_norm", "lr_scheduler", "lr_warmup_ratio", "min_lr_ratio"):
        add(key, to(f"train.{key}"))
    add("learning_rate adam.lr", to("adam.lr"))
    add("l2 adam.weight_decay", to("adam.weight_decay"))
    add("adam_betas adam.betas", to("adam.betas", 2))
    add("adam.eps", to("adam.eps"))
    add_muon_rules(add, "", "train.optim")
    add("aux_loss_coef model.aux_loss_coef", to("model.aux_loss_coef", note="mixture-of-experts models"))
    # the losses
    add("loss model.loss_type", notice("accepted: rlhfkit's reward-model loss is -log sigmoid(chosen - rejected), "
                                       "what both sigmoid and logexpsigmoid compute", 1))
    add("margin_loss model.margin_loss_enable",
        Alias("mapped", 0, to="model.margin_loss_enable", convert=_margin,
              note="the margin is each record's \"margin\" key; off with --loss logexpsigmoid, whose loss "
                   "has no margin in OpenRLHF"))
    add("compute_fp32_loss model.compute_fp32_loss_enable",
        notice("accepted: rlhfkit computes the losses in float32 already"))
    add("beta model.beta", to("model.beta"))
    add("ipo model.ipo_enable", to("model.ipo_enable", 0))
    add("label_smoothing model.label_smoothing", to("model.label_smoothing"))
    add("nll_loss_coef model.nll_loss_coef", to("model.nll_loss_coef"))
    add("placeholder_token", to("data.placeholder_token"))
    add("reward_tokens", to("data.reward_tokens", 2, note="exactly two: the good-step token, then the bad-step one"))
    add("desirable_loss_weight", to("model.desirable_weight"))
    add("undesirable_loss_weight", to("model.undesirable_weight"))
    # knowledge distillation (train_kd)
    add("teacher_model", to("teacher.model_name_or_path"))
    add("kd_coef", to("kd.coef", note="the weight of KL(teacher || student); 1 - kd_coef weighs the SFT NLL"))
    add("teacher_offload", to("teacher.offload", 0))


SUPERVISED_RULES = _supervised_rules()


# What rlhfkit does with each, per command; RL_FLAGS is `train rl`'s.
SUPERVISED_FLAGS: dict[str, dict[str, Alias]] = {
    kind: {name: SUPERVISED_RULES[name] for name in OPENRLHF_COMMANDS[f"train_{kind}"]}
    for kind in ("sft", "rm", "dpo", "kto", "prm", "kd")
}
# Conditional SFT: OpenRLHF renders the score into the prompt in batch_inference (--post_processor
# csft --reward_template); `rlhfkit train sft` renders it while reading the data.
CONDITIONAL_SFT_ALIASES = {"reward_template": to("data.reward_template")}
for _kind, _flags in SUPERVISED_FLAGS.items():  # each command's own default wandb project
    _switch = _wandb_switch(f"openrlhf_train_{_kind}")
    _flags.update({n: _switch for n in ("use_wandb", "logger.wandb.key") if n in _flags})

# The alias tables of rlhfkit's commands. `train kto` also takes the dotted names of train_dpo
# (OpenRLHF's KTO was gone before its flags were dotted).
SFT_ALIASES = {**SUPERVISED_FLAGS["sft"], **CONDITIONAL_SFT_ALIASES}
PRM_ALIASES = SUPERVISED_FLAGS["prm"]
RM_ALIASES = SUPERVISED_FLAGS["rm"]
DPO_ALIASES = SUPERVISED_FLAGS["dpo"]
KTO_ALIASES = {**{n: r for n, r in DPO_ALIASES.items() if "." in n}, **SUPERVISED_FLAGS["kto"]}


# ------------------------------------------------------------------ batch_inference -> rlhfkit generate | train rs
def _eval_task(vals, given):
    task = vals[0] if vals else ""
    if task == "rm":
        raise ConfigError("--eval_task rm: rlhfkit scores samples inside `rlhfkit train rs` / `train iterative-dpo` "
                          "(--reward.model_name_or_path RM_FOLDER); to sample only, use generate or generate_vllm")
    if task not in ("generate", "generate_vllm"):
        raise ConfigError(f"--eval_task {task!r}: valid here: generate, generate_vllm")
    return {"rollout.engine": "vllm" if task == "generate_vllm" else "hf"}


# OpenRLHF's batch_inference flags that train_ppo_ray has not (the others read as train rl reads them);
# `rlhfkit generate`, `train rs` and `train iterative-dpo` take them.
BATCH_INFERENCE_FLAGS: dict[str, Alias] = {
    "eval_task": conv(_eval_task, "`--rollout.engine hf` (generate) or `vllm` (generate_vllm); rm is refused: "
                                  "`train rs` scores with --reward.model_name_or_path"),
    "dataset": to("data.prompt_dataset"),
    "dataset_probs": to("data.prompt_probs", note="with comma-separated --dataset"),
    "output_key": notice("ignored: generations.jsonl's keys are prompt, label, response, logprob_sum", 1),
    "best_of_n": to("rollout.n_samples_per_prompt"),
    "greedy_sampling": conv(lambda vals, given: {"rollout.temperature": "0"}, "`--rollout.temperature 0`", 0),
    "repetition_penalty": to("rollout.repetition_penalty"),
    "micro_batch_size": to("train.micro_batch_size", note="the reward model's scoring batch"),
    "tp_size": to("vllm.tensor_parallel_size"),
    "max_num_seqs": to("rollout.max_batch_size"),
    "iter": notice("ignored: rlhfkit loops the rounds itself (--rs.rounds, --iterative.rounds), each round "
                   "taking the next --rollout.batch_size prompts", 1),
    "output_path": notice("ignored: rlhfkit writes <--ckpt.output_dir>/generations.jsonl (train rs also "
                          "rs_dataset.jsonl)", 1),
    "post_processor": notice("ignored: `rlhfkit train rs` keeps the best sample of each prompt (rs), `rlhfkit "
                             "train iterative-dpo` pairs the best and the worst (iter_dpo)", 1),
    "reward_template": notice("ignored: batch_inference reads it only in --eval_task rm's csft post-processing, "
                              "which rlhfkit does not run; `rlhfkit train sft --data.reward_template` trains "
                              "conditional SFT", 1),
    "enable_csft": to("csft.enable", 0),
    "csft_prompt": to("csft.prompt"),
}
# `train kd` also takes train_sft's dotted names (OpenRLHF's KD was gone before its flags were dotted).
KD_ALIASES = {**SFT_ALIASES, **SUPERVISED_FLAGS["kd"]}
