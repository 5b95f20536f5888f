"""Named loss aggregation modes (token mean, sequence means, Dr. GRPO's constant norm).

The mode decides how a per-token loss ``[B, T]`` becomes one scalar. The optional global
counts make the result independent of how the optimizer-step batch is split: the loss of
each micro-batch, computed with the counts of the *whole* step, summed over micro-batches,
equals the loss of the whole step computed at once. With data parallelism pass the global
count divided by the world size (gradients are averaged across ranks).
"""

import torch

from rlhfkit.core.masks import masked_sum
from rlhfkit.core.tables import lookup


def _token_mean(per_token, loss_mask, num_tokens, num_seqs, max_len):
    total = masked_sum(per_token, loss_mask)
    if num_tokens is None:
        num_tokens = loss_mask.sum().clamp(min=1)
    return total / num_tokens


def _seq_reduce(per_seq: torch.Tensor, loss_mask: torch.Tensor, num_seqs) -> torch.Tensor:
    """Average per-sequence values ``[B]``: over ``num_seqs`` if given, else over live rows."""
    if num_seqs is None:
        live = loss_mask.any(dim=-1)
        return masked_sum(per_seq, live) / live.sum().clamp(min=1)
    return per_seq.sum() / num_seqs


def _seq_mean_token_mean(per_token, loss_mask, num_tokens, num_seqs, max_len):
    counts = loss_mask.sum(dim=-1).clamp(min=1)
    return _seq_reduce(masked_sum(per_token, loss_mask, dim=-1) / counts, loss_mask, num_seqs)


def _seq_mean_token_sum(per_token, loss_mask, num_tokens, num_seqs, max_len):
    return _seq_reduce(masked_sum(per_token, loss_mask, dim=-1), loss_mask, num_seqs)


def _seq_mean_token_sum_norm(per_token, loss_mask, num_tokens, num_seqs, max_len):
    if max_len is None:
        max_len = loss_mask.shape[-1]
    if max_len <= 0:
        raise ValueError(f"aggregate_loss: max_len must be positive, got {max_len}")
    per_seq = masked_sum(per_token, loss_mask, dim=-1) / max_len
    return _seq_reduce(per_seq, loss_mask, num_seqs)


AGGREGATIONS = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum": _seq_mean_token_sum,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}


def aggregate_loss(
    per_token: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with a named aggregation mode.

    Modes (``s_b`` = masked token sum of row b, ``n_b`` = its counted tokens):

    - ``token_mean``: ``sum_b s_b / N``; ``N = num_tokens`` or the mask count (0 if none).
      PPO as in most implementations (OpenRLHF ``token_level_loss=True``); DAPO
      (Yu et al. 2025, arXiv:2503.14476) argues for it on long reasoning traces.
    - ``seq_mean_token_mean``: mean over sequences of ``s_b / n_b`` (GRPO, Shao et al. 2024,
      arXiv:2402.03300; OpenRLHF ``token_level_loss=False``).
    - ``seq_mean_token_sum``: mean over sequences of ``s_b``.
    - ``seq_mean_token_sum_norm``: mean over sequences of ``s_b / max_len`` with a constant
      ``max_len`` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783). Default
      ``loss_mask.shape[-1]``, which changes with padding; pass ``max_new_tokens`` to make it
      micro-batch invariant.

    The sequence modes divide the sum over sequences by ``num_seqs`` when given; without it
    they average over the sequences with at least one counted token. For the micro-batch
    invariance pass ``num_seqs`` = number of such sequences in the whole step.

    Args:
        per_token: ``[B, T]`` loss per token.
        loss_mask: ``[B, T]`` bool, True = counts.
        mode: one of ``AGGREGATIONS``.
        num_tokens: global counted-token count for ``token_mean`` (per rank under DP).
        num_seqs: global sequence count for the sequence modes (per rank under DP).
        max_len: constant divisor for ``seq_mean_token_sum_norm``.

    Returns:
        Scalar tensor.
    """
    return lookup(AGGREGATIONS, mode, "aggregation mode")(per_token, loss_mask, num_tokens, num_seqs, max_len)
