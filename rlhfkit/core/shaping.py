"""Reward shaping of scalar rewards before advantage estimation: DAPO's overlong penalty, ProRL's
stop-properly penalty."""

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


def stop_properly_penalty(rewards: torch.Tensor, truncated: torch.Tensor, coef: float) -> torch.Tensor:
    """ProRL v2's stop-properly penalty, as OpenRLHF applies it (`--reward.stop_properly_penalty_coef`).

    A sample that did not stop properly (``truncated``: cut at the token budget, finish reason
    "length") gets ``reward * coef`` when ``0 <= coef <= 1`` (0: no reward for an unfinished
    answer), or the reward ``coef`` itself when ``coef < 0`` (a fixed penalty, e.g. -0.5);
    the other samples keep theirs. Example (coef 0.5): rewards [1, 1, -0.4], truncated
    [False, True, True] -> [1, 0.5, -0.2]; coef -0.5 -> [1, -0.5, -0.5].

    Args:
        rewards: ``[B]`` float rewards (after any overlong penalty, as OpenRLHF orders them).
        truncated: ``[B]`` bool, True = the sample did not stop properly.
        coef: ``<= 1``.

    Returns:
        ``[B]`` float, the penalised rewards.
    """
    if not coef <= 1:
        raise ValueError(f"stop_properly_penalty: need coef <= 1 (in [0, 1] or negative), got {coef}")
    penalised = torch.full_like(rewards, coef) if coef < 0 else rewards * coef
    return torch.where(truncated, penalised, rewards)
