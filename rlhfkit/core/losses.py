"""Policy, value, entropy, SFT and preference losses; logprobs from logits.

Every loss is pure: tensors and plain scalars in, ``(loss, metrics)`` out, with metrics as
detached tensors (never ``.item()``, so no device sync inside the math). The policy loss
types are the table ``POLICY_LOSSES`` (name -> ``PolicyLossSpec``).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rlhfkit.core.aggregate import aggregate_loss
from rlhfkit.core.masks import masked_mean
from rlhfkit.core.surrogates import LOG_RATIO_LIMIT as _LOG_RATIO_LIMIT
from rlhfkit.core.surrogates import (
    RATIO_LEVELS,
    cispo_policy_loss,
    clip_cov_loss,
    gmpo_loss,
    kl_cov_loss,
    sapo_loss,
    vespo_loss,
)
from rlhfkit.core.tables import lookup


def _detach_all(metrics: dict) -> dict:
    return {k: v.detach() for k, v in metrics.items()}


# ---------------------------------------------------------------- policy loss


@dataclass(frozen=True, kw_only=True)
class PolicyLossSpec:
    """One policy loss type (an entry of ``POLICY_LOSSES``): the function and what it takes.

    A trainer calls ``spec.loss(logp, old_logp, advantages, loss_mask, eps_low=..., eps_high=...,
    agg=..., is_weights=..., num_tokens=..., num_seqs=..., max_len=..., **options)`` where
    ``options`` holds a value for each name of ``spec.options`` (``ratio_level`` is
    ``spec.ratio_level``; the others are the loss's own settings, each named as the keyword the
    loss takes).

    Attributes:
        ratio_level: a key of ``RATIO_LEVELS``: one importance ratio per token, or one per
            sequence broadcast to its tokens.
        loss: the loss function (``policy_loss`` or one of ``core.surrogates``).
        options: the keywords of ``loss`` beyond the common ones that the trainer supplies.
        doc: one line for people: what the loss is and the paper it comes from.
    """

    ratio_level: str
    loss: Callable[..., tuple[torch.Tensor, dict]] = field(default=None, compare=False)  # type: ignore[assignment]
    options: tuple[str, ...] = ("ratio_level", "dual_clip")
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        lookup(RATIO_LEVELS, self.ratio_level, "ratio level")
        if self.loss is None:
            object.__setattr__(self, "loss", policy_loss)

    def options_from(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The loss's own keyword arguments: ``ratio_level`` from the spec, the others from
        ``values`` (a mapping that has every other name of ``options``)."""
        return {k: self.ratio_level if k == "ratio_level" else values[k] for k in self.options}


def _spec(ratio_level: str, loss, options: tuple[str, ...], doc: str) -> PolicyLossSpec:
    return PolicyLossSpec(ratio_level=ratio_level, loss=loss, options=options, doc=doc)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    agg: str = "token_mean",
    is_weights: torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate policy loss (PPO, Schulman et al. 2017, arXiv:1707.06347).

    ``ratio = exp(clamp(logp - old_logp, -20, 20))`` per token, or with
    ``ratio_level="sequence"`` GSPO's (Zheng et al. 2025, arXiv:2507.18071)
    ``exp(masked mean over the sequence of (logp - old_logp))`` broadcast to its tokens, no
    clamp. ``surr1 = ratio * A``, ``surr2 = clamp(ratio, 1 - eps_low, 1 + eps_high) * A``,
    per-token loss ``-min(surr1, surr2)``. Asymmetric ``eps_high`` is DAPO's clip-higher
    (Yu et al. 2025, arXiv:2503.14476). Dual clip (Ye et al. 2020, arXiv:1912.09729; needs
    ``dual_clip > 1``): where ``A < 0`` the loss is ``-max(min(surr1, surr2), dual_clip * A)``.
    ``is_weights`` (detached, e.g. from ``is_weights()``) multiply the per-token loss, then
    ``aggregate_loss(per_token, loss_mask, agg, ...)`` reduces it.

    Departures: GSPO's paper averages over sequences (``seq_mean_token_mean``); here ``agg``
    decides. OpenRLHF applies its vLLM IS correction only to the token-level loss; here the
    weights apply to either level. OpenRLHF's GSPO may take the rollout logprobs as base; here
    the caller passes whichever logprobs it wants as ``old_logp``.

    Args:
        logp: ``[B, T]`` current policy logprobs (with grad).
        old_logp: ``[B, T]`` logprobs of the policy that sampled (behaviour policy).
        advantages: ``[B, T]``.
        loss_mask: ``[B, T]`` bool, True = counts.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]``; eps_high None = eps_low.
        dual_clip: lower bound factor for negative advantages, > 1, or None.
        ratio_level: ``token`` or ``sequence`` (GSPO): a key of ``RATIO_LEVELS``, as
            ``POLICY_LOSSES[name].ratio_level`` gives it for a policy loss type.
        agg: aggregation mode (see ``aggregate_loss``); num_tokens / num_seqs / max_len too.
        is_weights: ``[B, T]`` importance weights, or None.

    Returns:
        ``(loss, metrics)``; metrics ``clip_frac``, ``approx_kl`` (masked mean of
        ``old_logp - logp``), ``ratio_mean``, and ``dual_clip_frac`` with dual clip.
    """
    ratio_fn = lookup(RATIO_LEVELS, ratio_level, "ratio level")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. 2020), got {dual_clip}")
    eps_high = eps_low if eps_high is None else eps_high
    log_ratio = logp - old_logp
    ratio = ratio_fn(log_ratio, loss_mask)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    clipped = torch.min(surr1, surr2)
    metrics = {}
    if dual_clip is None:
        per_token = -clipped
    else:
        lower = dual_clip * advantages
        per_token = -torch.where(advantages < 0, torch.max(clipped, lower), clipped)
        metrics["dual_clip_frac"] = masked_mean(((advantages < 0) & (lower > clipped)).float(), loss_mask)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate_loss(per_token, loss_mask, agg, num_tokens, num_seqs, max_len)
    metrics["clip_frac"] = masked_mean((surr2 < surr1).float(), loss_mask)
    metrics["approx_kl"] = masked_mean(-log_ratio, loss_mask)
    metrics["ratio_mean"] = masked_mean(ratio, loss_mask)
    return loss, _detach_all(metrics)


POLICY_LOSSES: dict[str, PolicyLossSpec] = {
    "ppo": PolicyLossSpec(
        ratio_level="token",
        doc="PPO's clipped surrogate, one ratio per token (Schulman et al. 2017, arXiv:1707.06347)",
    ),
    "gspo": PolicyLossSpec(
        ratio_level="sequence",
        doc="GSPO: the clipped surrogate with one ratio per sequence, the geometric mean of its "
        "token ratios (Zheng et al. 2025, arXiv:2507.18071)",
    ),
    "cispo": _spec("token", cispo_policy_loss, (), "CISPO: REINFORCE with the clipped importance weight "
                   "detached, every token keeps a gradient (MiniMax 2025, MiniMax-M1, arXiv:2506.13585)"),
    "sapo": _spec("token", sapo_loss, ("ratio_level", "sapo_temperatures"), "SAPO: a smooth sigmoid gate "
                  "in place of the hard clip (Qwen team 2025, arXiv:2511.20347)"),
    "clip_cov": _spec("token", clip_cov_loss, ("clip_cov_ratio", "clip_cov_bounds", "generator"),
                      "Clip-Cov: the clipped surrogate with the gradient of a few high-covariance tokens cut "
                      "(Cui et al. 2025, arXiv:2505.22617)"),
    "kl_cov": _spec("token", kl_cov_loss, ("kl_cov_ratio", "kl_cov_coef"), "KL-Cov: the surrogate with a "
                    "|log ratio| penalty on the highest-covariance tokens (Cui et al. 2025, arXiv:2505.22617)"),
    "gmpo": _spec("sequence", gmpo_loss, (), "GMPO: one ratio per sequence, the geometric mean of token "
                  "ratios clipped in log space (Zhao et al. 2025, arXiv:2507.20673)"),
    "vespo": _spec("sequence", vespo_loss, ("vespo_k", "vespo_lambda"), "VESPO: REINFORCE weighted by a "
                   "Gamma-shaped function of the sequence's ratio (arXiv:2602.10693, TRL's vespo)"),
}


# ---------------------------------------------------------------- IS correction


def _is_tis(w, log_w, loss_mask, low, high):
    weights = w.clamp(min=low, max=high)
    return weights, {"is_clip_frac": masked_mean(((w < low) | (w > high)).float(), loss_mask)}


def _is_icepop(w, log_w, loss_mask, low, high):
    keep = (w >= low) & (w <= high)
    return w * keep, {"is_zeroed_frac": masked_mean((~keep).float(), loss_mask)}


def _is_seq_mask_tis(w, log_w, loss_mask, low, high):
    seq_w = torch.exp(masked_mean(log_w, loss_mask, dim=-1))  # [B] geometric mean
    seq_keep = (seq_w >= low) & (seq_w <= high)
    weights = w.clamp(min=low, max=high) * seq_keep.unsqueeze(-1)
    live = loss_mask.any(dim=-1)
    return weights, {
        "is_clip_frac": masked_mean(((w < low) | (w > high)).float(), loss_mask),
        "is_seq_masked_frac": masked_mean((~seq_keep).float(), live),
    }


IS_KINDS = {"tis": _is_tis, "icepop": _is_icepop, "seq_mask_tis": _is_seq_mask_tis}


def is_weights(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    kind: str,
    low: float,
    high: float,
) -> tuple[torch.Tensor, dict]:
    """Importance weights correcting the rollout engine / trainer logprob mismatch.

    ``w = exp(clamp(old_logp - rollout_logp, -20, 20))`` (trainer's old policy over the
    engine's sampling policy; Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training", blog post). Kinds (``IS_KINDS``):

    - ``tis``: truncated IS, ``clamp(w, low, high)``;
    - ``icepop``: ``w`` where ``low <= w <= high``, else 0 (IcePop, Ling team 2025);
    - ``seq_mask_tis``: ``clamp(w, low, high)`` times a per-sequence mask that zeros a
      sequence whose geometric-mean weight ``exp(masked mean log w)`` is outside
      ``[low, high]``. Departure: OpenRLHF multiplies the *unclamped* token weights there
      (its comment says TIS); we clamp, as the name says.

    Weights are 0 where ``loss_mask`` is False, and detached.

    Args:
        old_logp: ``[B, T]`` trainer logprobs of the sampled tokens (old policy).
        rollout_logp: ``[B, T]`` engine logprobs of the same tokens.
        loss_mask: ``[B, T]`` bool, True = counts.
        kind: one of ``IS_KINDS``.
        low, high: bounds on the weight.

    Returns:
        ``(weights [B, T], metrics)``: ``is_clip_frac`` (tokens clamped) or
        ``is_zeroed_frac`` (tokens zeroed), ``is_seq_masked_frac`` (sequences masked, among
        those with a counted token), and ``rollout_kl`` (masked mean of rollout - old).
    """
    weigh = lookup(IS_KINDS, kind, "IS correction kind")
    if not 0 <= low <= high:
        raise ValueError(f"is_weights: need 0 <= low <= high, got low={low}, high={high}")
    with torch.no_grad():
        log_w = (old_logp.float() - rollout_logp.float()).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
        w = torch.exp(log_w)
        weights, metrics = weigh(w, log_w, loss_mask, low, high)
        weights = torch.where(loss_mask, weights, torch.zeros_like(weights))
        metrics["rollout_kl"] = masked_mean(-log_w, loss_mask)
    return weights, metrics


def behaviour_weights(
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    kind: str | None = None,
    low: float = 0.0,
    high: float = float("inf"),
) -> tuple[torch.Tensor, dict]:
    """The behaviour weight ``pi_prox / pi_behav`` of each token, truncated by ``kind``.

    ``kind=None``: ``w = exp(clamp(prox_logp - behav_logp, -20, 20))``, untruncated, 0 where
    ``loss_mask`` is False; otherwise ``is_weights(prox_logp, behav_logp, loss_mask, kind, low,
    high)`` (TIS / ICEPOP / seq-mask-TIS). Detached.

    Args:
        prox_logp: ``[B, T]`` the proximal policy's logprobs (the trainer's, before the update).
        behav_logp: ``[B, T]`` the behaviour policy's logprobs (the engine's, at sampling time).
        loss_mask: ``[B, T]`` bool, True = counts.
        kind: None or one of ``IS_KINDS``; low, high: the bounds ``is_weights`` takes.

    Returns:
        ``(weights [B, T], metrics)``: ``is_weights``' metrics, or ``rollout_kl`` alone.
    """
    if kind is not None:
        return is_weights(prox_logp, behav_logp, loss_mask, kind, low, high)
    with torch.no_grad():
        log_w = (prox_logp.float() - behav_logp.float()).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
        weights = torch.where(loss_mask, torch.exp(log_w), torch.zeros_like(log_w))
        return weights, {"rollout_kl": masked_mean(-log_w, loss_mask)}


def decoupled_policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    is_kind: str | None = None,
    is_low: float = 0.0,
    is_high: float = float("inf"),
    loss: Callable[..., tuple[torch.Tensor, dict]] | None = None,
    **ppo: Any,
) -> tuple[torch.Tensor, dict]:
    """Decoupled PPO (Hilton et al. 2021, arXiv:2110.00641; AReaL, Fu et al. 2025,
    arXiv:2505.24298): the clip is around the proximal policy, the behaviour weight reweights.

    Per token ``w = pi_prox / pi_behav`` (``behaviour_weights``: untruncated, or truncated by
    ``is_kind`` within ``[is_low, is_high]``), ``r = pi / pi_prox`` and the loss is
    ``-w * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, aggregated: ``policy_loss(logp,
    prox_logp, ..., is_weights=w)``. With ``behav_logp == prox_logp`` (and ``1`` inside the
    bounds) ``w = 1`` and this is PPO's loss exactly. The same formula corrects the rollout /
    trainer mismatch of a synchronous run (Yao et al. 2025's TIS, ``is_weights``): there the
    behaviour policy is the engine's view of the same weights.

    Departure from AReaL: its cap (``behav_imp_weight_cap``) zeros tokens above it; here the
    truncation is whichever ``is_kind`` is chosen (``icepop`` zeros as AReaL does; ``tis``
    clamps), and none without one.

    Args:
        logp: ``[B, T]`` current policy logprobs (with grad).
        prox_logp: ``[B, T]`` proximal policy logprobs (the trainer's before the update).
        behav_logp: ``[B, T]`` behaviour policy logprobs (the engine's, possibly versions old).
        advantages, loss_mask: ``[B, T]``; is_kind, is_low, is_high: see ``behaviour_weights``.
        loss: the policy loss under the weights (a ``PolicyLossSpec.loss``); None = ``policy_loss``.
        **ppo: the other arguments of ``loss`` (clip range, aggregation, counts, its options).

    Returns:
        ``(loss, metrics)``: ``policy_loss``'s metrics and ``behaviour_weights``' metrics, plus
        ``behav_weight_mean`` (masked mean of ``w``).
    """
    weights, metrics = behaviour_weights(prox_logp, behav_logp, loss_mask, is_kind, is_low, is_high)
    value, pm = (loss or policy_loss)(logp, prox_logp, advantages, loss_mask, is_weights=weights, **ppo)
    return value, {**pm, **metrics, "behav_weight_mean": masked_mean(weights, loss_mask)}


# ---------------------------------------------------------------- value, entropy, logprobs


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    clip: float | None = None,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO critic loss with optional value clipping (Schulman et al. 2017 reference code).

    ``0.5 * aggregate(max((V_clip - R)^2, (V - R)^2))`` with
    ``V_clip = old + clamp(V - old, -clip, clip)``; without ``clip``, ``0.5 * aggregate((V -
    R)^2)``. Same as OpenRLHF's ``ValueLoss`` for ``token_mean``.

    Args:
        values: ``[B, T]`` current critic values (with grad).
        old_values: ``[B, T]`` values at rollout time.
        returns: ``[B, T]`` targets.
        loss_mask: ``[B, T]`` bool, True = counts.
        clip: clip range, or None.
        agg, num_tokens, num_seqs, max_len: see ``aggregate_loss``.

    Returns:
        ``(loss, metrics)`` with ``value_clip_frac`` (tokens where the clipped term is larger).
    """
    unclipped = (values - returns) ** 2
    metrics = {}
    if clip is None:
        per_token = unclipped
        metrics["value_clip_frac"] = torch.zeros((), device=values.device)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clip - returns) ** 2
        per_token = torch.max(clipped, unclipped)
        metrics["value_clip_frac"] = masked_mean((clipped > unclipped).float(), loss_mask)
    loss = 0.5 * aggregate_loss(per_token, loss_mask, agg, num_tokens, num_seqs, max_len)
    return loss, _detach_all(metrics)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution, ``logsumexp(z) - sum softmax(z) * z``.

    Args:
        logits: ``[..., V]`` (e.g. ``[B, T, V]``).

    Returns:
        ``[...]`` float32 entropy (e.g. ``[B, T]``). Computed in float32.
    """
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """Log-probability of each label: ``z[label] / tau - logsumexp(z / tau)``.

    Rows are processed in chunks of ``chunk_size`` so no full-vocabulary log-softmax copy
    of the whole tensor is made; each chunk is upcast to float32. Differentiable. Departure
    from OpenRLHF's ``log_probs_from_logits``: the caller's logits are never divided in
    place by the temperature.

    Args:
        logits: ``[..., V]`` (e.g. ``[B, T, V]``).
        labels: ``[...]`` long token ids (e.g. ``[B, T]``).
        temperature: sampling temperature, > 0.
        chunk_size: rows per chunk.

    Returns:
        ``[...]`` float32 logprobs.
    """
    return logprobs_and_entropy(logits, labels, temperature, chunk_size, with_entropy=False)[0]


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logprobs_from_logits`` and the entropy of ``softmax(z / tau)`` in one pass over the
    vocabulary: each float32 chunk is scaled and reduced (logsumexp) once for both.

    ``entropy_grad=False`` computes the entropy without a graph (a metric only: no
    ``[..., V]`` tensors kept for backward). Returns ``([...], [...] or None)`` float32.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_labels = labels.reshape(-1)
    pieces, entropies = [], []
    for start in range(0, flat_logits.shape[0], chunk_size):
        z = flat_logits[start : start + chunk_size].float()
        if temperature != 1.0:
            z = z / temperature
        lse = torch.logsumexp(z, dim=-1)
        picked = z.gather(-1, flat_labels[start : start + chunk_size].unsqueeze(-1)).squeeze(-1)
        pieces.append(picked - lse)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                zz, ll = (z, lse) if entropy_grad else (z.detach(), lse.detach())
                entropies.append(ll - (torch.exp(zz - ll.unsqueeze(-1)) * zz).sum(dim=-1))
    if not pieces:
        empty = torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
        return empty, empty.clone() if with_entropy else None
    entropy = torch.cat(entropies).reshape(labels.shape) if with_entropy else None
    return torch.cat(pieces).reshape(labels.shape), entropy


# ---------------------------------------------------------------- supervised and preference


def sft_loss(
    logp: torch.Tensor,
    loss_mask: torch.Tensor,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
    dft: bool = False,
) -> tuple[torch.Tensor, dict]:
    """Negative log-likelihood of the target tokens, aggregated (OpenRLHF's ``SFTLoss``).

    Args:
        logp: ``[B, T]`` logprobs of the target tokens.
        loss_mask: ``[B, T]`` bool, True = counts (response tokens).
        agg, num_tokens, num_seqs, max_len: see ``aggregate_loss``.
        dft: Dynamic Fine-Tuning (Wu et al. 2025, arXiv:2508.05629): each token's ``-logp`` weighted
            by its probability ``exp(logp)``, detached (the gradient is ``-p * grad logp``).

    Returns:
        ``(loss, metrics)`` with ``nll`` (token mean of ``-logp``).
    """
    per_token = -logp * logp.detach().exp() if dft else -logp
    loss = aggregate_loss(per_token, loss_mask, agg, num_tokens, num_seqs, max_len)
    return loss, _detach_all({"nll": masked_mean(-logp, loss_mask)})


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    ipo: bool = False,
) -> tuple[torch.Tensor, dict]:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290), cDPO and IPO on sequence logprobs.

    ``h = (pi_c - pi_r) - (ref_c - ref_r)``. DPO/cDPO (Mitchell 2023, "A note on DPO with
    noisy preferences"): ``-(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``.
    IPO (Azar et al. 2023, arXiv:2310.12036): ``(h - 1 / (2 beta))^2``. Mean over pairs.
    Same as OpenRLHF's ``DPOLoss``.

    Args:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected: ``[B]`` summed logprobs.
        beta: temperature of the implicit reward.
        label_smoothing: cDPO's flip probability eps.
        ipo: use the IPO loss.

    Returns:
        ``(loss, metrics)``: ``chosen_rewards`` ``[B]`` = ``beta (pi_c - ref_c)``,
        ``rejected_rewards`` ``[B]``, ``margin`` (mean chosen - rejected reward),
        ``accuracy`` (fraction with chosen reward > rejected reward).
    """
    h = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    if ipo:
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        losses = -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing
    chosen_rewards = beta * (policy_chosen - ref_chosen)
    rejected_rewards = beta * (policy_rejected - ref_rejected)
    metrics = {
        "chosen_rewards": chosen_rewards,
        "rejected_rewards": rejected_rewards,
        "margin": (chosen_rewards - rejected_rewards).mean(),
        "accuracy": (chosen_rewards > rejected_rewards).float().mean(),
    }
    return losses.mean(), _detach_all(metrics)


def pairwise_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict]:
    """Bradley-Terry reward-model loss ``mean(-log sigmoid(c - r - margin))``.

    Bradley & Terry 1952; used for RLHF reward models by Ouyang et al. 2022
    (arXiv:2203.02155); the optional margin is Llama 2's (Touvron et al. 2023,
    arXiv:2307.09288). Same as OpenRLHF's ``PairWiseLoss``.

    Args:
        chosen, rejected: ``[B]`` reward-model scores.
        margin: ``[B]`` margins, or None.

    Returns:
        ``(loss, metrics)`` with ``accuracy`` (fraction with chosen > rejected) and
        ``reward_margin`` (mean c - r).
    """
    diff = chosen - rejected
    losses = -F.logsigmoid(diff if margin is None else diff - margin)
    metrics = {"accuracy": (diff > 0).float().mean(), "reward_margin": diff.mean()}
    return losses.mean(), _detach_all(metrics)


def center_penalty(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """``mean((c + r)^2)`` over the pairs: the term that pulls a reward model's scores towards mean zero
    (Eisenstein et al. 2023, arXiv:2312.09244, Eq. 2; TRL's ``center_rewards_coefficient`` weighs it).

    Args:
        chosen, rejected: ``[B]`` reward-model scores.
    """
    return ((chosen + rejected) ** 2).mean()


def kto_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    policy_kl: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    ref_kl: torch.Tensor,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict]:
    """KTO (Ethayarajh et al. 2024, arXiv:2402.01306), as OpenRLHF's ``KTOLoss``.

    ``z = mean(policy_kl - ref_kl).detach().clamp(min=0)`` (reference point from mismatched
    pairs); desirable losses ``1 - sigmoid(beta (logratio_c - z))``, undesirable
    ``1 - sigmoid(beta (z - logratio_r))``, weighted by ``desirable_weight`` /
    ``undesirable_weight``; the loss is the mean over the concatenation. Either side may be
    empty. Departure: OpenRLHF all-reduces ``z`` over ranks inside the loss; here the caller
    passes the (gathered) KL logprobs, the math stays free of communication.

    Args:
        policy_chosen, ref_chosen: ``[Bc]`` summed logprobs of desirable completions.
        policy_rejected, ref_rejected: ``[Br]`` summed logprobs of undesirable ones.
        policy_kl, ref_kl: ``[Bk]`` summed logprobs of mismatched (prompt, completion) pairs.
        beta: temperature.
        desirable_weight, undesirable_weight: class weights.

    Returns:
        ``(loss, metrics)`` with ``chosen_rewards`` ``[Bc]``, ``rejected_rewards`` ``[Br]``,
        ``kl`` (the reference point z).
    """
    if policy_chosen.numel() + policy_rejected.numel() == 0:
        raise ValueError("kto_loss: need at least one desirable or undesirable example")
    z = (policy_kl - ref_kl).mean().detach().clamp(min=0)
    chosen_logratio = policy_chosen - ref_chosen
    rejected_logratio = policy_rejected - ref_rejected
    chosen_losses = 1 - torch.sigmoid(beta * (chosen_logratio - z))
    rejected_losses = 1 - torch.sigmoid(beta * (z - rejected_logratio))
    losses = torch.cat([desirable_weight * chosen_losses, undesirable_weight * rejected_losses])
    metrics = {"chosen_rewards": beta * chosen_logratio, "rejected_rewards": beta * rejected_logratio, "kl": z}
    return losses.mean(), _detach_all(metrics)


def dro_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    beta: float,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """DRO, direct reward optimisation (Richemond et al. 2024, arXiv:2405.19107; the form of Kimi
    k1.5, arXiv:2501.12599): a policy gradient with a quadratic penalty that keeps the policy near
    the sampler, per-token loss ``-(logp * A - beta / 2 * (logp - old_logp) ** 2)``.

    Args:
        logp, old_logp, advantages: ``[B, T]``; loss_mask ``[B, T]`` bool, True = counts.
        beta: weight of the quadratic penalty, >= 0.
        agg, num_tokens, num_seqs, max_len: see ``aggregate_loss``.

    Returns:
        ``(loss, metrics)`` with ``penalty_mean``, the masked mean of ``(logp - old_logp) ** 2 / 2``.
    """
    if not beta >= 0.0:
        raise ValueError(f"dro beta must be >= 0, got {beta}")
    penalty = 0.5 * (logp - old_logp) ** 2
    loss = aggregate_loss(-(logp * advantages - beta * penalty), loss_mask, agg, num_tokens, num_seqs, max_len)
    return loss, _detach_all({"penalty_mean": masked_mean(penalty, loss_mask)})
