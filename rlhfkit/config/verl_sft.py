"""verl's SFT trainer overrides (`torchrun -m verl.trainer.fsdp_sft_trainer KEY=VALUE ...`) and what `rlhfkit train sft`
does with each, as config/verl.py does for the PPO trainer: every key of verl's sft_trainer.yaml (config/verl_names.py's
VERL_SFT_KEYS) mapped, noticed or refused.

verl's SFT batches (verl/trainer/fsdp_sft_trainer.py): `data.train_batch_size` counts the samples of one optimizer
step over all GPUs (`--train.batch_size`); `data.micro_batch_size_per_gpu` the samples of one forward pass on one device
(`--train.micro_batch_size`). The prompt is `data.prompt_key` (inside it, the path `data.prompt_dict_keys`), rendered
as a user message with the chat template; the response `data.response_key` (`data.response_dict_keys`) is the target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlhfkit.config.openrlhf import conv, notice, refuse, to
from rlhfkit.config.parse import Alias
from rlhfkit.config.verl import (
    CKPT,
    KERNEL,
    LOGGERS,
    OFF,
    PADDING,
    TARGET,
    adder,
    find_rule,
    layered,
    override_items,
)
from rlhfkit.config.verl_convert import (
    files,
    global_micro,
    loggers,
    max_samples,
    multiturn,
    nested_key,
    resume,
    scheduler,
    warmup_steps,
)
from rlhfkit.config.verl_names import VERL_SFT_KEYS

ONE_PROCESS = "ignored: verl's FSDP/device layout; rlhfkit's train sft holds the whole model in one process (same math)"
VERL_SFT_RULES: dict[str, Alias] = {}
_rule = adder(VERL_SFT_RULES)


# data
_rule("data.train_files", conv(files("data.dataset"), "`--data.dataset` (a list: comma-separated)"))
_rule("data.val_files", conv(files("data.eval_dataset", single=True), "`--data.eval_dataset` (one file)"))
_rule("data.train_batch_size", to("train.batch_size", note="samples per optimizer step over all devices, as in verl"))
_rule("data.micro_batch_size_per_gpu", to("train.micro_batch_size", note="samples per device, as in verl"))
_rule("data.micro_batch_size", conv(global_micro, "`--train.micro_batch_size` = this / (trainer.n_gpus_per_node x "
                                                  "trainer.nnodes)"))
_rule("data.train_max_samples", conv(max_samples("data.max_samples"), "`--data.max_samples` (-1: all)"))
_rule("data.val_max_samples", notice("ignored: rlhfkit evaluates on the whole --data.eval_dataset", 1))
_rule("data.prompt_key data.prompt_dict_keys",
      conv(nested_key("data.input_key", "data.prompt_key", "question"), "`--data.input_key COLUMN[.KEY...]` (a dotted "
                                                                         "path into the column's dicts)"))
_rule("data.response_key data.response_dict_keys",
      conv(nested_key("data.output_key", "data.response_key", "answer"), "`--data.output_key COLUMN[.KEY...]`"))
_rule("data.multiturn.enable data.multiturn.messages_key",
      conv(multiturn, "`--data.input_key MESSAGES` with no output key: every assistant turn is a target"))
_rule("data.multiturn.tools_key data.multiturn.enable_thinking_key",
      notice("ignored: rlhfkit renders each conversation's messages only (no tools or thinking switch column)", 1))
_rule("data.max_length", to("data.max_len", note="longer samples: data.truncation"))
_rule("data.truncation", to("data.truncation", note="error, left or right, as verl: the whole tokenized sample is cut"))
_rule("data.chat_template", to("data.tokenizer_chat_template"))
_rule("data.custom_cls.path data.custom_cls.name", refuse("rlhfkit reads its own SFT dataset (no custom class); "
                                                          "convert the data to jsonl/parquet", harmless=OFF))
_rule("data.apply_chat_template_kwargs", refuse("rlhfkit renders the chat template without extra arguments",
                                                harmless=("{}",)))
_rule("data.balance_dp_token data.use_shm", notice("ignored: how verl's workers read and split the data", 1))
# the model
_rule("model.partial_pretrain", to("model.model_name_or_path"))
_rule("model.enable_gradient_checkpointing", to("model.gradient_checkpointing_enable"))
_rule("model.lora_rank", to("ds.lora.rank"))
_rule("model.lora_alpha", to("ds.lora.alpha"))
_rule("model.target_modules", to("ds.lora.target_modules", note="a list: comma-separated"))
_rule("model.trust_remote_code model.external_lib",
      refuse("rlhfkit loads models without remote code or extra libraries", harmless=OFF))
_rule("model.use_liger", notice(KERNEL, 1))
_rule("model.use_shm model.strategy", notice(ONE_PROCESS, 1))
_rule("use_remove_padding", notice(PADDING, 1))
_rule("ulysses_sequence_parallel_size", notice("ignored: sequence parallelism; each sequence runs on one device", 1))
# the optimizer and schedule
_rule("optim.lr", to("adam.lr"))
_rule("optim.betas", to("adam.betas"))
_rule("optim.weight_decay", to("adam.weight_decay"))
_rule("optim.clip_grad", to("train.max_norm"))
_rule("optim.lr_warmup_steps_ratio", to("train.lr_warmup_ratio"))
_rule("optim.min_lr_ratio", to("train.min_lr_ratio", note="with a cosine schedule"))
_rule("optim.lr_scheduler optim.lr_scheduler_type optim.warmup_style",
      conv(scheduler("train.lr_scheduler"),
           "`--train.lr_scheduler`: constant; cosine -> cosine_with_min_lr (with min_lr_ratio)"))
_rule("optim.lr_warmup_steps", conv(warmup_steps("train.lr_warmup_steps"), "`--train.lr_warmup_steps` (-1 or null: "
                                                                         "the ratio); one verl SFT step is one "
                                                                         "optimizer step"))
_rule("optim.num_cycles", refuse("rlhfkit's cosine is a half cycle", harmless=("0.5",)))
_rule("optim.optimizer", refuse("rlhfkit's optimizers are AdamW and Muon (--train.optim)", harmless=("AdamW", "adamw")))
_rule("optim.optimizer_impl", refuse("rlhfkit uses torch.optim's AdamW", harmless=("torch.optim",)))
_rule("optim.override_optimizer_config", refuse("rlhfkit's optimizer has no extra settings", harmless=OFF))
_rule("optim.total_training_steps", notice("ignored: verl fills it in; rlhfkit's schedule counts the run's steps", 1))
# the trainer
_rule("trainer.total_epochs", to("train.max_epochs"))
_rule("trainer.total_training_steps", to("train.max_steps"))
_rule("trainer.save_freq", to("ckpt.save_steps", note="optimizer steps; -1: only the final model"))
_rule("trainer.test_freq", to("train.eval_steps"))
_rule("trainer.default_local_dir", to("ckpt.output_dir"))
_rule("trainer.project_name trainer.experiment_name trainer.logger", conv(loggers("gsm8k-sft", "test"), LOGGERS))
_rule("trainer.seed", to("train.seed"))
_rule("trainer.max_ckpt_to_keep", conv(lambda vals, given: {} if vals[0] == "none" else {"ckpt.max_num": vals[0]},
                                       "`--ckpt.max_num`"))
_rule("trainer.resume_mode", conv(resume, "auto: `--ckpt.load_enable true`; disable: false"))
_rule("trainer.resume_from_path", refuse("rlhfkit resumes from <--ckpt.output_dir>/checkpoints (resume_mode=auto)",
                                         harmless=OFF))
_rule("trainer.default_hdfs_dir", refuse("rlhfkit writes checkpoints to the local --ckpt.output_dir", harmless=OFF))
_rule("trainer.n_gpus_per_node trainer.nnodes", notice(ONE_PROCESS, 1))
_rule("trainer.device", conv(lambda vals, given: {"model.device": vals[0]}, "`--model.device`"))

VERL_SFT_PATTERNS: dict[str, Alias] = {
    "*._target_": notice(TARGET, 1),
    "model.fsdp_config.*": notice(ONE_PROCESS, 1),
    "trainer.checkpoint.*": notice(CKPT, 1),
}

# verl's SFT defaults where rlhfkit's differ (applied as overrides before the user's).
VERL_SFT_DEFAULTS = (
    "data.train_batch_size=256", "data.micro_batch_size_per_gpu=4", "data.max_length=1024", "data.prompt_key=question",
    "data.response_key=answer", "model.enable_gradient_checkpointing=True", "optim.lr=1e-5", "optim.weight_decay=0.01",
    "optim.lr_warmup_steps_ratio=0.1", "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.0", "trainer.total_epochs=4",
    "trainer.seed=1", "trainer.resume_mode=auto", "data.truncation=error",
)
# verl renders the prompt as a user message with the chat template.
VERL_SFT_DATA = {"data.apply_chat_template": "true"}


def verl_sft_rule(key: str) -> Alias:
    """The rule of verl's SFT override `key`."""
    return find_rule(key, VERL_SFT_RULES, VERL_SFT_PATTERNS, VERL_SFT_KEYS)


def verl_sft_values(tokens: list[str], table: dict[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """`train sft`'s values of verl's SFT overrides `tokens` over verl's defaults; `flags`: rlhfkit's own, which win."""
    base = override_items(list(VERL_SFT_DEFAULTS), verl_sft_rule)
    return layered(base, override_items(tokens, verl_sft_rule), table, flags, VERL_SFT_DATA)
