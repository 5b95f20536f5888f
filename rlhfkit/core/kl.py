"""KL estimators per token and KL-coefficient controllers.

Estimators follow Schulman, "Approximating KL divergence" (blog post, 2020,
http://joschu.net/blog/kl-approx.html). With samples from the policy and
``r = ref_logp - logp`` (log of the ratio ref/policy), ``KL(policy || ref) = E[-r]``.
"""

import torch

from rlhfkit.core.tables import lookup

_EXP_CAP = 20.0  # exp(20) ~ 4.9e8: far above any clamp, far below float32 overflow


def _k1(logp, ref_logp, clamp):
    return logp - ref_logp


def _k2(logp, ref_logp, clamp):
    return 0.5 * (logp - ref_logp) ** 2


def _k3(logp, ref_logp, clamp):
    r = ref_logp - logp
    r_exp = r if clamp is None else r.clamp(max=_EXP_CAP)
    return torch.exp(r_exp) - 1 - r


def _k3_stable(logp, ref_logp, clamp):
    r = ref_logp - logp
    k1 = logp - ref_logp
    # k3 is only needed where r < 0; evaluating it at min(r, 0) keeps exp bounded, and
    # min(k1, k3(r)) == min(k1, k3(0)) == k1 for r >= 0 because k1 <= 0 <= k3 there.
    r_neg = r.clamp(max=0.0)
    k3 = torch.exp(r_neg) - 1 - r_neg
    return torch.where(r < 0, k3, torch.minimum(k1, k3))


KL_ESTIMATORS = {"k1": _k1, "k2": _k2, "k3": _k3, "k3_stable": _k3_stable}


def approx_kl(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None = 10.0
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token logprobs.

    With ``r = ref_logp - logp``:

    - ``k1 = logp - ref_logp = -r`` (unbiased, can be negative);
    - ``k2 = 0.5 * (logp - ref_logp)^2`` (biased, low variance, non-negative);
    - ``k3 = exp(r) - 1 - r`` (unbiased, non-negative; Schulman 2020);
    - ``k3_stable``: a piecewise estimator from OpenRLHF walkthroughs, implemented literally:
      ``k3`` where ``r < 0`` and ``min(k1, k3)`` where ``r >= 0``. Since ``k1 = -r <= 0 <=
      k3`` for ``r >= 0``, that branch equals ``k1``: the estimate is negative there and
      is *not* the non-negative k3. Kept as written; see docs/algorithms.md.

    The estimate (not the log-ratio) is clamped to ``[-clamp, clamp]``; ``clamp=None``
    disables it. Computed in float32. Departure from OpenRLHF's ``compute_approx_kl``: that
    function has no clamp and no ``k3_stable``. For ``k3`` with a clamp, ``r`` is capped at
    20 inside ``exp`` only: the clamped value is unchanged and no inf*0 NaN reaches the
    gradient.

    Args:
        logp: ``[B, T]`` policy logprobs of the sampled tokens.
        ref_logp: ``[B, T]`` reference logprobs of the same tokens.
        estimator: one of ``KL_ESTIMATORS``.
        clamp: bound on the absolute value of the estimate, or None.

    Returns:
        ``[B, T]`` float32 estimate (values at non-action positions are meaningless; mask them).
    """
    kl = lookup(KL_ESTIMATORS, estimator, "KL estimator")(logp.float(), ref_logp.float(), clamp)
    return kl if clamp is None else kl.clamp(min=-clamp, max=clamp)


class FixedKLController:
    """A constant KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, fixed variant).

    ``update`` is a no-op so the trainer can treat both controllers alike.
    """

    def __init__(self, coef: float):
        if coef < 0:
            raise ValueError(f"FixedKLController: coef must be >= 0, got {coef}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient; arguments are accepted for interface parity."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional KL-coefficient controller (Ziegler et al. 2019, arXiv:1909.08593, §2.2).

    ``err = clip(current_kl / target - 1, -0.2, 0.2)``; ``value *= 1 + err * n_steps / horizon``.
    Same update as OpenRLHF's ``AdaptiveKLController``. ``current_kl`` may be a float or a
    0-d tensor (it is converted with ``float``: a controller is stateful bookkeeping, not
    loss math).
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if init_coef < 0 or target <= 0 or horizon <= 0:
            raise ValueError(
                "AdaptiveKLController: need init_coef >= 0, target > 0, horizon > 0; got "
                f"init_coef={init_coef}, target={target}, horizon={horizon}"
            )
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward the one that keeps the KL at ``target``."""
        err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])
