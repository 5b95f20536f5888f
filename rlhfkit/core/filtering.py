"""DAPO dynamic sampling's group filter (Yu et al. 2025, arXiv:2503.14476, section 3.2)."""

from __future__ import annotations

import torch


def keep_groups_in_range(group_ids: torch.Tensor, scores: torch.Tensor, low: float, high: float):
    """Keep the samples of groups whose mean score lies strictly inside (low, high).

    DAPO drops groups whose accuracy is 0 or 1 (no group-relative signal); with 0/1 scores and
    (low, high) = (0, 1) this is exactly that. Example: group_ids [0,0,1,1], scores
    [1,1,0,1], range (0, 1) -> group 0 (mean 1) dropped, group 1 (mean 0.5) kept.

    Args:
      group_ids: LongTensor [B], the prompt each sample answers.
      scores: FloatTensor [B].
      low, high: the open interval a group's mean score must fall in.

    Returns:
      (keep BoolTensor [B], number of dropped groups as an int).
    """
    uniq, inverse = group_ids.unique(return_inverse=True)
    sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, scores.double())
    counts = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse,
                                                                    torch.ones_like(scores, dtype=torch.float64))
    means = sums / counts
    group_ok = (means > low) & (means < high)
    return group_ok[inverse], int((~group_ok).sum())
