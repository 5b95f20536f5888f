"""Stop strings for engines that stop on token ids: cut a sampled response after the first token at
which its decoded text contains a stop string (as vLLM and OpenAI's ``stop`` do, on text).

Cutting after sampling is exact: a sample's first k tokens have the same distribution whether the
engine stopped at k or went on, so the kept tokens and their logprobs are what stopping would give.
A stop string that is one token is also passed to the engine as a stop id, so it stops early.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlhfkit.data.types import FINISH_STOP, Trajectory


def split_stops(stops: Sequence[str | int], tokenizer) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(stop token ids, stop strings)``: ints are ids; a string is a text stop, and its id as well
    when it encodes to one token."""
    ids, texts = [], []
    for item in stops:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise TypeError(f"stop {item!r}: give token ids (int) or strings")
        if isinstance(item, int):
            ids.append(item)
            continue
        if not item:
            raise ValueError("stop: an empty string would stop before the first token")
        texts.append(item)
        encoded = tokenizer.encode(item, add_special_tokens=False)
        if len(encoded) == 1:
            ids.append(encoded[0])
    return tuple(ids), tuple(texts)


def stop_position(response_ids: Sequence[int], texts: Sequence[str], tokenizer) -> int | None:
    """The number of tokens up to and including the one that completes the first stop string in
    the decoded response, or None when the text holds none."""
    if not texts or not response_ids:
        return None
    if not any(t in tokenizer.decode(list(response_ids)) for t in texts):
        return None
    for k in range(1, len(response_ids) + 1):
        text = tokenizer.decode(list(response_ids[:k]))
        if any(t in text for t in texts):
            return k
    return None


def cut_at_stop_strings(trajectory: Trajectory, texts: Sequence[str], tokenizer) -> Trajectory:
    """``trajectory`` cut after the token that completes its first stop string (finish reason
    ``stop``); unchanged when its text holds none."""
    k = stop_position(trajectory.response_ids.tolist(), texts, tokenizer)
    if k is None or k == trajectory.response_length and not trajectory.truncated:
        return trajectory
    versions = None if trajectory.versions is None else trajectory.versions[:k]
    return dataclasses.replace(trajectory, response_ids=trajectory.response_ids[:k],
                               loss_mask=trajectory.loss_mask[:k], logprobs=trajectory.logprobs[:k],
                               finish_reason=FINISH_STOP, versions=versions)
