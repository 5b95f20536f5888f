"""Sampling one token per row from logits, as the HF engine does it: temperature, top-k / top-p
truncation, the logprob before truncation, and seeded draws (one generator per prompt, a chunk's
uniforms drawn at once); and the check of a generation request's parameters (shared by the engines)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rlhfkit.errors import ConfigError
from rlhfkit.rollout.base import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, u=None,
           banned: torch.Tensor | None = None, seen: torch.Tensor | None = None, allowed: torch.Tensor | None = None):
    """logits [B, V] float32 -> (tokens [B], logprobs [B]).

    The logprob is log_softmax(logits / T) at the token, before top-k/top-p truncation;
    T = 0 is greedy, with the logprob taken at T = 1. `u` [B] (on the logits' device): the rows'
    uniforms, else they are drawn from `generator` (and copied to the logits' device). `banned`:
    token ids never sampled (a truncation like top-k: the logprob is still the untruncated one).
    `seen` [B, V] bool: the tokens each row's prompt and response hold so far, whose logits
    `params.repetition_penalty` penalises in the choice (the logprob is still the model's). `allowed` [B, V]
    bool: per row the tokens it may take (a grammar's, rollout.constrained), a truncation too; a row that may
    take every token (an unconstrained row beside constrained ones) is sampled as without `allowed`, bit for bit.
    """
    if allowed is not None:
        free = allowed.all(dim=-1)
        if bool(free.all()):
            allowed = None
        elif bool(free.any()):
            return _sample_split(logits, params, generator, u, banned, seen, allowed, free)
    choose = logits if banned is None else logits.index_fill(-1, banned.to(logits.device), -math.inf)
    if allowed is not None:
        choose = choose.masked_fill(~allowed, -math.inf)
    altered = banned is not None or allowed is not None  # the choice is made from other logits than the logprob's
    if seen is not None and params.repetition_penalty != 1.0:
        choose, altered = penalize_repeats(choose, seen, params.repetition_penalty), True
    if params.temperature == 0:
        tok = choose.argmax(dim=-1)
        return tok, torch.log_softmax(logits, dim=-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    scaled = logits / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    truncated = params.top_k > 0 or params.top_p < 1.0 or altered
    scaled_choice = choose / params.temperature if altered else scaled
    probs = torch.softmax(truncate(scaled_choice, params.top_k, params.top_p), dim=-1) if truncated else logp.exp()
    tok = inverse_cdf(probs, _uniforms(u, probs.shape[0], generator, probs.device))
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)


def _uniforms(u, rows: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """`u`, or `rows` uniforms drawn from `generator` (on its device) and moved to `device`."""
    if u is not None:
        return u
    return torch.rand(rows, generator=generator, device=generator.device if generator is not None else "cpu").to(device)


def _sample_split(logits, params, generator, u, banned, seen, allowed, free):
    """`sample` of a batch whose rows `free` [B] take every token and whose others are masked by `allowed`: each
    part sampled on its own (the uniforms drawn once for the whole batch first, as `sample` draws them), so the
    free rows get exactly the tokens a batch without `allowed` gives them (the masked path's softmax differs from
    exp(log_softmax) in the last bits, which can move a uniform across a boundary)."""
    u = None if params.temperature == 0 else _uniforms(u, logits.shape[0], generator, logits.device)
    tok = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    lp = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for rows, mask in ((free, None), (~free, allowed)):
        idx = rows.nonzero().squeeze(-1)
        t, lp[idx] = sample(logits[idx], params, generator, None if u is None else u[idx], banned,
                            None if seen is None else seen[idx], None if mask is None else mask[idx])
        tok[idx] = t
    return tok, lp


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One token per row of `probs` [B, V] from uniforms `u` [B] in [0, 1) (on the same device): the first token whose
    cumulative probability exceeds u * total; a zero-probability token is never picked. One
    uniform per row instead of torch.multinomial's V exponentials: on this CPU multinomial over
    [128, 49152] took ~130 ms per decode step, a third of it.

    In two levels: sums of blocks of `block` tokens (float32) and their float64 cumulative sum
    pick the block, then a float64 cumulative sum inside that block picks the token, kept on the
    block's nonzero tokens where the two sums round apart. A float64 cumsum of the whole [B, V]
    cost 7 ms per decode step (5% of a rollout); this reads the row once."""
    rows, vocab = probs.shape
    nblocks = -(-vocab // block)
    padded = probs if nblocks * block == vocab else torch.nn.functional.pad(probs, (0, nblocks * block - vocab))
    blocks = padded.view(rows, nblocks, block)
    cdf = blocks.sum(dim=-1).double().cumsum(dim=-1)  # [B, nblocks]
    total = cdf[:, -1]  # NaN/inf anywhere reaches it (and the token's logprob, which the loop checks)
    x = (u.double() * total).unsqueeze(-1)
    b = torch.searchsorted(cdf, x, right=True).clamp(max=nblocks - 1)  # [B, 1]; a zero block is never picked
    before = torch.where(b > 0, cdf.gather(-1, (b - 1).clamp(min=0)), 0.0)
    inside = blocks[torch.arange(rows, device=probs.device), b.squeeze(-1)]  # [B, block]
    j = torch.searchsorted(before + inside.double().cumsum(dim=-1), x, right=True)
    index = torch.arange(block, device=probs.device)
    first = torch.where(inside > 0, index, block).amin(dim=-1, keepdim=True)
    last = torch.where(inside > 0, index, -1).amax(dim=-1, keepdim=True)
    return (b * block + torch.minimum(torch.maximum(j, first), last)).squeeze(-1).clamp(0, vocab - 1)


def check_finite(finite: torch.Tensor) -> None:
    """Raise where a sampled token's logprob was NaN/inf (`finite`: a bool scalar on the device)."""
    if not bool(finite):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0 (no token can be sampled)")


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def chunk_uniforms(gens: list[torch.Generator], max_new: int, n: int) -> torch.Tensor:
    """Every uniform a chunk's rows may use: [prompts, max_new, n] (CPU), entry [p, t, s] for sample s of
    prompt p at decode step t, drawn from prompt p's generator in the order (t, s). A row's draws do not
    depend on when its siblings finished or were dropped from the batch, and are the values the
    per-step draws of n uniforms gave (torch.rand on a CPU generator fills its values in order), so the
    samples are the same; drawn once per chunk and copied to the device once, the decode loop does not
    wait for the device at every token to copy a step's uniforms."""
    return torch.stack([torch.rand(max_new * n, generator=g).view(max_new, n) for g in gens])


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty on logits [B, V]: where `seen` [B, V], a logit x becomes x / penalty
    if x > 0, else x * penalty (so penalty > 1 makes the token less likely either way)."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def seen_tokens(rows: Sequence[Sequence[int]], vocab: int, device) -> torch.Tensor:
    """[len(rows), vocab] bool: True at each token id a row holds."""
    seen = torch.zeros(len(rows), vocab, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        seen[i, torch.tensor(list(row), dtype=torch.long, device=device)] = True
    return seen


def truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf. [B, V] -> [B, V]."""
    if top_k > 0 and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the top one stays).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, -math.inf)
    return scaled


def check_params(params: SamplingParams, prompts: Sequence[Sequence[int]], group_ids) -> None:
    if params.n < 1 or params.max_new_tokens < 1:
        raise ConfigError(f"SamplingParams needs n >= 1 and max_new_tokens >= 1, got {params}")
    if params.temperature < 0 or not 0 < params.top_p <= 1 or not params.repetition_penalty > 0:
        raise ConfigError(f"SamplingParams needs temperature >= 0, 0 < top_p <= 1 and repetition_penalty > 0, "
                          f"got {params}")
    if any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token (got an empty prompt)")
    if group_ids is not None and len(group_ids) != len(prompts):
        raise ConfigError(f"group_ids has {len(group_ids)} entries for {len(prompts)} prompts")
