"""The prefix the prompts of one rollout chunk share (a chat template's system prompt, a few-shot
preamble), prefilled once for the whole chunk instead of once per prompt.

SGLang's RadixAttention and vLLM's automatic prefix caching keep such prefixes' KV blocks across
requests; here the sharing is within one batch: the prefix's keys and values are computed on one
row, copied to every prompt's row, and each prompt's own tokens are prefilled after them. The
layout of a row is then [shared prefix | left padding | the prompt's own tokens], the padding
masked out and the position ids counted over the real tokens only, so every token sees exactly
the context and positions of the plain left-padded layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlhfkit.rollout.kv_cache import repeat_rows

# Fewest shared tokens worth a separate forward (below it the saved compute is under a forward's overhead).
MIN_SHARED_TOKENS = 8


def shared_prefix_length(prompts: Sequence[Sequence[int]], minimum: int = MIN_SHARED_TOKENS) -> int:
    """Tokens at the start of every prompt of `prompts` (each keeps at least its last token of its
    own: its first logits come from its own forward); 0 for one prompt or fewer than `minimum`."""
    if len(prompts) < 2:
        return 0
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= minimum else 0


def prefill_shared(forward: Callable, prompts: Sequence[Sequence[int]], shared: int, cache, pad_id: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill `prompts` (U of them) whose first `shared` tokens are equal: those on one row, the
    cache's rows then repeated U times, then each prompt's own tokens, left-padded after the prefix.
    `forward(input_ids, attention_mask, position_ids, cache)` runs the model and returns the last
    position's logits. Returns (logits [U, V], attention_mask [U, W], position_ids [U, W]) over the
    rows' whole width W = shared + the longest own part."""
    prefix = torch.tensor([list(prompts[0][:shared])], dtype=torch.long, device=device)
    forward(prefix, torch.ones_like(prefix), torch.arange(shared, device=device).unsqueeze(0), cache)
    repeat_rows(cache, len(prompts))
    own = [list(p[shared:]) for p in prompts]
    return prefill_after(forward, own, torch.ones((len(own), shared), dtype=torch.long, device=device), cache,
                         pad_id, device)


def prefill_after(forward: Callable, own: Sequence[Sequence[int]], cache_mask: torch.Tensor, cache, pad_id: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefill each row's `own` tokens, left-padded, after the keys and values `cache` already holds
    (`cache_mask` [U, C]: which of its C columns are real tokens). Returns (logits [U, V],
    attention_mask [U, C + W], position_ids [U, C + W]), W the longest own part; the positions count
    real tokens only, so each token has the position it has in the plain left-padded layout."""
    width = max(len(p) for p in own)
    ids = torch.full((len(own), width), pad_id, dtype=torch.long)
    own_mask = torch.zeros((len(own), width), dtype=torch.long)
    for i, p in enumerate(own):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        own_mask[i, width - len(p):] = 1
    ids, own_mask = ids.to(device), own_mask.to(device)
    mask = torch.cat([cache_mask, own_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = forward(ids, mask, positions[:, cache_mask.shape[1]:], cache)
    return logits, mask, positions
