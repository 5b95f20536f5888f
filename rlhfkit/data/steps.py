"""Step-labelled data for process reward models (`rlhfkit train prm`), as OpenRLHF's train_prm
reads it.

A record holds a text (`input_key`) in which a placeholder token ends each reasoning step, and a
list of labels (`label_key`), one per placeholder, in order:

    {"input": "2+3=5 ки 5*2=11 ки", "label": ["+", "-"]}        reward tokens (hard labels)
    {"input": "2+3=5 ки 5*2=11 ки", "label": [1.0, 0.3]}        P(good step) (soft, Math-Shepherd)

The text is tokenized as it is (no template, no special tokens). A `StepSample` marks the
placeholder positions (`step_mask`: the last token of a placeholder the tokenizer splits into
several, `Placeholder`) and holds each one's target probability that the step is
good: 1.0 for the first reward token, 0.0 for the second, or the float label. The model is trained
to predict the reward token at the placeholder, i.e. from the placeholder's own position (OpenRLHF
reads the logits at the placeholder too). Differences from OpenRLHF: samples over `max_len` are
skipped and counted (not truncated), and a record whose placeholder count differs from its label
count is an error that names it (OpenRLHF drops the extra labels silently).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.data.records import Source
from rlhfkit.data.supervised import TextFormat, nonempty, select_records
from rlhfkit.errors import ConfigError, DataError


@dataclass
class StepSample:
    """One tokenized step-labelled text. L = its length.

    input_ids  LongTensor [L]
    step_mask  BoolTensor [L]    True at each placeholder's last token (a step's end)
    targets    FloatTensor [L]   P(good step) wanted at each placeholder; 0 elsewhere
    """

    input_ids: torch.Tensor
    step_mask: torch.Tensor
    targets: torch.Tensor
    index: int = 0


@dataclass(frozen=True)
class Placeholder:
    """A step-end placeholder as token ids: `ids` are inserted at a step end (RL responses), `variants`
    are the sequences matched in a text (a step's score is read at the last token of a match).

    A placeholder the tokenizer splits (Math-Shepherd's "ки" is 2 tokens for SmolLM2's tokenizer) is
    matched as a token sequence, both as written alone and after a space (BPE tokenizers merge the
    space into the first token: " ки" is " к" + "и"); the spaced form is the one inserted when the
    space merges, as Math-Shepherd writes "step ки".
    """

    ids: tuple[int, ...]
    variants: tuple[tuple[int, ...], ...]

    def ends(self, ids: Sequence[int]) -> list[int]:
        """Positions of the last token of each match in `ids`, left to right, matches not overlapping
        (the longest variant first where two start at one position)."""
        out, t, n = [], 0, len(ids)
        by_length = sorted(self.variants, key=len, reverse=True)
        while t < n:
            hit = next((v for v in by_length if tuple(ids[t : t + len(v)]) == v), None)
            if hit is None:
                t += 1
                continue
            out.append(t + len(hit) - 1)
            t += len(hit)
        return out


def placeholder_of(tokenizer: Any, token: str, flag: str) -> Placeholder:
    """`token` as a `Placeholder` for `tokenizer` (one or more tokens); ConfigError if it encodes to none."""
    bare = tuple(tokenizer(token, add_special_tokens=False)["input_ids"])
    if not bare:
        raise ConfigError(f"{flag} {token!r} encodes to no token for this tokenizer; pick a visible token")
    spaced = tuple(tokenizer(" " + token, add_special_tokens=False)["input_ids"])
    variants = [bare] if spaced[-len(bare):] == bare or not spaced else [bare, spaced]
    merged = len(spaced) == len(bare) and spaced != bare
    return Placeholder(spaced if merged else bare, tuple(variants))


def single_token_id(tokenizer: Any, token: str, flag: str) -> int:
    """The id of `token` if the tokenizer encodes it as exactly one token, else a ConfigError."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ConfigError(f"{flag} {token!r} is {len(ids)} tokens for this tokenizer, not one; pick a token "
                          "it encodes as one (e.g. a character or a reserved special token)")
    return int(ids[0])


def label_targets(labels: Any, reward_tokens: Sequence[str], where: str) -> list[float]:
    """P(good) per label: reward_tokens[0] -> 1.0, reward_tokens[1] -> 0.0, a number in [0, 1] as it is."""
    if not isinstance(labels, (list, tuple)) or not labels:
        raise DataError(f"{where}: expected a non-empty list of step labels, got {labels!r}")
    out = []
    for label in labels:
        if isinstance(label, str):
            if label not in reward_tokens:
                raise DataError(f"{where}: label {label!r} is not one of --data.reward_tokens "
                                f"{' '.join(reward_tokens)}")
            out.append(1.0 if label == reward_tokens[0] else 0.0)
        elif isinstance(label, (int, float)) and not isinstance(label, bool) and 0.0 <= label <= 1.0:
            out.append(float(label))
        else:
            raise DataError(f"{where}: label {label!r} is neither a reward token nor a number in [0, 1]")
    return out


def encode_steps(tokenizer: Any, text: str, labels: Any, placeholder: Placeholder | int,
                 reward_tokens: Sequence[str], where: str) -> StepSample:
    """A `StepSample` of `text` with `labels` placed at its placeholders (at the last token of each), in
    order. `placeholder`: a `Placeholder`, or the id of a one-token one."""
    if not isinstance(text, str):
        raise DataError(f"{where}: expected a string, got {type(text).__name__}")
    if isinstance(placeholder, int):
        placeholder = Placeholder((placeholder,), ((placeholder,),))
    targets = label_targets(labels, reward_tokens, where)
    raw = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(raw, dtype=torch.long)
    mask = torch.zeros(ids.numel(), dtype=torch.bool)
    mask[placeholder.ends(raw)] = True
    found = int(mask.sum())
    if found == 0:
        raise DataError(f"{where}: no placeholder token (--data.placeholder_token) in the tokenized input; "
                        "end each step with it")
    if found != len(targets):
        raise DataError(f"{where}: {found} placeholder tokens but {len(targets)} labels; give one label per "
                        "step (a placeholder merged into a neighbouring token does not count: surround it "
                        "with spaces)")
    full = torch.zeros(ids.numel())
    full[mask] = torch.tensor(targets)
    return StepSample(ids, mask, full)


def load_steps(source: Source, fmt: TextFormat, placeholder: str, reward_tokens: Sequence[str],
               input_key: str = "input", label_key: str = "label", max_len: int = 2048,
               max_samples: int | None = None, seed: int | None = None, split: str = "train",
               config: str | None = None, data_dir: str | None = None) -> tuple[list[StepSample], int]:
    """Step-labelled samples and the number skipped for exceeding `max_len` tokens, tokenized by
    `fmt.tokenizer` (the text as it is). `source` as `data.supervised.load_sft` takes it."""
    tokenizer = fmt.tokenizer
    placeholder_ids = placeholder_of(tokenizer, placeholder, "--data.placeholder_token")
    for flag_token in reward_tokens:
        single_token_id(tokenizer, flag_token, "--data.reward_tokens")
    keys = {"--data.input_key": input_key, "--data.label_key": label_key}
    rows = select_records(source, keys, max_samples, seed, split, config, data_dir)
    samples, skipped = [], 0
    for i, record, name in rows:
        where = f"{name}, {record.where}"
        s = encode_steps(tokenizer, record.data[input_key], record.data[label_key], placeholder_ids,
                         reward_tokens, where)
        s.index = i
        if s.input_ids.numel() > max_len:
            skipped += 1
            continue
        samples.append(s)
    return nonempty(samples, skipped, max_len, source), skipped


@dataclass
class StepBatch:
    """Step-labelled samples laid out for one forward: B right-padded rows (`collate_steps`), or the B
    samples end to end in one row (`pack_steps`, the layout of data/packing.py's PackedBatch: position ids
    restart at 0 for each sample and there is no attention mask, so transformers keeps every sample's
    attention inside it). Either way `step_mask` selects the step ends sample by sample, in order, so
    `targets[step_mask]` lines up with the model's outputs at `step_mask` in both layouts. L = the row width.

    input_ids       LongTensor [B, L], or [1, L] packed
    attention_mask  LongTensor [B, L] (1 = a token), or None packed
    position_ids    None, or LongTensor [1, L] packed (0..len_b-1 for each sample b)
    step_mask       BoolTensor like input_ids: True at each step end
    targets         FloatTensor like input_ids: P(good step) wanted at the step ends, 0 elsewhere
    lengths         LongTensor [B]: each sample's tokens
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    step_mask: torch.Tensor
    targets: torch.Tensor
    lengths: torch.Tensor

    def padded(self, pad_id: int = 0) -> StepBatch:
        """The same samples as `collate_steps` lays them out (for a model that cannot keep the samples of a
        packed row apart; padding is masked out, so any `pad_id` gives the same outputs)."""
        if self.position_ids is None:
            return self
        cuts = self.lengths.tolist()
        rows = zip(*(t[0].split(cuts) for t in (self.input_ids, self.step_mask, self.targets)))
        return collate_steps([StepSample(ids, mask, targets) for ids, mask, targets in rows], pad_id)


def collate_steps(samples: Sequence[StepSample], pad_id: int) -> StepBatch:
    """Right-padded rows [B, L]: input_ids, attention_mask (long), step_mask (bool), targets."""
    width = max(s.input_ids.numel() for s in samples)

    def pad(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.numel()), value=value)

    return StepBatch(
        input_ids=torch.stack([pad(s.input_ids, pad_id) for s in samples]),
        attention_mask=torch.stack([pad(torch.ones_like(s.input_ids), 0) for s in samples]),
        position_ids=None,
        step_mask=torch.stack([pad(s.step_mask, False) for s in samples]),
        targets=torch.stack([pad(s.targets, 0.0) for s in samples]),
        lengths=torch.tensor([s.input_ids.numel() for s in samples], dtype=torch.long),
    )


def pack_steps(samples: Sequence[StepSample]) -> StepBatch:
    """The samples end to end in one row [1, L] (L = their total tokens; no padding, no attention mask)."""
    lengths = torch.tensor([s.input_ids.numel() for s in samples], dtype=torch.long)
    return StepBatch(
        input_ids=torch.cat([s.input_ids for s in samples]).unsqueeze(0),
        attention_mask=None,
        position_ids=torch.cat([torch.arange(n) for n in lengths.tolist()]).unsqueeze(0),
        step_mask=torch.cat([s.step_mask for s in samples]).unsqueeze(0),
        targets=torch.cat([s.targets for s in samples]).unsqueeze(0),
        lengths=lengths,
    )
