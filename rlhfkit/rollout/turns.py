"""An episode's KV cache kept across its turns: multi-turn rollouts prefill only each turn's new tokens.

A multi-turn executor calls the engine once per turn with the episode's whole history as the prompt
(prompt + every action and feedback token so far). With the hint `episode_keys` (one key per prompt),
the HF engine keeps, when an episode's row leaves the batch, the keys and values of the tokens that
row ran through the model (its prompt and its action but the last token, whose keys and values were
never computed), and at the episode's next turn prefills only what comes after them: the action's last
token and the feedback. SGLang's RadixAttention and vLLM's automatic prefix caching keep KV blocks
across requests by content; here the executor names the episode and the engine checks the content.

Exact by construction: an entry is reused only when its tokens are a strict prefix of the new prompt
(else the prompt is prefilled in full and the entry dropped: the cache of other tokens is never used),
only under the weights that computed it (its version; `clear` at every weight update), and a token's
keys and values depend only on the tokens before it. The row layout of a prefill over kept entries
is [left padding | kept tokens | left padding | new tokens], the padding masked out and the position
ids counted over real tokens, so each token sees the context and positions of the plain layout (as in
rollout/prefix.py). The numbers differ from a full prefill only by float rounding (the kept keys and
values were computed one decode step at a time).

Bounded: an entry lives from the end of a turn to the start of the episode's next (then its keys and
values move into the batch's cache), `end` drops those of finished episodes, and the kept entries
together hold at most `max_tokens` tokens (beyond it a row is not kept: its next turn is prefilled in
full).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from rlhfkit.rollout.prefix import prefill_after


@dataclass
class KeptTurn:
    """What one episode's row left in the cache: `tokens` (the real tokens, in order) and per layer
    their keys / values [heads, len(tokens), head_dim], computed by the weights of `version`."""

    tokens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    version: int


class TurnCaches:
    """One engine's kept entries by episode key; `max_tokens` bounds their tokens (None: no bound).
    `reused_tokens` counts the prompt tokens whose keys and values came from an entry."""

    def __init__(self, max_tokens: int | None = None):
        self.max_tokens = max_tokens
        self.kept: dict[Hashable, KeptTurn] = {}
        self.reused_tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens held by the kept entries."""
        return sum(len(e.tokens) for e in list(self.kept.values()))

    def put(self, key: Hashable, entry: KeptTurn) -> None:
        """Keep `entry` for `key` (replacing its older one), unless that passes `max_tokens`."""
        self.kept.pop(key, None)
        if self.max_tokens is None or self.tokens + len(entry.tokens) <= self.max_tokens:
            self.kept[key] = entry

    def take(self, key: Hashable, prompt: Sequence[int], version: int) -> KeptTurn | None:
        """Remove and return `key`'s entry when it can start `prompt` (its tokens a strict prefix of
        it, computed by the weights of `version`); else None (an unusable entry is dropped)."""
        entry = self.kept.pop(key, None)
        if entry is None or entry.version != version or len(entry.tokens) >= len(prompt):
            return None
        return entry if list(prompt[: len(entry.tokens)]) == entry.tokens else None

    def end(self, keys: Sequence[Hashable]) -> None:
        """Drop the entries of `keys` (finished episodes)."""
        for key in keys:
            self.kept.pop(key, None)

    def clear(self) -> None:
        """Drop every entry (the weights changed)."""
        self.kept.clear()


def row_entry(cache, row: int, columns: torch.Tensor, tokens: list[int], version: int) -> KeptTurn:
    """The entry of batch row `row` of a growing `cache` (rollout.kv_cache): its `columns` [len(tokens)]
    (the positions of `tokens` in the row), copied out of the batch's buffers."""
    return KeptTurn(tokens, [layer.keys[row][:, columns] for layer in cache.layers],
                    [layer.values[row][:, columns] for layer in cache.layers], version)


def prefill_kept(forward: Callable, prompts: Sequence[Sequence[int]], kept: Sequence[KeptTurn | None], cache,
                 pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill `prompts` (U of them) after their `kept` entries (None: the whole prompt): each row's
    kept keys and values left-padded to the longest, written into the empty growing `cache`, then the
    rest of each prompt. `forward` as in rollout.prefix.prefill_shared. Returns (logits [U, V],
    attention_mask [U, W], position_ids [U, W]) over the rows' whole width."""
    width = max(len(e.tokens) if e is not None else 0 for e in kept)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    sample = next(e for e in kept if e is not None)
    for layer, (k0, v0) in enumerate(zip(sample.keys, sample.values)):
        keys = k0.new_zeros((len(prompts), k0.shape[0], width, k0.shape[-1]))
        values = v0.new_zeros((len(prompts), v0.shape[0], width, v0.shape[-1]))
        for row, e in enumerate(kept):
            if e is not None and e.tokens:
                keys[row, :, width - len(e.tokens):] = e.keys[layer]
                values[row, :, width - len(e.tokens):] = e.values[layer]
                mask[row, width - len(e.tokens):] = 1
        cache.layers[layer].update(keys, values)
    own = [list(p[len(e.tokens):]) if e is not None else list(p) for p, e in zip(prompts, kept)]
    return prefill_after(forward, own, mask, cache, pad_id, device)
