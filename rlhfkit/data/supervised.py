"""SFT, preference-pair and unpaired (KTO) datasets, tokenized into prompt + response samples.

Records come from `data.records`: a path (jsonl / json / parquet / datasets folder), a hub dataset
name (`split`, `config`, `data_dir` as `datasets.load_dataset` takes them), a list of dicts, or a
`datasets.Dataset` / `DatasetDict`; errors name the source and record. Each becomes a
`TokenSample`: `prompt_ids` (never trained on) and `response_ids` with a bool `loss_mask`
(True = a target token). The layout is the one `data.batch.collate` pads and
`models.response_logprobs` scores, so every supervised loss reuses the RL forward.

How the text is built:
  * plain strings: prompt = `input_template.format(input)` (or the input as is), response =
    the output followed by the EOS token;
  * `apply_chat_template`: the conversation is rendered by the tokenizer's chat template, turn by
    turn. A record is a message list (`input_key` holds [{"role", "content"}, ...]) or a
    (prompt, response) pair made into [user, assistant]. In SFT every assistant turn is a target
    (multi-turn); in preference data only the last assistant turn (the compared answer) is.
The rendering of each prefix must be a prefix of the next rendering (true of ordinary
templates); otherwise a DataError says which record breaks it. Samples longer than `max_len`
tokens are skipped and counted (SFT samples: or cut, `fit_sample`). Shuffling uses `random.Random(seed)`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.data.records import (
    Record,
    Source,
    first_line,
    is_messages,
    label_value,
    read_records,
    require_key,
    source_name,
)
from rlhfkit.data.truncate import keep
from rlhfkit.errors import ConfigError, DataError


@dataclass
class TokenSample:
    """One tokenized example. P = prompt length (>= 1), R = response length.

    prompt_ids   LongTensor [P]
    response_ids LongTensor [R]   everything after the prompt
    loss_mask    BoolTensor [R]   True = a target token (assistant tokens; False on later user turns)
    vision       the sample's image tensors (data.images.VisionInputs), None without images
    """

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    index: int = 0
    vision: Any = None


@dataclass
class PairSample:
    """A preference pair: the same prompt with a chosen and a rejected response; `margin`: the
    record's "margin" (0 without one), which a reward model's margin loss subtracts."""

    chosen: TokenSample
    rejected: TokenSample
    index: int = 0
    margin: float = 0.0


@dataclass
class LabeledSample:
    """An unpaired example for KTO: a response marked desirable (True) or undesirable (False)."""

    sample: TokenSample
    desirable: bool
    index: int = 0


class TextFormat:
    """Turns prompt / response values of a record into a `TokenSample` with one tokenizer."""

    def __init__(self, tokenizer: Any, apply_chat_template: bool = False, input_template: str | None = None):
        if apply_chat_template and input_template is not None:
            raise ConfigError("--data.input_template and --data.apply_chat_template are both set; choose one")
        if apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("--data.apply_chat_template needs a tokenizer with a chat_template; this one has none")
        if input_template is not None and "{}" not in input_template:
            raise ConfigError(f"--data.input_template {input_template!r} has no '{{}}' for the input")
        self.tokenizer, self.chat, self.template = tokenizer, apply_chat_template, input_template
        self.renderer = tokenizer  # whose apply_chat_template renders the conversation (a VLM: its processor)

    def encode(self, prompt: Any, response: Any, where: str, all_turns: bool,
               record: dict | None = None, response_where: str | None = None) -> TokenSample:
        """prompt: a string or a message list; response: a string (with the chat template, or a list of
        assistant turns), or None when `prompt` is a whole conversation. `all_turns`: every assistant
        turn is a target, else only the last. `record`: the whole record (a format that reads more of
        it, e.g. its images). `where` / `response_where` name the prompt / the response in errors."""
        response_where = response_where or where
        if self.chat:
            messages = _as_messages(prompt, where)
            if is_messages(response):  # TRL's conversational completion: its assistant turn(s)
                messages = messages + list(response)
            elif response is not None:
                messages = messages + [{"role": "assistant", "content": _as_str(response, response_where)}]
            segments = self._chat_segments(messages, where)
            if not all_turns:  # only the final assistant turn is the answer
                last = max(i for i, (_, target) in enumerate(segments) if target)
                segments = [(text, target and i == last) for i, (text, target) in enumerate(segments)]
            pieces = [(self._ids(text), target) for text, target in segments]
            if not all_turns:
                pieces = _end_at_eos(pieces, self.tokenizer.eos_token_id)
        else:
            text = _as_str(prompt, where)
            text = self.template.format(text) if self.template is not None else text
            answer = self._ids(_as_str(response, response_where)) + [self.tokenizer.eos_token_id]
            pieces = [(self._ids(text), False), (answer, True)]
        return _to_sample(pieces, where)

    def encode_text(self, text: Any, max_len: int, where: str) -> TokenSample | None:
        """Continued pretraining (OpenRLHF's pretrain mode): every token of `text` after the first is
        a target; no template, no EOS added; cut to `max_len` tokens. None for a text of under 2 tokens
        (nothing to predict)."""
        ids = self._ids(_as_str(text, where))[:max_len]
        if len(ids) < 2:
            return None
        return TokenSample(torch.tensor(ids[:1]), torch.tensor(ids[1:]), torch.ones(len(ids) - 1, dtype=torch.bool))

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _render(self, messages: list[dict], generation_prompt: bool, where: str) -> str:
        if not messages:
            return ""
        try:
            return self.renderer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception as exc:  # jinja / transformers raise many types
            raise DataError(f"{where}: the tokenizer's chat template failed ({type(exc).__name__}: "
                            f"{first_line(exc)}); fix the messages or the template") from exc

    def _chat_segments(self, messages: list[dict], where: str) -> list[tuple[str, bool]]:
        """[(text, is_target)]: the conversation cut at the start and end of each assistant turn."""
        segments, done = [], ""
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prefix = self._render(messages[:i], True, where)
            full = self._render(messages[: i + 1], False, where)
            if not (prefix.startswith(done) and full.startswith(prefix)):
                raise DataError(f"{where}: the chat template does not render turn {i} as an extension of the "
                                "turns before it, so the assistant tokens cannot be located; use plain "
                                "input/output strings without --data.apply_chat_template")
            segments += [(prefix[len(done):], False), (full[len(prefix):], True)]
            done = full
        if not segments:
            raise DataError(f"{where}: the conversation has no assistant turn to train on")
        whole = self._render(messages, False, where)
        if whole.startswith(done) and len(whole) > len(done):
            segments.append((whole[len(done):], False))
        return segments


def _end_at_eos(pieces: list[tuple[list[int], bool]], eos: int | None) -> list[tuple[list[int], bool]]:
    """A compared answer ends at its last EOS, as a generated response does: the template's text
    after it (e.g. a newline after <|im_end|>) is dropped, so a reward model reads its score at the
    same token in training and in RL (HF reads the last non-pad token, and pad is often EOS)."""
    last = max(i for i, (_, target) in enumerate(pieces) if target)
    ids = pieces[last][0]
    if eos is not None and eos in ids:
        ids = ids[: len(ids) - ids[::-1].index(eos)]
    return pieces[:last] + [(ids, True)]


def _as_messages(value: Any, where: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if is_messages(value):
        return list(value)
    raise DataError(f"{where}: expected a string or a list of {{'role', 'content'}} messages, "
                    f"got {type(value).__name__}")


def _as_str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if is_messages(value):
        raise DataError(f"{where}: a message list, which only the tokenizer's chat template can turn into "
                        "text: add --data.apply_chat_template")
    raise DataError(f"{where}: expected a string, got {type(value).__name__}")


def _to_sample(pieces: list[tuple[list[int], bool]], where: str) -> TokenSample:
    """Concatenate token pieces; the prompt is everything before the first target token."""
    ids = [t for piece, _ in pieces for t in piece]
    mask = [target for piece, target in pieces for _ in piece]
    sample = _split(ids, mask)
    if sample is None:
        raise DataError(f"{where}: the response is empty after tokenization; give a non-empty output")
    return sample


def _split(ids: list[int], mask: list[bool]) -> TokenSample | None:
    """The sample of token `ids` whose targets are `mask`: the prompt is everything before the first target
    (at least one token: a target needs a position before it to be predicted); None without a target then."""
    if not any(mask):
        return None
    p = max(mask.index(True), 1)
    if not any(mask[p:]):
        return None
    return TokenSample(torch.tensor(ids[:p], dtype=torch.long), torch.tensor(ids[p:], dtype=torch.long),
                       torch.tensor(mask[p:], dtype=torch.bool))


def fit_sample(s: TokenSample, max_len: int, truncation: str, where: str) -> TokenSample | None:
    """A sample over `max_len` tokens by `truncation` (verl's SFT data.truncation): None (skip), a DataError
    naming its record (error), or its whole token sequence, template and prompt included, cut to `max_len`
    (left keeps the end, right the start, as verl cuts), its targets with it; None where no target is left."""
    if truncation == "error":
        raise DataError(f"{where}: the sample is {sample_length(s)} tokens, over --data.max_len {max_len} "
                        "(--data.truncation error); raise the limit, or set --data.truncation skip, left or right")
    if truncation not in ("left", "right"):
        return None
    ids = s.prompt_ids.tolist() + s.response_ids.tolist()
    mask = [False] * s.prompt_ids.numel() + s.loss_mask.tolist()
    cut = _split(keep(ids, max_len, truncation), keep(mask, max_len, truncation))
    if cut is not None:
        cut.index = s.index
    return cut


def sample_length(s: TokenSample) -> int:
    return int(s.prompt_ids.numel() + s.response_ids.numel())


def select_records(source: Source, keys: dict[str, str | None], max_samples: int | None, seed: int | None,
             split: str, config: str | None, data_dir: str | None) -> list[tuple[int, Record, str]]:
    """(index, record, source name): records with every needed key present (checked before any
    tokenization), shuffled, cut. A dotted key that is no column reads nested columns (verl's
    `extra_info.question`): each record gets it as a column of its own."""
    if max_samples is not None and max_samples < 1:
        raise ConfigError(f"--data.max_samples must be >= 1 (got {max_samples})")
    name = source_name(source)
    records = read_records(source, split, config, data_dir)
    for record in records:
        for flag, key in keys.items():
            if key is not None and key not in record.data:  # a copy: the caller's dicts stay as they are
                record.data = {**record.data, key: label_value(record, key, flag, name)}
    order = list(range(len(records)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    if max_samples is not None:
        order = order[:max_samples]
    return [(i, records[i], name) for i in order]


def load_sft(source: Source, fmt: TextFormat, input_key: str = "input", output_key: str | None = "output",
             max_len: int = 2048, max_samples: int | None = None, seed: int | None = None,
             split: str = "train", config: str | None = None, data_dir: str | None = None,
             reward_template: str | None = None, reward_key: str = "reward",
             pretrain_mode: bool = False, truncation: str = "skip") -> tuple[list[TokenSample], int]:
    """SFT samples and the number skipped for exceeding `max_len` (`truncation`: what a longer sample gets,
    `fit_sample`; skipped where it is not cut). With `output_key` None (or
    absent from every record) `input_key` must hold a whole conversation (chat template).
    `source`: a path or hub name, a list of dicts, or a `datasets.Dataset` / `DatasetDict` (`split`
    taken; `config` and `data_dir` as `datasets.load_dataset` takes them for hub names).
    Conditional SFT: with `reward_template`, each input string becomes `render_reward(template,
    input, record[reward_key])` before the input template (OpenRLHF's csft processor).
    `pretrain_mode`: the `input_key` texts as they are, every token a target (`TextFormat.encode_text`);
    texts of under 2 tokens are skipped and counted."""
    keys = {"--data.input_key": input_key, "--data.reward_key": reward_key if reward_template else None,
            "--data.output_key": output_key if output_key and "." in output_key else None}
    rows = select_records(source, keys, max_samples, seed, split, config, data_dir)
    if pretrain_mode:
        texts = [(i, fmt.encode_text(r.data[input_key], max_len, f"{p}, {r.where}, key {input_key!r}"))
                 for i, r, p in rows]
        kept = [TokenSample(s.prompt_ids, s.response_ids, s.loss_mask, i) for i, s in texts if s is not None]
        if not kept:
            raise DataError(f"{source_name(source)}: no {input_key!r} text has 2 tokens or more to train on")
        return kept, len(texts) - len(kept)
    if output_key is not None and all(output_key not in r.data for _, r, _ in rows):
        if not all(is_messages(r.data[input_key]) for _, r, _ in rows):
            require_key(rows[0][1], output_key, "--data.output_key", rows[0][2])
        output_key = None  # conversations: every assistant turn is a target
    samples, skipped = [], 0
    for i, record, p in rows:
        where = f"{p}, {record.where}"
        if output_key is not None:
            require_key(record, output_key, "--data.output_key", p)
        response = record.data[output_key] if output_key is not None else None
        prompt = record.data[input_key]
        if reward_template is not None:
            prompt = render_reward(reward_template, _as_str(prompt, where), record.data[reward_key],
                                   f"{where}, key {reward_key!r}")
        s = fmt.encode(prompt, response, f"{where}, key {input_key!r}", all_turns=True, record=record.data,
                       response_where=f"{where}, key {output_key!r}")
        s.index = i
        if sample_length(s) > max_len:
            s = fit_sample(s, max_len, truncation, where)
            if s is None:
                skipped += 1
                continue
        samples.append(s)
    return nonempty(samples, skipped, max_len, source), skipped


def render_reward(template: str, text: str, reward: Any, where: str = "") -> str:
    """Conditional SFT's prompt (Lu et al. 2023, arXiv:2308.12050; OpenRLHF's csft processor):
    `template` with {reward} replaced by the score with two decimals and {input} by `text`, e.g.
    render_reward("{input} <rm_score>: {reward} ", "2+3=", 5) == "2+3= <rm_score>: 5.00 "."""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise DataError(f"{where}: expected a number (the score of conditional SFT), got {reward!r}")
    return template.replace("{reward}", f"{float(reward):.2f}").replace("{input}", text)


def load_pairs(source: Source, fmt: TextFormat, prompt_key: str | None = "prompt", chosen_key: str = "chosen",
               rejected_key: str = "rejected", max_len: int = 2048, max_samples: int | None = None,
               seed: int | None = None, split: str = "train", config: str | None = None,
               data_dir: str | None = None) -> tuple[list[PairSample], int]:
    """Preference pairs. chosen/rejected are strings or TRL's assistant turns (after the prompt of
    `prompt_key`), whole conversations (message lists whose last assistant turn is the compared answer;
    `prompt_key` may be None), or, with `prompt_key` None, whole texts whose common beginning is the
    prompt (TRL's implicit prompt; OpenRLHF without --prompt_key trains on the whole texts, and the
    shared beginning cancels in the DPO loss and does not move a reward model's final score)."""
    keys = {"--data.chosen_key": chosen_key, "--data.rejected_key": rejected_key}
    rows = select_records(source, keys, max_samples, seed, split, config, data_dir)
    pairs, skipped = [], 0
    for i, record, p in rows:
        where = f"{p}, {record.where}"
        texts = (record.data[chosen_key], record.data[rejected_key])
        cut = shared_prefix(*texts) if prompt_key is None and all(isinstance(t, str) for t in texts) else None
        sides = [_pair_side(fmt, record, key, value, prompt_key, cut, where)
                 for key, value in zip((chosen_key, rejected_key), texts)]
        if max(sample_length(s) for s in sides) > max_len:
            skipped += 1
            continue
        pairs.append(PairSample(sides[0], sides[1], i, _margin(record, where)))
    return nonempty(pairs, skipped, max_len, source), skipped


def _pair_side(fmt: TextFormat, record: Record, key: str, value: Any, prompt_key: str | None, cut: int | None,
               where: str) -> TokenSample:
    """One side of a pair: a whole conversation, a text split at `cut` (implicit prompt), or an answer after
    the record's `prompt_key` value."""
    if is_messages(value) and not answer_only(value):  # a whole conversation, prompt included
        return fmt.encode(value, None, f"{where}, key {key!r}", all_turns=False, record=record.data)
    if cut is not None:
        return fmt.encode(value[:cut], value[cut:], f"{where}, key {key!r}", all_turns=False, record=record.data)
    if prompt_key is None or prompt_key not in record.data:  # the answer alone: its prompt is missing
        raise DataError(f"{where}: no key {prompt_key or 'prompt'!r} (--data.prompt_key) for the answer under "
                        f"{key!r}; the record has keys {sorted(record.data)}; set --data.prompt_key to the prompt's "
                        "column, or to none when the chosen and rejected strings hold the whole text (the prompt is "
                        "then their common beginning)")
    return fmt.encode(record.data[prompt_key], value, f"{where}, key {prompt_key!r}", all_turns=False,
                      record=record.data, response_where=f"{where}, key {key!r}")


def shared_prefix(a: str, b: str) -> int:
    """Where an implicit prompt ends: the length of the common beginning of `a` and `b`, less a final space (which
    goes with the answers, as BPE tokenizers attach a space to the word after it), as TRL's extract_prompt cuts."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n - 1 if n > 0 and a[n - 1] == " " else n


def answer_only(messages: list[dict]) -> bool:
    """True for messages that are all assistant turns: an answer whose prompt is elsewhere (TRL's
    conversational preference data with an explicit prompt, `{"prompt": [user], "chosen": [assistant]}`)."""
    return all(m["role"] == "assistant" for m in messages)


def _margin(record: Record, where: str) -> float:
    """The record's "margin" key (OpenRLHF's name), 0 when absent or null."""
    value = record.data.get("margin")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(f"{where}, key 'margin': expected a number (the reward model's margin), got {value!r}")
    return float(value)


def load_unpaired(source: Source, fmt: TextFormat, prompt_key: str = "prompt", output_key: str = "output",
                  label_key: str = "label", max_len: int = 2048, max_samples: int | None = None,
                  seed: int | None = None, split: str = "train", config: str | None = None,
                  data_dir: str | None = None) -> tuple[list[LabeledSample], int]:
    """KTO examples: (prompt, output, label) with a boolean label (True = desirable). TRL's unpaired layout
    (prompt, completion, label) is read as it is: with the default `output_key` "output" absent from every
    record and "completion" in each, the completions are the outputs."""
    rows = select_records(source, {"--data.prompt_key": prompt_key}, max_samples, seed, split, config, data_dir)
    if output_key == "output" and rows and all("output" not in r.data and "completion" in r.data for _, r, _ in rows):
        output_key = "completion"  # TRL's KTO column
    for _, record, p in sorted(rows, key=lambda row: row[0]):  # in file order, before any tokenization
        require_key(record, output_key, "--data.output_key", p)
        require_key(record, label_key, "--data.label_key", p)
    out, skipped = [], 0
    for i, record, p in rows:
        where = f"{p}, {record.where}"
        label = record.data[label_key]
        if not isinstance(label, bool):
            raise DataError(f"{where}, key {label_key!r}: expected true or false, got {label!r}")
        s = fmt.encode(record.data[prompt_key], record.data[output_key], f"{where}, key {prompt_key!r}",
                       all_turns=False, record=record.data,  # (its images, with a vision-language model's format)
                       response_where=f"{where}, key {output_key!r}")
        if sample_length(s) > max_len:
            skipped += 1
            continue
        out.append(LabeledSample(s, label, i))
    return nonempty(out, skipped, max_len, source), skipped


def nonempty(items: list, skipped: int, max_len: int, source: Source) -> list:
    if not items:
        raise DataError(f"{source_name(source)}: all {skipped} samples are longer than --data.max_len {max_len} "
                        "tokens; raise it")
    return items
