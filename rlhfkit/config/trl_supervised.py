"""TRL's `SFTConfig`, `DPOConfig`, `KTOConfig` and `RewardConfig` read field by field into `rlhfkit train
sft` / `train dpo` / `train kto` / `train rm` flags.

Every field of TRL 1.16's configs has one rule (config/trl_rules.py): the `TrainingArguments` ones shared
with GRPO (`hf_rules`), the batch counts below, and each trainer's own. `SFTConfig.from_trl`,
`DPOConfig.from_trl`, `KTOConfig.from_trl` and `RMConfig.from_trl` (config/sft.py) parse the flags.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.config.trl_rules import (
    HF,
    NOT_BUILT,
    Rule,
    flag,
    hf_rules,
    mapped,
    notice,
    opt,
    plain,
    refuse,
    silent,
    table,
)
from rlhfkit.errors import ConfigError

_EVAL = "ignored: rlhfkit evaluates with --data.eval_dataset (or --data.eval_split) every --train.eval_steps"
_LENGTH = "ignored: rlhfkit skips samples longer than --data.max_len (max_length) rather than truncate them"


def _batch(v: Any, c: Any) -> list[str]:
    """One process: `per_device_train_batch_size` samples per forward/backward, times
    `gradient_accumulation_steps` per optimizer step (TRL's DPO counts pairs, as ours)."""
    micro, accumulation = int(v), int(c.gradient_accumulation_steps)
    return ["--train.micro_batch_size", str(micro), "--train.batch_size", str(micro * accumulation)]


def _epochs(v: Any, c: Any) -> list[str]:
    """TRL's max_steps wins over num_train_epochs, passing over the data as often as it takes: as many passes
    as steps (each pass is at least one step), --train.max_steps the cap."""
    if int(getattr(c, "max_steps", -1)) > 0:
        return ["--train.max_epochs", str(int(c.max_steps))]
    if float(v) != int(v):
        raise ConfigError(f"TRL num_train_epochs={v}: rlhfkit's --train.max_epochs counts whole passes; "
                          "use a whole number or max_steps")
    return ["--train.max_epochs", str(int(v))]


def _eval(v: Any, c: Any) -> list[str]:
    kind = plain(v)
    if kind == "steps":
        return ["--train.eval_steps", str(int(c.eval_steps or c.logging_steps))]
    if kind not in (None, "no"):
        raise ConfigError(f"TRL eval_strategy={kind!r}: rlhfkit evaluates every N optimizer steps; use "
                          "eval_strategy='steps' with eval_steps")
    return []


def _supervised(model: str) -> dict[str, Rule]:
    """The rules every supervised TRL config shares (model flags under `model`)."""
    return {**hf_rules("adam.", "train.", model, _EVAL), **table(
        ("per_device_train_batch_size", mapped(_batch)),
        ("gradient_accumulation_steps", silent("read by per_device_train_batch_size's rule")),
        ("num_train_epochs", mapped(_epochs)),
        ("max_steps", mapped(lambda v, c: ["--train.max_steps", str(int(v))] if int(v) > 0 else [])),
        ("eval_strategy", mapped(_eval)), ("eval_steps", silent("read by eval_strategy's rule")),
        ("max_length", opt("data.max_len")), ("truncation_mode", notice(_LENGTH)),
        ("router_aux_loss_coef", opt(model + "aux_loss_coef")),
        ("pad_to_multiple_of", notice(HF, "auto", None)),
        ("model_init_kwargs trust_remote_code dataset_num_proc padding_free activation_offloading "
         "pad_token", notice(HF)),
    )}


def _sft_loss(v: Any, _c: Any) -> list[str]:
    if v not in ("nll", "dft"):
        raise ConfigError(f"TRL SFT loss_type={v!r}: rlhfkit's train sft has nll and dft (--model.loss_type)")
    return [] if v == "nll" else ["--model.loss_type", v]


SFT_RULES: dict[str, Rule] = {**_supervised("model."), **table(
    ("packing", mapped(lambda v, c: ["--ds.packing_samples", str(bool(v)).lower()])),
    ("packing_strategy eval_packing shuffle_dataset dataset_kwargs", notice(HF)),
    ("dataset_text_field", notice("ignored: rlhfkit reads --data.input_key / --data.output_key "
                                  "(docs/sft_rm_dpo.md); pass them as flags")),
    ("completion_only_loss", refuse("rlhfkit's train sft trains on the completion only; for whole texts use "
                                    "--model.pretrain_mode_enable", None, True)),
    ("assistant_only_loss", notice("rlhfkit's loss counts the response (with a chat template every assistant "
                                   "turn) only: TRL's assistant_only_loss=True; TRL's False also trains on user "
                                   "turns of conversations", True)),
    ("loss_type", mapped(_sft_loss)),
    ("truncation_mode", notice("ignored: rlhfkit skips samples longer than --data.max_len (max_length); to cut "
                               "them set --data.truncation right (TRL's keep_start) or left (keep_end)")),
    ("eos_token", refuse("rlhfkit ends each response with the tokenizer's EOS token", None)),
    ("chat_template_path", refuse("set rlhfkit's --data.tokenizer_chat_template with --data.apply_chat_template",
                                  None)),
)}


def _dropout(command: str) -> Rule:
    return notice(f"rlhfkit's train {command} keeps the model's dropout (most LLMs have none); TRL's default "
                  "turns it off", False)


def _dpo_loss(v: Any, _c: Any) -> list[str]:
    kinds = [v] if isinstance(v, str) else list(v)
    if kinds == ["sigmoid"]:
        return []
    if kinds == ["ipo"]:
        return ["--model.ipo_enable", "true"]
    raise ConfigError(f"TRL DPO loss_type={v!r}: rlhfkit's train dpo has sigmoid (DPO, cDPO with label_smoothing) "
                      "and ipo; use one of them")


DPO_RULES: dict[str, Rule] = {**_supervised("model."), **table(
    ("beta", flag("model.beta", repr)), ("label_smoothing", flag("model.label_smoothing", repr)),
    ("loss_type", mapped(_dpo_loss)),
    ("disable_dropout", _dropout("dpo")),
    ("precompute_ref_log_probs precompute_ref_batch_size", notice(HF)),
    ("loss_weights ld_alpha use_weighting sync_ref_model", refuse(f"{NOT_BUILT}; leave it at TRL's default")),
    ("f_divergence_type", refuse("rlhfkit's DPO uses the reverse KL (TRL's default)", "reverse_kl")),
    ("f_alpha_divergence_coef discopop_tau ref_model_mixup_alpha ref_model_sync_steps",
     refuse("read only by TRL losses rlhfkit does not build; leave it at TRL's default")),
)}


def _kto_loss(v: Any, _c: Any) -> list[str]:
    if v != "kto":
        raise ConfigError(f"TRL KTO loss_type={v!r}: rlhfkit's train kto has the KTO loss only (loss_type='kto'); "
                          "APO-zero's unpaired loss is not built")
    return []


KTO_RULES: dict[str, Rule] = {**_supervised("model."), **table(
    ("beta", flag("model.beta", repr)), ("desirable_weight", flag("model.desirable_weight", repr)),
    ("undesirable_weight", flag("model.undesirable_weight", repr)), ("loss_type", mapped(_kto_loss)),
    ("disable_dropout", _dropout("kto")), ("precompute_ref_log_probs precompute_ref_batch_size", notice(HF)),
    ("sync_ref_model", refuse(f"TR-DPO's reference syncing is {NOT_BUILT}; leave it at TRL's default")),
    ("ref_model_mixup_alpha ref_model_sync_steps", silent("read only with sync_ref_model, which is refused")),
)}

RM_RULES: dict[str, Rule] = {**_supervised("model."), **table(
    ("center_rewards_coefficient", opt("model.center_rewards_coef")),
    ("disable_dropout", _dropout("rm")),
    ("eos_token", SFT_RULES["eos_token"]), ("chat_template_path", SFT_RULES["chat_template_path"]),
)}
