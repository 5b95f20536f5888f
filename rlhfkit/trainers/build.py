"""Model and prompt helpers shared by the trainers and the API: model names, the policy with its
tokenizer, tokenized prompts. (Config -> components lives in rlhfkit.api.components.)"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.data.types import PromptItem
from rlhfkit.errors import DataError
from rlhfkit.models import load_causal_lm, load_tokenizer, materialize_smollm2
from rlhfkit.models.loading import resolve_model_path
from rlhfkit.models.precision import DTYPES


def resolve_model(name_or_path: str) -> tuple[str, str | None]:
    """`smollm2` -> the cached HF folder (converted once); `x/y.gguf` -> (folder, file); a local folder
    as is; a hub name `org/name` -> its folder in the Hugging Face cache."""
    if name_or_path == "smollm2" and not Path(name_or_path).exists():
        return str(materialize_smollm2()), None
    p = Path(name_or_path)
    if p.suffix == ".gguf":
        return str(p.parent), p.name
    return str(resolve_model_path(name_or_path)), None


def load_policy(name_or_path: str, dtype: str):
    path, gguf = resolve_model(name_or_path)
    tokenizer = load_tokenizer(path, gguf_file=gguf)
    model = load_causal_lm(path, dtype=DTYPES[dtype], gguf_file=gguf)
    return model, tokenizer


def tokenize_prompts(examples, tokenizer, max_len: int, input_key: str | None = None) -> tuple[list[PromptItem], int]:
    """Tokenize prompt texts once; prompts longer than `max_len` tokens are skipped and counted.
    `input_key`: the record's prompt column (its value becomes PromptItem.raw)."""
    items, skipped = [], 0
    for ex in examples:
        ids = tokenizer(ex.text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_len:
            skipped += 1
            continue
        record = dict(ex.raw) if isinstance(ex.raw, dict) else {}
        items.append(PromptItem(ex.text, ids, ex.label, raw=record.get(input_key, ex.text), record=record))
    if not items:
        raise DataError(f"every prompt is longer than --data.prompt_max_len {max_len} tokens; raise it")
    return items, skipped
