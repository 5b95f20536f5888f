"""OpenRLHF's reward server flags (`python -m openrlhf.cli.serve_rm`, releases 0.8.0 to 0.11.0: flat names
up to 0.10.1, dotted ones from 0.10.2) and what `rlhfkit serve-reward` does with each, as the training
commands' tables in config/openrlhf.py; docs/migration.md lists them (config/openrlhf_doc.py)."""

from __future__ import annotations

from rlhfkit.config.openrlhf import (
    ATTN,
    FAST_TOKENIZER,
    MODELSCOPE,
    MOE,
    VALUE_HEAD,
    conv,
    notice,
    to,
    weights_dtype,
)
from rlhfkit.config.parse import Alias

OPENRLHF_SERVE_RM = [
    # flat names (0.8.0 to 0.10.1)
    "reward_pretrain", "normalize_reward", "value_head_prefix", "max_len", "port", "host", "load_in_4bit", "bf16",
    "flash_attn", "attn_implementation", "param_dtype", "disable_fast_tokenizer", "packing_samples", "batch_size",
    "use_ms",
    # dotted names (0.10.2 and later; port, host, batch_size and use_ms kept their names)
    "reward.model_name_or_path", "reward.normalize_enable", "ds.value_head_prefix", "data.max_len", "ds.load_in_4bit",
    "ds.param_dtype", "ds.attn_implementation", "ds.experts_implementation", "data.disable_fast_tokenizer",
    "ds.packing_samples",
]


_dtype = weights_dtype("dtype", "serves a reward model")


def _rules() -> dict[str, Alias]:
    rules: dict[str, Alias] = {}

    def add(names: str, rule: Alias) -> None:
        for name in names.split():
            rules[name] = rule

    add("reward_pretrain reward.model_name_or_path", to("reward.model_name_or_path"))
    add("normalize_reward reward.normalize_enable", to("reward.normalize_enable", 0))
    add("max_len data.max_len", to("data.max_len"))
    add("batch_size", to("batch_size", note="queries per forward pass; requests that arrive together share passes"))
    add("port", to("port"))
    add("host", to("host", note="default 127.0.0.1; OpenRLHF's is 0.0.0.0"))
    add("bf16", conv(_dtype, "`--dtype bfloat16`", 0))
    add("param_dtype ds.param_dtype", conv(_dtype, "`--dtype bfloat16`; fp16: `--dtype float16` "
                                                   "(rlhfkit's default: float32)"))
    add("load_in_4bit ds.load_in_4bit", notice("ignored: the reward model is served unquantized in --dtype (float32, "
                                               "bfloat16 or float16; more memory, no 4-bit rounding)"))
    add("value_head_prefix ds.value_head_prefix", notice(VALUE_HEAD, 1))
    add("flash_attn", notice(ATTN))
    add("attn_implementation ds.attn_implementation", notice(ATTN, 1))
    add("ds.experts_implementation", notice(MOE, 1))
    add("disable_fast_tokenizer data.disable_fast_tokenizer", notice(FAST_TOKENIZER))
    add("packing_samples ds.packing_samples", notice("ignored: the server pads its batches (the same scores)"))
    add("use_ms", notice(MODELSCOPE))
    return rules


SERVE_RM_FLAGS = _rules()
