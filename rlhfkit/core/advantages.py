"""Advantage estimators: token rewards, returns, GAE, group baselines, one entry point.

``compute_advantages`` reproduces OpenRLHF's experience maker (``compute_advantages_and_
returns``) number for number at action tokens, in its order of operations:

1. group shaping of the scalar rewards (RLOO / mean / group-norm baseline);
2. reward clipping of the shaped reward;
3. token rewards: ``-kl_coef * kl`` on every action token, the scalar on the last one
   (and optional dense per-token rewards, e.g. process rewards, on action tokens);
4. GAE, or discounted returns used as advantages (gamma forced to 1 for group estimators);
5. batch whitening of the advantages for ``gae``, ``reinforce`` and ``reinforce_baseline``.

Each estimator is one ``EstimatorSpec`` in ``ESTIMATORS`` (its baseline, whether gamma is
forced to 1, whether it whitens, whether it needs a critic); callers read those properties
instead of comparing names.

Departure: advantages are 0 wherever ``loss_mask`` is False (OpenRLHF leaves values there).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

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
    rewards: torch.Tensor,
    kl: torch.Tensor | None,
    kl_coef: float,
    loss_mask: torch.Tensor,
    dense_rewards: torch.Tensor | None = None,
) -> torch.Tensor:
    """Spread scalar rewards over tokens, with a per-token KL penalty and dense rewards.

    ``out[b, t] = -kl_coef * kl[b, t]`` on action tokens, plus ``rewards[b]`` on the last
    action token of row b (last True of ``loss_mask``), plus ``dense_rewards[b, t]`` on
    every action token; 0 where ``loss_mask`` is False.
    The KL-shaped reward of Ziegler et al. 2019 (arXiv:1909.08593) and Stiennon et al. 2020
    (arXiv:2009.01325), as OpenRLHF's ``compute_reward``. Departures: zeros outside the mask
    (OpenRLHF keeps ``-kl_coef * kl`` there; its GAE and returns mask it away anyway), and
    ``kl_coef < 0`` is an error rather than silently treated as 0. A row with no action token
    gets no reward at all.

    ``dense_rewards`` are per-token rewards given during the response, e.g. the process
    rewards of a process reward model placed at the last token of each reasoning step
    (Lightman et al. 2023, arXiv:2305.20050; used as dense RL rewards by PRIME, Cui et al.
    2025, arXiv:2502.01456). They are added as given (0 where there is none); values at
    positions where ``loss_mask`` is False are dropped. OpenRLHF has no such input.

    Args:
        rewards: ``[B]`` scalar reward per sequence.
        kl: ``[B, T]`` per-token KL estimate, or None for no penalty.
        kl_coef: non-negative penalty coefficient.
        loss_mask: ``[B, T]`` bool, True = action token.
        dense_rewards: ``[B, T]`` per-token rewards added at action tokens, or None.

    Returns:
        ``[B, T]`` float token rewards.
    """
    _check_kl_coef(kl_coef)
    if dense_rewards is not None and dense_rewards.shape != loss_mask.shape:
        raise ValueError(
            f"dense_rewards shape {tuple(dense_rewards.shape)} != loss_mask shape "
            f"{tuple(loss_mask.shape)}: pass one reward per token [B, T] (0 where there is none)"
        )
    rewards = _as_float(rewards)
    dtype = rewards.dtype if kl is None else torch.promote_types(rewards.dtype, kl.dtype)
    if dense_rewards is not None:
        dtype = torch.promote_types(dtype, _as_float(dense_rewards).dtype)
    T = loss_mask.shape[-1]
    out = torch.zeros(loss_mask.shape, dtype=dtype, device=loss_mask.device)
    if kl is not None and kl_coef != 0:
        out = out - kl_coef * kl.to(dtype)
    last = T - 1 - loss_mask.long().flip(-1).argmax(dim=-1, keepdim=True)  # [B, 1]
    out = out.scatter_add(-1, last, rewards.to(dtype).unsqueeze(-1))
    if dense_rewards is not None:
        out = out + dense_rewards.to(dtype)
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


def _baseline_batch_std(scores, group_ids):
    dev = _baseline_mean(scores, group_ids)
    if scores.numel() < 2 or bool((scores == scores[0]).all()):
        return torch.zeros_like(dev)  # one score, or all equal: exactly 0 (as group_norm's flat groups)
    return dev / (scores.std() + 1e-9)  # unbiased, over the whole batch


GROUP_BASELINES = {
    "none": _baseline_none,
    "mean": _baseline_mean,
    "rloo": _baseline_rloo,
    "group_norm": _baseline_group_norm,
    "batch_std": _baseline_batch_std,
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
    - ``batch_std``: ``(r - mean_g) / (std + 1e-9)`` with the unbiased std of all the batch's
      scores (the group's mean, the batch's std: Liu et al. 2025, "Tricks or Traps?",
      arXiv:2508.08221; TRL's ``scale_rewards="batch"``); all scores equal: exactly 0.
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


def episode_baseline(scores: torch.Tensor, group_ids: torch.Tensor | None, episode_ids: torch.Tensor | None,
                     method: str) -> torch.Tensor:
    """``group_baseline`` with each episode counted once: the baseline is computed over the first
    row of every episode id and each row gets its episode's shaped score (the first row's reward
    stands for the episode; its segments carry the same one unless per-row shaping such as an
    overlong penalty changed them). ``episode_ids`` None: ``group_baseline`` itself.

    Args:
        scores: ``[B]`` scalar rewards.
        group_ids: ``[B]`` group label per sample (may be None for ``none``).
        episode_ids: ``[B]`` episode label per sample, or None.
        method: one of ``GROUP_BASELINES``.

    Returns:
        ``[B]`` shaped scores (float).
    """
    if episode_ids is None:
        return group_baseline(scores, group_ids, method)
    if episode_ids.shape != scores.shape:
        raise ValueError(f"episode_ids shape {tuple(episode_ids.shape)} != scores shape {tuple(scores.shape)}")
    _, inverse = torch.unique(episode_ids, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), scores.numel(), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(scores.numel()), reduce="amin")
    shaped = group_baseline(scores[first], None if group_ids is None else group_ids[first], method)
    return shaped[inverse]


# ---------------------------------------------------------------- the entry point

@dataclass(frozen=True, kw_only=True)
class EstimatorSpec:
    """What ``compute_advantages`` does for one advantage estimator (an entry of ``ESTIMATORS``).

    Attributes:
        baseline: group baseline subtracted from the scalar rewards, a key of
            ``GROUP_BASELINES`` (``"none"``: each sample on its own).
        force_gamma_one: discount with gamma 1 whatever gamma the caller passes (OpenRLHF
            does so for its group estimators).
        whiten: whiten the advantages over all action tokens of the batch, as the
            ``whiten`` argument of ``compute_advantages`` says (mean and std, mean only, or
            not at all); False: that argument is ignored.
        needs_critic: GAE with the critic's ``values [B, T]``; False: discounted returns
            are the advantages.
        doc: one line for people: what the estimator is and where it comes from.
    """

    baseline: str
    force_gamma_one: bool
    whiten: bool
    needs_critic: bool
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        lookup(GROUP_BASELINES, self.baseline, "group baseline")

    @property
    def grouped(self) -> bool:
        """True when the estimator compares the samples of one prompt (needs ``group_ids``)."""
        return self.baseline != "none"


ESTIMATORS: dict[str, EstimatorSpec] = {
    "gae": EstimatorSpec(
        baseline="none", force_gamma_one=False, whiten=True, needs_critic=True,
        doc="PPO's GAE with a critic (Schulman et al. 2015, arXiv:1506.02438; 2017, arXiv:1707.06347)",
    ),
    "reinforce": EstimatorSpec(
        baseline="none", force_gamma_one=False, whiten=True, needs_critic=False,
        doc="REINFORCE++: returns whitened over the batch (Hu 2025, arXiv:2501.03262)",
    ),
    "reinforce_baseline": EstimatorSpec(
        baseline="mean", force_gamma_one=True, whiten=True, needs_critic=False,
        doc="REINFORCE++-baseline: group mean subtracted, then whitened (Hu 2025, arXiv:2501.03262)",
    ),
    "rloo": EstimatorSpec(
        baseline="rloo", force_gamma_one=True, whiten=False, needs_critic=False,
        doc="RLOO: leave-one-out group baseline (Ahmadian et al. 2024, arXiv:2402.14740)",
    ),
    "group_norm": EstimatorSpec(
        baseline="group_norm", force_gamma_one=True, whiten=False, needs_critic=False,
        doc="GRPO: group mean and std (Shao et al. 2024, arXiv:2402.03300)",
    ),
    "dr_grpo": EstimatorSpec(
        baseline="mean", force_gamma_one=True, whiten=False, needs_critic=False,
        doc="Dr. GRPO: group mean, no std (Liu et al. 2025, arXiv:2503.20783)",
    ),
    "group_mean_batch_std": EstimatorSpec(
        baseline="batch_std", force_gamma_one=True, whiten=False, needs_critic=False,
        doc="the group's mean, the batch's std (Liu et al. 2025, arXiv:2508.08221; TRL scale_rewards='batch')",
    ),
}

class Whiten(str, enum.Enum):
    """How a whitening estimator's advantages are normalised over the batch's action tokens: TRUE mean
    and std, MEAN the mean only (OpenRLHF's ``no_advantage_std_norm``), FALSE none. The values are
    the spellings of ``--algo.advantage.whiten``."""

    TRUE = "true"
    MEAN = "mean"
    FALSE = "false"

    @classmethod
    def of(cls, value: Whiten | str | bool) -> Whiten:
        """A member, its value, or a bool (True: TRUE, False: FALSE); ValueError otherwise."""
        if isinstance(value, bool):
            return cls.TRUE if value else cls.FALSE
        if isinstance(value, str) and value in cls._value2member_map_:
            return cls(value)
        raise ValueError(f"whiten must be one of {[w.value for w in cls]}, True or False, got {value!r}")


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
    whiten: Whiten | str | bool = Whiten.TRUE,
    reward_clip: tuple[float, float] | None = None,
    dense_rewards: torch.Tensor | None = None,
    episode_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns for one batch, as OpenRLHF's experience maker computes them.

    Estimators (``ESTIMATORS``, one ``EstimatorSpec`` each): ``gae`` (PPO, Schulman et al.
    2017, arXiv:1707.06347; needs ``values``), ``reinforce`` (REINFORCE++, Hu 2025,
    arXiv:2501.03262), ``reinforce_baseline`` (REINFORCE++-baseline: group mean subtracted),
    ``rloo`` (Ahmadian et al. 2024, arXiv:2402.14740), ``group_norm`` (GRPO, Shao et al. 2024,
    arXiv:2402.03300), ``dr_grpo`` (Liu et al. 2025, arXiv:2503.20783: mean, no std).

    Order, each step read from the estimator's spec: group shaping with ``spec.baseline`` ->
    ``reward_clip`` of the shaped reward -> token rewards with ``-kl_coef * kl``, the shaped
    scalar on the last action token and ``dense_rewards`` on action tokens -> GAE when
    ``spec.needs_critic``, else discounted returns as advantages (gamma 1 when
    ``spec.force_gamma_one``: the group estimators, as OpenRLHF does) -> when ``spec.whiten``
    (``gae``, ``reinforce``, ``reinforce_baseline``), whitening over all action tokens of the
    batch as ``whiten`` says (``Whiten``: TRUE mean and std; MEAN mean only, OpenRLHF's
    ``no_advantage_std_norm``; FALSE none). The other estimators ignore ``whiten``.

    Departures from OpenRLHF: advantages are 0 where ``loss_mask`` is False; the whole batch
    is passed at once (OpenRLHF whitens across its micro-batches, which is the same set of
    tokens); gamma is forced locally, never by mutating shared settings; ``kl_coef < 0`` is a
    configuration error (OpenRLHF treats it as 0). Returns equal OpenRLHF's at every position.

    ``dense_rewards`` (not in OpenRLHF): per-token rewards, e.g. process rewards from a
    process reward model at the ends of reasoning steps (Lightman et al. 2023,
    arXiv:2305.20050; PRIME, Cui et al. 2025, arXiv:2502.01456). They are added to the token
    rewards as given: neither group-shaped nor clipped (shape or clip them before, if
    wanted), then discounted, fed to GAE and whitened like the rest.

    Args:
        estimator: one of ``ESTIMATORS``.
        rewards: ``[B]`` scalar reward per sequence.
        loss_mask: ``[B, T]`` bool, True = action token.
        group_ids: ``[B]`` long group label (prompt id); may be None when the spec is not
            ``grouped`` (gae, reinforce).
        gamma, lam: discount and GAE lambda.
        values: ``[B, T]`` critic values (read when the spec ``needs_critic``: gae).
        kl: ``[B, T]`` per-token KL estimate, or None.
        kl_coef: non-negative KL penalty coefficient.
        whiten: a ``Whiten`` (or its value; True and False stand for TRUE and FALSE).
        reward_clip: ``(low, high)`` bounds for the shaped scalar reward, or None.
        dense_rewards: ``[B, T]`` per-token rewards added at action tokens, or None.
        episode_ids: ``[B]`` long: rows with the same id are segments of one episode (an agent
            that rewrote its history) and share its reward; the group baseline counts each
            episode once (its first row), and every segment gets the episode's shaped reward.
            None: every row is its own episode.

    Returns:
        ``(advantages [B, T], returns [B, T])``, float, detached.
    """
    spec = lookup(ESTIMATORS, estimator, "advantage estimator")
    _check_kl_coef(kl_coef)
    if spec.needs_critic and values is None:
        raise ValueError(f"compute_advantages({estimator!r}) needs values [B, T] from the critic")
    whiten = Whiten.of(whiten)
    gamma = 1.0 if spec.force_gamma_one else gamma

    with torch.no_grad():
        shaped = episode_baseline(rewards, group_ids, episode_ids, spec.baseline)
        if reward_clip is not None:
            shaped = shaped.clamp(min=reward_clip[0], max=reward_clip[1])
        per_token = token_rewards(shaped, kl, kl_coef, loss_mask, dense_rewards)
        if spec.needs_critic and values is not None:  # a critic's spec always has values: checked above
            advantages, returns = gae(per_token, values, loss_mask, gamma, lam)
        else:
            returns = discounted_returns(per_token, loss_mask, gamma)
            advantages = returns.clone()
        if spec.whiten and whiten is Whiten.TRUE:
            advantages = masked_whiten(advantages, loss_mask)
        elif spec.whiten and whiten is Whiten.MEAN:
            advantages = advantages - masked_mean(advantages, loss_mask)
        advantages = torch.where(loss_mask, advantages, torch.zeros_like(advantages))
    return advantages, returns
