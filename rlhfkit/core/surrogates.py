"""The policy losses other than the clipped surrogate: CISPO, SAPO, Clip-Cov, KL-Cov, GMPO and VESPO,
and the importance ratios they share with PPO / GSPO (``RATIO_LEVELS``).

Each loss has the signature of ``core.losses.policy_loss``: ``(logp, old_logp, advantages, loss_mask,
*, eps_low, eps_high, agg, is_weights, num_tokens, num_seqs, max_len, **its own options)`` with
``[B, T]`` tensors (``loss_mask`` bool, True = counts), and returns ``(loss, metrics)``; the metrics
always hold ``clip_frac``, ``approx_kl`` (masked mean of ``old_logp - logp``) and ``ratio_mean``, as
detached tensors. ``is_weights`` (detached) multiply the per-token loss before ``aggregate_loss``
reduces it with ``agg``. ``core.losses.POLICY_LOSSES`` names them (one row each, with its paper and
the options it takes); docs/algorithms.md gives every formula.
"""

from __future__ import annotations

import math

import torch

from rlhfkit.core.aggregate import aggregate_loss
from rlhfkit.core.masks import masked_mean

LOG_RATIO_LIMIT = 20.0


def _token_ratio(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT))


def _sequence_ratio(log_ratio: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    seq = masked_mean(log_ratio, loss_mask, dim=-1)  # [B]
    return torch.exp(seq).unsqueeze(-1).expand_as(log_ratio)


RATIO_LEVELS = {"token": _token_ratio, "sequence": _sequence_ratio}


def _finish(per_token, loss_mask, log_ratio, ratio, clipped, is_weights, agg, counts, **more):
    """Weigh, aggregate, and the metrics every policy loss returns (detached)."""
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate_loss(per_token, loss_mask, agg, *counts)
    metrics = {"clip_frac": masked_mean(clipped.float(), loss_mask),
               "approx_kl": masked_mean(-log_ratio, loss_mask), "ratio_mean": masked_mean(ratio, loss_mask), **more}
    return loss, {k: v.detach() for k, v in metrics.items()}


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ratio_low: float,
    ratio_high: float,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """CISPO (MiniMax 2025, arXiv:2506.13585): REINFORCE with a clipped, detached importance weight, so
    every token keeps a gradient: per-token loss ``-sg(clamp(r, ratio_low, ratio_high)) * A * logp`` with
    ``r = exp(logp - old_logp)``.

    Departure: the paper clips only from above (``ratio_low`` 0); here both bounds are the caller's, as
    Tinker's ``cispo`` loss takes them. ``clip_frac``: the share of tokens whose ratio was clamped.
    """
    log_ratio = logp - old_logp
    ratio = _token_ratio(log_ratio, loss_mask)
    weight = ratio.clamp(min=ratio_low, max=ratio_high).detach()
    clipped = (ratio < ratio_low) | (ratio > ratio_high)
    return _finish(-weight * advantages * logp, loss_mask, log_ratio, ratio, clipped, is_weights, agg,
                   (num_tokens, num_seqs, max_len))


def cispo_policy_loss(logp, old_logp, advantages, loss_mask, *, eps_low=0.2, eps_high=None, agg="token_mean",
                      is_weights=None, num_tokens=None, num_seqs=None, max_len=None):
    """``cispo_loss`` with the weight's bounds ``[1 - eps_low, 1 + eps_high]`` (the clip range's flag;
    MiniMax-M1 sets no lower bound: ``eps_low`` 1 and a large ``eps_high``)."""
    eps_high = eps_low if eps_high is None else eps_high
    return cispo_loss(logp, old_logp, advantages, loss_mask, 1.0 - eps_low, 1.0 + eps_high, agg, num_tokens,
                      num_seqs, max_len, is_weights)


def sapo_loss(logp, old_logp, advantages, loss_mask, *, eps_low=0.2, eps_high=None, agg="token_mean",
              is_weights=None, num_tokens=None, num_seqs=None, max_len=None, ratio_level="token",
              sapo_temperatures=(1.0, 1.05)):
    """SAPO, soft adaptive policy optimization (Qwen team 2025, arXiv:2511.20347): the hard clip is a
    smooth gate. Per token ``-f(r) * A`` with ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``, ``tau`` =
    ``sapo_temperatures[0]`` where ``A > 0``, else ``[1]``; ``f'(1) = 1`` (PPO's gradient on policy) and
    the gradient ``4 s (1 - s)`` (``s`` the sigmoid) fades as ``r`` leaves 1. ``ratio_level`` as for
    ``policy_loss``. The clip range is not used; ``clip_frac`` is 0 (nothing is clipped) and
    ``gate_grad_mean`` is the masked mean of the gradient factor ``4 s (1 - s)``.
    """
    log_ratio = logp - old_logp
    ratio = RATIO_LEVELS[ratio_level](log_ratio, loss_mask)
    tau_pos, tau_neg = sapo_temperatures
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    return _finish(-gate * 4.0 / tau * advantages, loss_mask, log_ratio, ratio, torch.zeros_like(loss_mask),
                   is_weights, agg, (num_tokens, num_seqs, max_len),
                   gate_grad_mean=masked_mean(4.0 * gate * (1.0 - gate), loss_mask))


def _covariance(advantages: torch.Tensor, logp: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred product ``(A - mean A) (logp - mean logp)`` over the counted tokens (Cui et al.
    2025's covariance terms), detached; ``-inf`` where ``loss_mask`` is False."""
    a, lp = advantages.detach().float(), logp.detach().float()
    cov = (a - masked_mean(a, loss_mask)) * (lp - masked_mean(lp, loss_mask))
    return torch.where(loss_mask, cov, torch.full_like(cov, -math.inf))


def clip_cov_loss(logp, old_logp, advantages, loss_mask, *, eps_low=0.2, eps_high=None, agg="token_mean",
                  is_weights=None, num_tokens=None, num_seqs=None, max_len=None, clip_cov_ratio=2e-4,
                  clip_cov_bounds=(1.0, 5.0), generator=None):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv:2505.22617): PPO's clipped surrogate, with the gradient of a few high-covariance tokens
    cut to keep the entropy from collapsing.

    Among the counted tokens the clip leaves alone whose covariance ``(A - mean A)(logp - mean logp)``
    lies in ``(lb, ub) = clip_cov_bounds``, ``max(1, int(clip_cov_ratio * n))`` (``n`` counted tokens)
    are drawn uniformly at random from ``generator`` (all of them when there are fewer) and their loss
    is multiplied by 0; the others keep ``max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A)``. As in
    verl's ``clip_cov``, the means and the draw are over the tensors passed (one micro-batch), so the
    selection depends on the micro-batch split. Extra metric ``cov_cut_frac`` (share of tokens cut).
    """
    eps_high = eps_low if eps_high is None else eps_high
    log_ratio = logp - old_logp
    ratio = _token_ratio(log_ratio, loss_mask)
    loss1, loss2 = -advantages * ratio, -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clipped = (loss2 > loss1) & loss_mask
    lb, ub = clip_cov_bounds
    cov = _covariance(advantages, logp, loss_mask)
    candidates = torch.nonzero((cov > lb) & (cov < ub) & loss_mask & ~clipped)
    keep = torch.ones_like(loss1)
    if len(candidates):
        n_cut = max(int(clip_cov_ratio * int(loss_mask.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:n_cut].to(candidates.device)]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    return _finish(torch.max(loss1, loss2) * keep, loss_mask, log_ratio, ratio, clipped, is_weights, agg,
                   (num_tokens, num_seqs, max_len), cov_cut_frac=masked_mean(1.0 - keep, loss_mask))


def kl_cov_loss(logp, old_logp, advantages, loss_mask, *, eps_low=0.2, eps_high=None, agg="token_mean",
                is_weights=None, num_tokens=None, num_seqs=None, max_len=None, kl_cov_ratio=2e-4, kl_cov_coef=1.0):
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617): the unclipped surrogate ``-r A`` with a KL penalty
    ``kl_cov_coef * |logp - old_logp|`` on the ``max(1, int(kl_cov_ratio * n))`` counted tokens of the
    largest covariance ``(A - mean A)(logp - mean logp)`` (``n`` counted tokens; none when
    ``kl_cov_ratio`` is 0). No clip range (``clip_frac`` 0). As in verl's ``kl_cov``, the covariance
    ranks the tokens of the tensors passed (one micro-batch). Extra metric ``cov_penalised_frac``.
    """
    log_ratio = logp - old_logp
    ratio = _token_ratio(log_ratio, loss_mask)
    per_token = -advantages * ratio
    penalised = torch.zeros_like(loss_mask)
    n = int(loss_mask.sum())
    if kl_cov_ratio > 0 and n:
        top = torch.topk(_covariance(advantages, logp, loss_mask).reshape(-1), max(1, int(n * kl_cov_ratio))).indices
        penalised.view(-1)[top] = True
        per_token = torch.where(penalised, per_token + kl_cov_coef * log_ratio.abs(), per_token)
    return _finish(per_token, loss_mask, log_ratio, ratio, torch.zeros_like(loss_mask), is_weights, agg,
                   (num_tokens, num_seqs, max_len), cov_penalised_frac=masked_mean(penalised.float(), loss_mask))


def gmpo_loss(logp, old_logp, advantages, loss_mask, *, eps_low=0.2, eps_high=None, agg="token_mean",
              is_weights=None, num_tokens=None, num_seqs=None, max_len=None):
    """GMPO, geometric-mean policy optimization (Zhao et al. 2025, arXiv:2507.20673): one ratio per
    sequence, the geometric mean of its token ratios each clipped in log space.

    Per token ``l = clamp(logp - old_logp, -20, 20)``, ``s = sign(A)``, ``l' = s * min(s l, s clamp(l,
    -eps_low, eps_high))`` (the clip binds on the side that would grow the objective, as PPO's); per
    sequence ``R = exp(mean_t l')`` and ``A_seq = mean_t A``; the sequence's loss ``-A_seq R`` is
    broadcast to its tokens and ``agg`` reduces it (``seq_mean_token_mean`` is the paper's mean over
    sequences). The paper clips at ``(e^-0.4, e^0.4)``: eps 0.4 here. ``clip_frac``: tokens where the
    clip binds (verl counts every clamped token); ``ratio_mean``: the mean sequence ratio over tokens.
    """
    eps_high = eps_low if eps_high is None else eps_high
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-eps_low, eps_high)
    chosen = sign * torch.min(sign * log_ratio, sign * bounded)
    seq_ratio = torch.exp(masked_mean(chosen, loss_mask, dim=-1))  # [B]
    seq_adv = masked_mean(advantages, loss_mask, dim=-1)  # [B]
    per_token = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(log_ratio)
    return _finish(per_token, loss_mask, log_ratio, seq_ratio.unsqueeze(-1).expand_as(log_ratio),
                   chosen != log_ratio, is_weights, agg, (num_tokens, num_seqs, max_len))


def vespo_loss(logp, old_logp, advantages, loss_mask, *, eps_low=0.2, eps_high=None, agg="token_mean",
               is_weights=None, num_tokens=None, num_seqs=None, max_len=None, vespo_k=(2.0, 3.0),
               vespo_lambda=(3.0, 2.0)):
    """VESPO, variational sequence-level soft policy optimization (arXiv:2602.10693), as TRL's ``vespo``
    loss: REINFORCE weighted by a detached Gamma-shaped function of the sequence's importance ratio.

    ``log w = clamp(sum_t clamp(logp - old_logp, -20, 20), log 1e-8, 20)`` per sequence (a product of
    ratios, not GSPO's mean), ``phi(w) = exp(lam + k log w - lam w)`` (so ``phi(1) = 1``), with ``(k,
    lam) = (vespo_k[0], vespo_lambda[0])`` where ``A >= 0`` else the second entries; per-token loss
    ``-sg(phi) * A * logp``. The clip range is not used (``clip_frac`` 0); ``phi_mean`` is the masked
    mean of ``phi``. Departure from TRL: engine/trainer IS weights multiply the per-token loss (as for
    every loss here) instead of entering ``log w``.
    """
    log_ratio = logp - old_logp
    with torch.no_grad():
        counted = torch.where(loss_mask, log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), 0.0)
        log_w = counted.sum(-1, keepdim=True)
        log_w = log_w.clamp(math.log(1e-8), LOG_RATIO_LIMIT)
        nonneg = advantages >= 0
        k = torch.where(nonneg, torch.full_like(advantages, vespo_k[0]), torch.full_like(advantages, vespo_k[1]))
        lam = torch.where(nonneg, torch.full_like(advantages, vespo_lambda[0]),
                          torch.full_like(advantages, vespo_lambda[1])).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    ratio = torch.exp(log_w).expand_as(log_ratio)
    return _finish(-phi * advantages * logp, loss_mask, log_ratio, ratio, torch.zeros_like(loss_mask), is_weights,
                   agg, (num_tokens, num_seqs, max_len), phi_mean=masked_mean(phi, loss_mask))
