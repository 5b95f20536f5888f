"""The rules that read a TRL config dataclass (`GRPOConfig`, `SFTConfig`, `DPOConfig`) field by field.

Each field has one `Rule`: mapped (a function of the value and the whole config -> rlhfkit flags),
noticed (HF Trainer machinery that does not change the math: a one-line warning on the "rlhfkit"
logger when the value is not TRL's default), refused (math rlhfkit cannot honour: a one-line
ConfigError when the value is not TRL's default, or not one of the values the rule accepts) or silent
(set by TRL itself in `__post_init__`, or read by another field's rule). `apply_rules` applies a table
to a config; a field the table lacks is refused by name, so a newer TRL's field is noticed. TRL is not
imported here: its configs are read by attribute and `dataclasses.fields`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import Any

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


def mapped(to: Mapper) -> Rule:
    return Rule("mapped", to=to)


def flag(name: str, conv: Callable[[Any], str] = str) -> Rule:
    return Rule("mapped", to=lambda v, c: [f"--{name}", conv(v)])


def notice(note: str, *same: Any) -> Rule:
    return Rule("noticed", note=note, same=same)


def refuse(note: str, *same: Any) -> Rule:
    return Rule("refused", note=note, same=same)


def silent(note: str) -> Rule:
    return Rule("silent", note=note)


def plain(value: Any) -> Any:
    value = value.value if isinstance(value, enum.Enum) else value
    return None if value in ([], "", "none", ["none"], {}) else value


def table(*groups: tuple[str, Rule]) -> dict[str, Rule]:
    """{field: rule} of (space-separated field names, rule) pairs."""
    return {name: rule for names, rule in groups for name in names.split()}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def apply_rules(config: Any, rules: dict[str, Rule], what: str) -> list[str]:
    """The flags of TRL config `config` (a `what`) under `rules`: mapped fields' flags in field order,
    noticed ones logged, the first refused one raised; a field without a rule is a ConfigError."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise ConfigError(f"expected a TRL {what} instance, got {type(config).__name__}: build it with "
                          f"trl.{what}(...)")
    fields = dataclasses.fields(config)
    unknown = [f.name for f in fields if f.name not in rules and not f.name.startswith("_")]
    if unknown:
        raise ConfigError(f"TRL {what} fields rlhfkit has no rule for: {', '.join(unknown)}; "
                          "set them as rlhfkit flags (docs/migration.md)")
    argv: list[str] = []
    for f in fields:
        rule = rules.get(f.name)
        if rule is None:
            continue
        value = getattr(config, f.name)
        if rule.kind == "mapped":
            argv += rule.to(value, config)
            continue
        same = rule.same or (plain(_default(f)),)
        if rule.kind == "silent" or plain(value) in same:
            continue
        if rule.kind == "refused":
            raise ConfigError(f"TRL {f.name}={value!r}: {rule.note}")
        log.warning("TRL %s=%r: %s", f.name, value, rule.note)
    return argv


HF = "ignored: HF Trainer machinery that rlhfkit's own loop replaces (the math is unchanged)"
HUB = "ignored: rlhfkit does not push to the Hub; upload --ckpt.output_dir yourself"
LOG = "ignored: rlhfkit logs every step to metrics.jsonl (--logger.*)"
DIST = "ignored: rlhfkit's layout is set by its own distributed flags (docs/scaling.md)"
POST_INIT = "set by TRL/transformers in __post_init__ or read by another field's rule"
NOT_BUILT = "not built in rlhfkit"


def opt(name: str) -> Rule:
    """Mapped to `--name VALUE` unless the value is None."""
    return mapped(lambda v, c: [] if v is None else [f"--{name}", str(v)])


def _scheduler(prefix: str) -> Mapper:
    def to(v: Any, _c: Any) -> list[str]:
        kind = plain(v)
        if kind not in ("constant", "linear", "cosine", "constant_with_warmup"):
            raise ConfigError(f"TRL lr_scheduler_type={kind!r}: rlhfkit has constant, linear, cosine (to 0) and "
                              "cosine_with_min_lr; set lr_scheduler_type to one of constant, linear, cosine")
        return [f"--{prefix}lr_scheduler", "constant" if kind == "constant_with_warmup" else kind]
    return to


def _warmup(prefix: str) -> Mapper:
    """TRL's warmup_steps below 1 is a ratio of all steps (-1 steps: the ratio is read); whole steps are
    --PREFIX.lr_warmup_steps (both count optimizer steps); its `constant` schedule has no warmup."""
    def to(v: Any, c: Any) -> list[str]:
        steps = f"--{prefix}lr_warmup_steps"
        if plain(getattr(c, "lr_scheduler_type", "linear")) == "constant" or not v:
            return [steps, "0"]
        if float(v) < 1:
            return [f"--{prefix}lr_warmup_ratio", repr(float(v)), steps, "-1"]
        return [steps, str(int(v))]
    return to


def _precision(_v: Any, c: Any, flag_name: str) -> list[str]:
    if getattr(c, "bf16", False) and getattr(c, "fp16", False):
        raise ConfigError("TRL bf16 and fp16 both set: choose one")
    dtype = "bfloat16" if getattr(c, "bf16", False) else "float16" if getattr(c, "fp16", False) else None
    return [f"--{flag_name}", dtype] if dtype else []


def _report(v: Any, c: Any) -> list[str]:
    targets = [v] if isinstance(v, str) else list(v or [])
    targets = [t for t in targets if t not in ("none", "all")] if "all" not in targets else ["wandb"]
    if set(targets) - {"wandb"}:
        log.warning("TRL report_to=%s: rlhfkit logs to wandb, tensorboard (--logger.tensorboard_dir) and "
                    "metrics.jsonl; the others are ignored", v)
    return ["--logger.wandb.project", str(getattr(c, "project", "huggingface"))] if "wandb" in targets else []


def hf_rules(optimizer: str, train: str, model: str, eval_note: str) -> dict[str, Rule]:
    """The rules of the HF `TrainingArguments` fields every TRL config extends, but the batch, epoch and step
    counts (each command's own). `optimizer`, `train`, `model`: the prefixes of our adam, schedule and model
    flags ("actor.adam.", "actor.", "actor." for train rl); `eval_note`: what evaluation fields get."""
    return table(
        ("learning_rate", flag(optimizer + "lr", repr)), ("lr_scheduler_type", mapped(_scheduler(train))),
        ("warmup_steps", mapped(_warmup(train))),
        ("warmup_ratio", mapped(lambda v, c: _warmup(train)(v, c) if v else [])),
        ("weight_decay", flag(optimizer + "weight_decay", repr)), ("adam_epsilon", flag(optimizer + "eps", repr)),
        ("adam_beta1", mapped(lambda v, c: [f"--{optimizer}betas", repr(float(v)), repr(float(c.adam_beta2))])),
        ("adam_beta2", silent("read by adam_beta1's rule")),
        ("max_grad_norm", flag(train + "max_norm", repr)), ("seed", flag("train.seed")),
        ("bf16", mapped(lambda v, c: _precision(v, c, model + "autocast"))), ("fp16", silent("read by bf16's rule")),
        ("gradient_checkpointing", flag(model + "gradient_checkpointing_enable", lambda v: str(bool(v)).lower())),
        ("output_dir", opt("ckpt.output_dir")),
        ("save_steps", mapped(lambda v, c: ["--ckpt.save_steps", str(int(v))] if float(v) >= 1 else [])),
        ("save_total_limit", opt("ckpt.max_num")),
        ("report_to", mapped(_report)), ("project", silent("read by report_to's rule")),
        ("run_name", opt("logger.wandb.name")),
        ("optim", refuse("rlhfkit's optimizer is AdamW (or muon: its own flag); use an adamw optim",
                         "adamw_torch_fused", "adamw_torch", "adamw_hf")),
        ("optim_args optim_target_modules lr_scheduler_kwargs label_smoothing_factor neftune_noise_alpha",
         refuse(f"{NOT_BUILT}; leave it at TRL's default")),
        ("average_tokens_across_devices tf32 torch_compile torch_compile_backend torch_compile_mode use_liger_kernel "
         "liger_kernel_config use_cache torch_empty_cache_steps auto_find_batch_size activation_checkpointing_kwargs "
         "gradient_checkpointing_kwargs full_determinism data_seed dataloader_drop_last dataloader_num_workers "
         "dataloader_persistent_workers dataloader_prefetch_factor dataloader_multiprocessing_context "
         "dataloader_in_order remove_unused_columns label_names train_sampling_strategy length_column_name "
         "skip_memory_metrics do_train do_eval do_predict resume_from_checkpoint ignore_data_skip "
         "restore_callback_states_from_checkpoint enable_jit_checkpoint save_only_model save_on_each_node "
         "save_strategy load_best_model_at_end metric_for_best_model greater_is_better", notice(HF)),
        ("push_to_hub hub_token hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision",
         notice(HUB)),
        ("eval_strategy eval_steps eval_delay per_device_eval_batch_size prediction_loss_only eval_on_start "
         "eval_do_concat_batches eval_use_gather_object eval_accumulation_steps include_for_metrics "
         "batch_eval_metrics bf16_full_eval fp16_full_eval", notice(eval_note)),
        ("logging_strategy logging_steps logging_first_step log_on_each_node logging_nan_inf_filter "
         "include_num_input_tokens_seen log_level log_level_replica trackio_space_id trackio_bucket_id "
         "trackio_static_space_id debug", notice(LOG)),
        ("parallelism_config ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph "
         "ddp_backend ddp_timeout fsdp fsdp_config deepspeed local_rank", notice(DIST)),
        ("activation_checkpointing use_cpu accelerator_config dataloader_pin_memory disable_tqdm", silent(POST_INIT)),
    )
