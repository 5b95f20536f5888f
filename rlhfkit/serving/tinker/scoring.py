"""The logprobs a sample request asks for besides its samples: the prompt's logprobs and the top-k
logprobs at each prompt position (`include_prompt_logprobs`, `topk_prompt_logprobs`) and at each
sampled position (`topk_sample_logprobs`), from forwards over the prompt and its samples.

Which distribution: a prompt position's are those of the model's own next-token distribution,
log_softmax(logits) (temperature 1), as the prompt logprobs; a sampled position's are those of
the distribution its token was sampled from before truncation, log_softmax(logits / T) at the
request's temperature T (T = 1 for greedy), as the sampled token's own logprob (rollout.sampling),
so the sampled token's entry in its row, when there, is its logprob. Each row holds the k most
likely tokens over the whole vocabulary (top-k / top-p truncation and banned tokens are not
applied), most likely first; position 0 of the prompt has none (the SDK's sentinel row, None to
the client).

The samples' rows come from a forward over `prompt + sample[:-1]` after the engine's decode, not
from the decode loop's own logits: the same numbers to float rounding (the test compares them).
One forward runs at most `batch_tokens` padded tokens (a longer row alone); its logits are
[rows, width, V] floats, so `--max_batch_tokens` bounds this memory as it bounds forward_backward's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rlhfkit.errors import DataError
from rlhfkit.serving.tinker.wire import TOPK_MASK, SampleOptions, TopK

MAX_TOPK = 128  # the widest top-k a request may ask for (vLLM's --max-logprobs is 20 by default)


def check_topk(k, name: str) -> int:
    """`k` as an int in [0, MAX_TOPK]; DataError naming the field otherwise."""
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOPK:
        raise DataError(f"{name} {k!r}: give an integer from 0 (none) to {MAX_TOPK}")
    return k


def topk_rows(logp: torch.Tensor, k: int) -> TopK:
    """The k largest entries of each row of `logp` [L, V] (k capped at V; the rest of a row of
    more than V columns stays the sentinel), as a TopK [L, k]."""
    ids = np.zeros((logp.shape[0], k), dtype=np.int32)
    lps = np.full((logp.shape[0], k), TOPK_MASK, dtype=np.float32)
    if logp.shape[0]:
        top = logp.float().topk(min(k, logp.shape[-1]), dim=-1)
        ids[:, :top.indices.shape[1]] = top.indices.cpu().numpy()
        lps[:, :top.values.shape[1]] = top.values.cpu().numpy()
    return TopK(ids, lps)


def with_empty_first_row(topk: TopK) -> TopK:
    """`topk` [L, k] below a sentinel row: [L + 1, k] (prompt position 0 has no distribution)."""
    k = topk.ids.shape[1]
    return TopK(np.concatenate([np.zeros((1, k), np.int32), topk.ids]),
                np.concatenate([np.full((1, k), TOPK_MASK, np.float32), topk.logprobs]))


@dataclass
class Scores:
    prompt_logprobs: list[float] | None = None  # [P], NaN at position 0
    prompt_topk: TopK | None = None  # [P, k]
    sample_topk: list[TopK] | None = None  # per sample [R_s, k]


def score(forward: Callable[[list[list[int]]], torch.Tensor], prompt: list[int], samples: list[list[int]],
          options: SampleOptions, temperature: float, batch_tokens: int) -> Scores:
    """What `options` asks for, for `prompt` [P] and its sampled token lists (each non-empty).
    `forward(rows)` gives the logits [b, W, V] of the right-padded rows (module docstring)."""
    want_prompt = options.prompt_logprobs or options.topk_prompt > 0
    if options.topk_sample > 0:
        rows = [prompt + s[:-1] for s in samples]
    else:
        rows = [prompt] if want_prompt and len(prompt) > 1 else []  # whole: an image may end the prompt
    out = Scores(sample_topk=[] if options.topk_sample > 0 else None)
    prompt_logp = torch.zeros((0, 1))
    t = temperature if temperature > 0 else 1.0
    for start, stop in padded_runs([len(r) for r in rows], batch_tokens):
        logits = forward(rows[start:stop])
        for r in range(start, stop):
            if r == 0 and want_prompt:
                prompt_logp = torch.log_softmax(logits[0, : len(prompt) - 1].float(), dim=-1)
            if options.topk_sample > 0:
                own = logits[r - start, len(prompt) - 1: len(rows[r])]
                out.sample_topk.append(topk_rows(torch.log_softmax(own.float() / t, dim=-1), options.topk_sample))
    if options.prompt_logprobs:
        picked = prompt_logp.gather(-1, torch.as_tensor(prompt[1:], device=prompt_logp.device).view(-1, 1))
        out.prompt_logprobs = [float("nan")] + picked.squeeze(-1).tolist()
    if options.topk_prompt > 0:
        out.prompt_topk = with_empty_first_row(topk_rows(prompt_logp, options.topk_prompt))
    return out


def padded_runs(lengths: list[int], batch_tokens: int) -> list[tuple[int, int]]:
    """Runs [start, stop) of consecutive rows whose padded size (rows x longest) stays within
    `batch_tokens` (a longer row alone): the forwards of scoring and of forward_backward."""
    out: list[tuple[int, int]] = []
    start, width = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i - start + 1) * max(width, n) > batch_tokens:
            out.append((start, i))
            start, width = i, 0
        width = max(width, n)
    if lengths:
        out.append((start, len(lengths)))
    return out
