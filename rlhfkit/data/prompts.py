"""Prompt datasets for RL: read records from a file, folder or memory and build the prompt strings.

Sources (read by rlhfkit.data.records; a path is chosen by its suffix):
  *.jsonl          one JSON object per line (blank lines are skipped)
  *.json           a list of objects, or {"data": [...]}, or JSON Lines
  *.parquet        read with pyarrow
  a folder         a HF `datasets` folder written by `save_to_disk` (a `DatasetDict` -> `split`),
                   or a folder of data files (`datasets.load_dataset(folder)`)
  org/name         a hub dataset (`split`, `config`, `data_dir` as `datasets.load_dataset` takes them)
  a list of dicts, or a `datasets.Dataset` / `DatasetDict` object (`split` as for folders)

Each record gives one `PromptExample`. Its `text` is the final string handed to the tokenizer:
the input value formatted by `input_template`, or rendered by the tokenizer's chat template
(`apply_chat_template=True`; the value is a string, made a user message, or a message list
[{"role", "content"}, ...]), or used as is. `check_prompts` runs every check of `load_prompts`
with the same arguments but without a tokenizer, so a command can refuse bad data before any model
loads. Errors are `DataError` (bad data) or `ConfigError` (arguments that do not fit together);
each names the source (the file, or "in-memory list"), the line or record and the key.

Determinism: shuffling uses a local `random.Random(shuffle_seed)`; the global RNG is untouched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rlhfkit.data.records import (
    SUPPORTED_SUFFIXES,
    Record,
    Source,
    first_line,
    is_messages,
    label_value,
    read_records,
    require_key,
    source_name,
)
from rlhfkit.data.truncate import TRUNCATION_SIDES, truncate_ids
from rlhfkit.data.types import PromptItem
from rlhfkit.errors import ConfigError, DataError

__all__ = ["SUPPORTED_SUFFIXES", "PromptExample", "check_prompts", "load_prompts"]


@dataclass
class PromptExample:
    """One prompt.

    text   the final prompt string fed to the tokenizer (template or chat template applied)
    label  the record's `label_key` value (e.g. the reference answer), None without a label_key
    raw    the record as read from the source (the dict itself for an in-memory list)
    index  the record's 0-based position in the source (stable under shuffling)
    """

    text: str
    label: Any | None
    raw: dict[str, Any]
    index: int


def load_prompts(
    source: Source,
    input_key: str = "input",
    label_key: str | None = None,
    tokenizer: Any = None,
    apply_chat_template: bool = False,
    input_template: str | None = None,
    max_samples: int | None = None,
    shuffle_seed: int | None = None,
    split: str = "train",
    config: str | None = None,
    data_dir: str | None = None,
) -> list[PromptExample]:
    """Read a prompt dataset and build one `PromptExample` per record.

    Every record is checked for `input_key` (and `label_key` when given) before anything is
    built, so a bad record fails fast. Records are shuffled with `random.Random(shuffle_seed)`
    when a seed is given, then cut to `max_samples`; only the kept records are rendered.

    Args:
      source: a .jsonl / .json / .parquet file or a folder (a path), a hub dataset name
        (`org/name`), a list of dicts, or a `datasets.Dataset` / `DatasetDict`.
      input_key: the field holding the prompt: a string, or a list of {"role", "content"}
        messages (the latter needs `apply_chat_template=True`).
      label_key: the field holding the label (reference answer); None for no labels.
      tokenizer: anything with `apply_chat_template(messages, tokenize=False,
        add_generation_prompt=True) -> str`; needed when `apply_chat_template` is True.
      apply_chat_template: render each prompt with the tokenizer's chat template.
      input_template: a format string with one `{}` (e.g. "Question: {}\\nAnswer:").
      max_samples: keep at most this many records (after shuffling).
      shuffle_seed: shuffle with this seed; None keeps the file order.
      split: the split to take from a `DatasetDict` (folder or object) or a hub dataset.
      config: the hub dataset's config name (`datasets.load_dataset`'s `name`, e.g. "main").
      data_dir: the hub dataset's (or data-file folder's) subfolder to read.

    Raises:
      ConfigError: the arguments do not fit together.
      DataError: the source is missing, malformed, empty, or a record lacks a key or holds a
        prompt of the wrong type.
    """
    if apply_chat_template and not hasattr(tokenizer, "apply_chat_template"):
        raise ConfigError(
            "load_prompts: apply_chat_template=True needs a tokenizer with apply_chat_template; "
            f"got {type(tokenizer).__name__}"
        )
    if apply_chat_template and getattr(tokenizer, "chat_template", "") is None:  # a base model's tokenizer
        raise ConfigError(
            "--data.apply_chat_template: the tokenizer has no chat template (a base model's); give a model "
            "whose tokenizer has one, or string prompts with --data.input_template (e.g. 'Q: {}\\nA: ')"
        )
    name, kept = kept_records(source, input_key, label_key, apply_chat_template, input_template,
                               max_samples, shuffle_seed, split, config, data_dir)
    examples = []
    for i, record in kept:
        value = _prompt_value(record, input_key, name, apply_chat_template, input_template)
        text = _render(value, f"{name}, {record.where}, key {input_key!r}", tokenizer, input_template)
        label = label_value(record, label_key, "label_key", name) if label_key is not None else None
        examples.append(PromptExample(text=text, label=label, raw=record.data, index=i))
    return examples


def check_prompts(
    source: Source,
    input_key: str = "input",
    label_key: str | None = None,
    apply_chat_template: bool = False,
    input_template: str | None = None,
    max_samples: int | None = None,
    shuffle_seed: int | None = None,
    split: str = "train",
    config: str | None = None,
    data_dir: str | None = None,
    labels_for: str | None = None,
) -> int:
    """Every check `load_prompts` makes with these arguments, without a tokenizer (nothing is
    rendered): the source, the keys of every record, the prompt type of every kept record (a
    string, or with `apply_chat_template` also a message list). Returns the number of prompts
    `load_prompts` would build. Raises as `load_prompts`; with `labels_for` (the flag and value of a
    reward that scores against each prompt's label, "--reward.remote_url builtin:math"), also when
    there is no label_key or a kept record's label is null."""
    if labels_for is not None and label_key is None:
        raise ConfigError(f"{labels_for} scores each response against its prompt's reference answer: set "
                          "--data.label_key to the column holding it")
    name, kept = kept_records(source, input_key, label_key, apply_chat_template, input_template,
                               max_samples, shuffle_seed, split, config, data_dir)
    for _, record in kept:
        _prompt_value(record, input_key, name, apply_chat_template, input_template)
        if labels_for is not None and label_value(record, label_key, "label_key", name) is None:
            raise DataError(f"{name}, {record.where}, key {label_key!r} (--data.label_key): null, and {labels_for} "
                            "needs each prompt's reference answer; fill it in or drop the record")
    return len(kept)


def kept_records(
    source: Source, input_key: str, label_key: str | None, apply_chat_template: bool = False,
    input_template: str | None = None, max_samples: int | None = None, shuffle_seed: int | None = None,
    split: str = "train", config: str | None = None, data_dir: str | None = None,
) -> tuple[str, list[tuple[int, Record]]]:
    """(source name, [(index, record)]): every record checked for its keys, then shuffled and cut."""
    _check_arguments(apply_chat_template, input_template, max_samples)
    name = source_name(source)
    records = read_records(source, split, config, data_dir)
    for record in records:
        require_key(record, input_key, "input_key", name)
        if label_key is not None:
            label_value(record, label_key, "label_key", name)
    order = list(range(len(records)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    if max_samples is not None:
        order = order[:max_samples]
    return name, [(i, records[i]) for i in order]


def _check_arguments(apply_chat_template: bool, input_template: str | None, max_samples: int | None) -> None:
    """Raise ConfigError when the rendering arguments contradict each other."""
    if apply_chat_template and input_template is not None:
        raise ConfigError(
            "load_prompts: input_template and apply_chat_template are both set; choose one "
            "(the chat template already wraps the prompt)"
        )
    if input_template is not None:
        try:
            input_template.format("")
        except (IndexError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"load_prompts: input_template {input_template!r} is not a format string with "
                f"one '{{}}' ({exc}); double any literal braces as '{{{{' and '}}}}'"
            ) from exc
        if "{}" not in input_template:
            raise ConfigError(
                f"load_prompts: input_template {input_template!r} has no '{{}}' for the prompt"
            )
    if max_samples is not None and (isinstance(max_samples, bool) or max_samples < 1):
        raise ConfigError(
            f"load_prompts: max_samples must be a positive integer or None, got {max_samples!r}"
        )


# ---------------------------------------------------------------------------------------------
# Building prompt text
# ---------------------------------------------------------------------------------------------


def _prompt_value(record: Record, input_key: str, source: str, apply_chat_template: bool,
                  input_template: str | None = None) -> str | list[dict]:
    """The record's prompt: a string, or (with `apply_chat_template`) a message list; a string
    becomes one user message. DataError for any other type, and for a string that renders empty."""
    value = record.data[input_key]
    where = f"{source}, {record.where}, key {input_key!r}"
    if apply_chat_template:
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if is_messages(value):
            return value
        raise DataError(
            f"{where}: expected a string or a list of {{'role', 'content'}} messages, "
            f"got {type(value).__name__}"
        )
    if isinstance(value, str):
        if (input_template or "{}").format(value) == "":
            raise DataError(f"{where}: an empty prompt, which gives the policy no token to start from; "
                            "give it text or drop the record")
        return value
    if is_messages(value):
        raise DataError(
            f"{where}: a message list, which only the tokenizer's chat template can turn into a "
            "prompt: add --data.apply_chat_template (apply_chat_template=True)"
        )
    raise DataError(f"{where}: expected a string, got {type(value).__name__}")


def _render(value: str | list[dict], where: str, tokenizer: Any, input_template: str | None) -> str:
    """The final prompt string: a message list through the chat template, a string through
    `input_template` (or as is)."""
    if isinstance(value, str):
        return input_template.format(value) if input_template is not None else value
    try:
        text = tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja / transformers raise many types
        raise DataError(
            f"{where}: the tokenizer's chat template failed ({type(exc).__name__}: "
            f"{first_line(exc)}); give a tokenizer with a chat_template that accepts these "
            "messages, or use input_template instead"
        ) from exc
    if not isinstance(text, str):
        raise DataError(f"{where}: the chat template returned {type(text).__name__}, not str")
    return text


def _fit(tokenizer, ex, ids: list[int], raw, max_len: int, truncation: str,
         input_template: str | None) -> list[int] | None:
    """`ids` of a prompt over `max_len` tokens, by `truncation`: cut (left, right, middle), None (skip, or
    not cuttable), or a DataError naming the record (error)."""
    if truncation == "error":
        raise DataError(f"record {getattr(ex, 'index', '?')}: its prompt is {len(ids)} tokens, over "
                        f"--data.prompt_max_len {max_len} (--data.truncation error); raise the limit, or set "
                        "--data.truncation skip, left, right or middle")
    if truncation not in TRUNCATION_SIDES:
        return None
    return truncate_ids(tokenizer, ex.text, raw, max_len, truncation, input_template)


def tokenize_prompts(examples, tokenizer, max_len: int, input_key: str | None = None,
                     truncation: str = "skip", input_template: str | None = None) -> tuple[list[PromptItem], int]:
    """Tokenize prompt texts once; a prompt longer than `max_len` tokens is, by `truncation`: skipped and
    counted (skip), a DataError (error), or cut to `max_len` (left, right, middle: data.truncate, then
    skipped where it cannot be cut). `input_key`: the record's prompt column (its value becomes PromptItem.raw);
    `input_template`: the one that rendered string prompts (where the cut finds their text)."""
    items, skipped = [], 0
    for ex in examples:
        ids = tokenizer(ex.text, add_special_tokens=False)["input_ids"]
        record = dict(ex.raw) if isinstance(ex.raw, dict) else {}
        raw, text = record.get(input_key, ex.text), ex.text
        if len(ids) > max_len:
            ids = _fit(tokenizer, ex, ids, raw, max_len, truncation, input_template)
            if ids is None:
                skipped += 1
                continue
            text = tokenizer.decode(ids, skip_special_tokens=False)
        items.append(PromptItem(text, ids, ex.label, raw=raw, record=record))
    if not items:
        raise DataError(f"every prompt is longer than --data.prompt_max_len {max_len} tokens; raise it")
    return items, skipped
