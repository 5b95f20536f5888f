"""Reward shaping terms added to scalar rewards before advantage estimation."""

import torch


def overlong_penalty(
    response_lengths: torch.Tensor, max_new_tokens: int, buffer_len: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13).

    ``exceed = L - (max_new_tokens - buffer_len)``; the penalty is
    ``-min(exceed, buffer_len) / buffer_len * factor`` where ``exceed > 0``, else 0. The
    paper's penalty is -1 beyond ``max_new_tokens``; capping ``exceed`` at ``buffer_len``
    gives the same (``-factor``), as OpenRLHF does. Example (max_new_tokens=20, buffer 4,
    factor 1): L=16 -> 0, L=18 -> -0.5, L=25 -> -1.

    Args:
        response_lengths: ``[B]`` response lengths in tokens.
        max_new_tokens: generation budget.
        buffer_len: length of the linear-penalty zone, ``0 < buffer_len <= max_new_tokens``.
        factor: penalty at the end of the buffer.

    Returns:
        ``[B]`` float, non-positive amounts to add to the rewards.
    """
    if not 0 < buffer_len <= max_new_tokens:
        raise ValueError(
            f"overlong_penalty: need 0 < buffer_len <= max_new_tokens, got {buffer_len}, {max_new_tokens}"
        )
    lengths = response_lengths if response_lengths.is_floating_point() else response_lengths.float()
    exceed = lengths - (max_new_tokens - buffer_len)
    penalty = -exceed.clamp(max=buffer_len) / buffer_len * factor
    return torch.where(exceed > 0, penalty, torch.zeros_like(penalty))
