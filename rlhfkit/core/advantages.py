"""Advantage estimators: token rewards, returns, GAE, group baselines, one entry point.

``compute_advantages`` reproduces OpenRLHF's experience maker (``compute_advantages_and_
returns``) number for number at action tokens, in its order of operations:

1. group shaping of the scalar rewards (RLOO / mean / group-norm baseline);
2. reward clipping of the shaped reward;
3. token rewards: ``-kl_coef * kl`` on every action token, the scalar on the last one;
4. GAE, or discounted returns used as advantages (gamma forced to 1 for group estimators);
5. batch whitening of the advantages for ``gae``, ``reinforce`` and ``reinforce_baseline``.

Departure: advantages are 0 wherever ``loss_mask`` is False (OpenRLHF leaves values there).
"""

import torch

from rlhfkit.core.masks import masked_mean, masked_whiten
from rlhfkit.core.tables import lookup


def _as_float(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_floating_point() else t.float()


def _check_kl_coef(kl_coef: float) -> None:
    if kl_coef < 0:
        raise ValueError(
            f"configuration error: kl_coef must be >= 0, got {kl_coef} "
            "(a negative coefficient would reward drifting from the reference)"
        )


def token_rewards(
    rewards: torch.Tensor, kl: torch.Tensor | None, kl_coef: float, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Spread scalar rewards over tokens, with a per-token KL penalty.

    ``out[b, t] = -kl_coef * kl[b, t]`` on action tokens, plus ``rewards[b]`` on the last
    action token of row b (last True of ``loss_mask``); 0 where ``loss_mask`` is False.
    The KL-shaped reward of Ziegler et al. 2019 (arXiv:1909.08593) and Stiennon et al. 2020
    (arXiv:2009.01325), as OpenRLHF's ``compute_reward``. Departures: zeros outside the mask
    (OpenRLHF keeps ``-kl_coef * kl`` there; its GAE and returns mask it away anyway), and
    ``kl_coef < 0`` is an error rather than silently treated as 0. A row with no action token
    gets no reward at all.

    Args:
        rewards: ``[B]`` scalar reward per sequence.
        kl: ``[B, T]`` per-token KL estimate, or None for no penalty.
        kl_coef: non-negative penalty coefficient.
        loss_mask: ``[B, T]`` bool, True = action token.

    Returns:
        ``[B, T]`` float token rewards.
    """
    _check_kl_coef(kl_coef)
    rewards = _as_float(rewards)
    dtype = rewards.dtype if kl is None else torch.promote_types(rewards.dtype, kl.dtype)
    T = loss_mask.shape[-1]
    out = torch.zeros(loss_mask.shape, dtype=dtype, device=loss_mask.device)
    if kl is not None and kl_coef != 0:
        out = out - kl_coef * kl.to(dtype)
    last = T - 1 - loss_mask.long().flip(-1).argmax(dim=-1, keepdim=True)  # [B, 1]
    out = out.scatter_add(-1, last, rewards.to(dtype).unsqueeze(-1))
    return torch.where(loss_mask, out, torch.zeros((), dtype=dtype, device=out.device))


def discounted_returns(rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go ``G_t = r_t + gamma * G_{t+1}`` (``G_T = 0``).

    REINFORCE returns (Williams 1992) as OpenRLHF's ``get_cumulative_returns``: rewards at
    masked positions count as 0, but every position is a time step, so a multi-turn hole
    (environment tokens inside a response) still discounts. Example: token rewards
    ``[0, 0, 3]`` with ``gamma = 0.9`` give ``[2.43, 2.7, 3.0]``.

    Args:
        rewards: ``[B, T]`` token rewards.
        loss_mask: ``[B, T]`` bool, True = action token.
        gamma: discount factor.

    Returns:
        ``[B, T]`` returns (at masked positions: the discounted future, as OpenRLHF).
    """
    rewards = torch.where(loss_mask, _as_float(rewards), 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def gae(
    rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2015, arXiv:1506.02438).

    Rewards and values are first zeroed outside the mask (holes: reward 0, value 0), then
    ``delta_t = r_t + gamma * V_{t+1} - V_t`` with ``V_T = 0``,
    ``A_t = delta_t + gamma * lam * A_{t+1}``, ``returns = A + V``. Same as OpenRLHF's
    ``get_advantages_and_returns``: every position is a time step, so no bootstrap jumps
    over a hole.

    Args:
        rewards: ``[B, T]`` token rewards.
        values: ``[B, T]`` critic values.
        loss_mask: ``[B, T]`` bool, True = action token.
        gamma: discount factor.
        lam: GAE lambda.

    Returns:
        ``(advantages [B, T], returns [B, T])``, both detached.
    """
    rewards = torch.where(loss_mask, _as_float(rewards), 0.0).detach()
    values = torch.where(loss_mask, _as_float(values), 0.0).detach()
    T = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    return advantages, advantages + values


# ---------------------------------------------------------------- group baselines


def _group_stats(scores: torch.Tensor, group_ids: torch.Tensor):
    """Per-member group size, sum and inverse index, for arbitrary ids in any order."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    size = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    size = size.index_add(0, inverse, torch.ones_like(scores))
    total = torch.zeros_like(size).index_add(0, inverse, scores)
    return inverse, size, total


def _baseline_none(scores, group_ids):
    return scores.clone()


def _baseline_mean(scores, group_ids):
    inverse, size, total = _group_stats(scores, group_ids)
    return scores - (total / size)[inverse]


def _baseline_rloo(scores, group_ids):
    inverse, size, total = _group_stats(scores, group_ids)
    if bool((size < 2).any()):
        raise ValueError("group_baseline('rloo'): every group needs at least 2 samples")
    return scores - (total[inverse] - scores) / (size[inverse] - 1)


def _baseline_group_norm(scores, group_ids):
    inverse, size, total = _group_stats(scores, group_ids)
    dev = scores - (total / size)[inverse]
    sq = torch.zeros_like(size).index_add(0, inverse, dev * dev)
    std = (sq / (size - 1).clamp(min=1)).sqrt()  # unbiased, like torch.std
    hi = torch.full_like(size, float("-inf")).scatter_reduce(0, inverse, scores, "amax")
    lo = torch.full_like(size, float("inf")).scatter_reduce(0, inverse, scores, "amin")
    flat = (hi == lo)[inverse]  # all-equal group (includes size 1): exactly 0, no float noise
    return torch.where(flat, torch.zeros_like(dev), dev / (std[inverse] + 1e-9))


GROUP_BASELINES = {
    "none": _baseline_none,
    "mean": _baseline_mean,
    "rloo": _baseline_rloo,
    "group_norm": _baseline_group_norm,
}


def group_baseline(scores: torch.Tensor, group_ids: torch.Tensor | None, method: str) -> torch.Tensor:
    """Subtract a per-group baseline from scalar scores; groups given by explicit ids.

    - ``rloo``: ``r - (sum_g - r) / (n_g - 1)`` (leave-one-out; Kool et al. 2019,
      Ahmadian et al. 2024, arXiv:2402.14740). Groups of size 1 are an error.
    - ``mean``: ``r - mean_g`` (REINFORCE++-baseline, Hu 2025, arXiv:2501.03262; Dr. GRPO,
      Liu et al. 2025, arXiv:2503.20783).
    - ``group_norm``: ``(r - mean_g) / (std_g + 1e-9)`` with the unbiased std (GRPO, Shao et
      al. 2024, arXiv:2402.03300). Departure from OpenRLHF: every member of an all-equal
      group (and of a group of size 1) gets exactly 0; OpenRLHF can return float noise
      divided by ~1e-9 there, and NaN for size 1.
    - ``none``: a copy of the scores.

    ``group_ids`` are arbitrary integers in any order (never a ``view(-1, G)`` layout).

    Args:
        scores: ``[B]`` scalar rewards.
        group_ids: ``[B]`` long group label per sample (may be None for ``none``).
        method: one of ``GROUP_BASELINES``.

    Returns:
        ``[B]`` shaped scores (float).
    """
    shape = lookup(GROUP_BASELINES, method, "group baseline")
    if method != "none" and group_ids is None:
        raise ValueError(f"group_baseline({method!r}) needs group_ids [B]")
    if group_ids is not None and group_ids.shape != scores.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} != scores shape {tuple(scores.shape)}")
    return shape(_as_float(scores), group_ids)


# ---------------------------------------------------------------- the entry point

# name -> (group baseline, gamma forced to 1, advantages whitened over the batch)
ESTIMATORS = {
    "gae": ("none", False, True),
    "reinforce": ("none", False, True),
    "reinforce_baseline": ("mean", True, True),
    "rloo": ("rloo", True, False),
    "group_norm": ("group_norm", True, False),
    "dr_grpo": ("mean", True, False),
}

_WHITEN_CHOICES = (True, False, "mean")


def compute_advantages(
    estimator: str,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor | None,
    gamma: float = 1.0,
    lam: float = 1.0,
    values: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    whiten: bool | str = True,
    reward_clip: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns for one batch, as OpenRLHF's experience maker computes them.

    Estimators (``ESTIMATORS``): ``gae`` (PPO, Schulman et al. 2017, arXiv:1707.06347;
    needs ``values``), ``reinforce`` (REINFORCE++, Hu 2025, arXiv:2501.03262),
    ``reinforce_baseline`` (REINFORCE++-baseline: group mean subtracted), ``rloo``
    (Ahmadian et al. 2024, arXiv:2402.14740), ``group_norm`` (GRPO, Shao et al. 2024,
    arXiv:2402.03300), ``dr_grpo`` (Liu et al. 2025, arXiv:2503.20783: mean, no std).

    Order: group shaping -> ``reward_clip`` of the shaped reward -> token rewards with
    ``-kl_coef * kl`` -> GAE, or discounted returns as advantages (gamma forced to 1 for
    the group estimators, as OpenRLHF does) -> whitening over all action tokens of the batch
    for ``gae``, ``reinforce``, ``reinforce_baseline`` (``whiten=True``: mean and std;
    ``"mean"``: mean only, OpenRLHF's ``no_advantage_std_norm``; False: none). The other
    estimators ignore ``whiten``.

    Departures from OpenRLHF: advantages are 0 where ``loss_mask`` is False; the whole batch
    is passed at once (OpenRLHF whitens across its micro-batches, which is the same set of
    tokens); gamma is forced locally, never by mutating shared settings; ``kl_coef < 0`` is a
    configuration error (OpenRLHF treats it as 0). Returns equal OpenRLHF's at every position.

    Args:
        estimator: one of ``ESTIMATORS``.
        rewards: ``[B]`` scalar reward per sequence.
        loss_mask: ``[B, T]`` bool, True = action token.
        group_ids: ``[B]`` long group label (prompt id); may be None for gae / reinforce.
        gamma, lam: discount and GAE lambda.
        values: ``[B, T]`` critic values (gae only).
        kl: ``[B, T]`` per-token KL estimate, or None.
        kl_coef: non-negative KL penalty coefficient.
        whiten: True, False or ``"mean"``.
        reward_clip: ``(low, high)`` bounds for the shaped scalar reward, or None.

    Returns:
        ``(advantages [B, T], returns [B, T])``, float, detached.
    """
    baseline, force_gamma_one, whitens = lookup(ESTIMATORS, estimator, "advantage estimator")
    _check_kl_coef(kl_coef)
    if estimator == "gae" and values is None:
        raise ValueError("compute_advantages('gae') needs values [B, T] from the critic")
    if whiten not in _WHITEN_CHOICES or isinstance(whiten, int) and not isinstance(whiten, bool):
        raise ValueError(f"whiten must be one of {_WHITEN_CHOICES}, got {whiten!r}")

    with torch.no_grad():
        shaped = group_baseline(rewards, group_ids, baseline)
        if reward_clip is not None:
            shaped = shaped.clamp(min=reward_clip[0], max=reward_clip[1])
        per_token = token_rewards(shaped, kl, kl_coef, loss_mask)
        if estimator == "gae":
            advantages, returns = gae(per_token, values, loss_mask, gamma, lam)
        else:
            returns = discounted_returns(per_token, loss_mask, 1.0 if force_gamma_one else gamma)
            advantages = returns.clone()
        if whitens and whiten is True:
            advantages = masked_whiten(advantages, loss_mask)
        elif whitens and whiten == "mean":
            advantages = advantages - masked_mean(advantages, loss_mask)
        advantages = torch.where(loss_mask, advantages, torch.zeros_like(advantages))
    return advantages, returns
