"""The policy losses of core/surrogates.py against values worked by hand: loss and gradient per token."""

import inspect
import math

import pytest
import torch

from rlhfkit.core import POLICY_LOSSES
from rlhfkit.core.surrogates import (
    cispo_policy_loss,
    clip_cov_loss,
    gmpo_loss,
    kl_cov_loss,
    sapo_loss,
    vespo_loss,
)

TIGHT = dict(atol=1e-6, rtol=0)


def leaf(rows):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=True)


def ratios_batch():
    """One sequence, ratios 1.5, 0.5, 1.0 (old logprobs 0), advantages 1, 1, -2."""
    logp = leaf([[math.log(1.5), math.log(0.5), 0.0]])
    return logp, torch.zeros(1, 3, dtype=torch.float64), torch.tensor([[1.0, 1.0, -2.0]], dtype=torch.float64), \
        torch.ones(1, 3, dtype=torch.bool)


def test_cispo_clamps_the_detached_weight_and_keeps_every_tokens_gradient():
    logp, old, adv, mask = ratios_batch()
    loss, m = cispo_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    # weights clamp(1.5) = 1.2, clamp(0.5) = 0.8, 1.0; loss_t = -w A logp; token mean over 3
    expected = (-1.2 * math.log(1.5) - 0.8 * math.log(0.5) - 1.0 * -2.0 * 0.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-9)
    loss.backward()
    # d/dlogp = -w A / 3: the clamped tokens keep their gradient (PPO's clip would zero them)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.4, -0.8 / 3, 2.0 / 3]], dtype=torch.float64), **TIGHT)
    assert m["clip_frac"].item() == pytest.approx(2 / 3)


def test_sapo_gate_by_hand():
    logp, old, adv, mask = ratios_batch()
    loss, m = sapo_loss(logp, old, adv, mask, sapo_temperatures=(1.0, 1.05))

    def sig(x):
        return 1 / (1 + math.exp(-x))

    # tau 1 where A > 0, 1.05 where A <= 0; loss_t = -sig(tau (r - 1)) 4 / tau A
    per = [-sig(0.5) * 4, -sig(-0.5) * 4, -sig(0.0) * 4 / 1.05 * -2.0]
    assert loss.item() == pytest.approx(sum(per) / 3, abs=1e-9)
    loss.backward()
    # d/dlogp = -4 s (1 - s) r A / 3 (dr/dlogp = r)
    grads = [-4 * sig(0.5) * (1 - sig(0.5)) * 1.5, -4 * sig(-0.5) * (1 - sig(-0.5)) * 0.5,
             -4 * 0.25 * 1.0 * -2.0]
    torch.testing.assert_close(logp.grad, torch.tensor([[g / 3 for g in grads]], dtype=torch.float64), **TIGHT)
    assert m["clip_frac"].item() == 0.0
    # on policy (r = 1) the gate's gradient is PPO's: -A per token
    lp = leaf([[-1.0, -2.0]])
    a = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    sapo_loss(lp, lp.detach(), a, torch.ones(1, 2, dtype=torch.bool))[0].backward()
    torch.testing.assert_close(lp.grad, -a / 2, **TIGHT)


def cov_batch():
    """A = 2, 2, -2, -2 (mean 0); logp = -0.5, -2.5, -1.5, -1.5 (mean -1.5): covariances 2, -2, 0, 0."""
    logp = leaf([[-0.5, -2.5, -1.5, -1.5]])
    return logp, torch.tensor([[2.0, 2.0, -2.0, -2.0]], dtype=torch.float64), torch.ones(1, 4, dtype=torch.bool)


def test_clip_cov_cuts_the_gradient_of_the_token_inside_the_covariance_bounds():
    logp, adv, mask = cov_batch()
    gen = torch.Generator().manual_seed(0)
    loss, m = clip_cov_loss(logp, logp.detach(), adv, mask, clip_cov_ratio=0.25, clip_cov_bounds=(1.0, 5.0),
                            generator=gen)
    # on policy r = 1: per-token -A = -2, -2, 2, 2; token 0 (cov 2 in (1, 5)) is cut: (0 - 2 + 2 + 2) / 4
    assert loss.item() == pytest.approx(0.5, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, 0.5, 0.5]], dtype=torch.float64), **TIGHT)
    assert m["cov_cut_frac"].item() == pytest.approx(0.25)
    # bounds that hold no covariance: nothing is cut, PPO's loss
    full, m = clip_cov_loss(logp, logp.detach(), adv, mask, clip_cov_ratio=0.25, clip_cov_bounds=(3.0, 5.0),
                            generator=gen)
    assert full.item() == pytest.approx(0.0, abs=1e-12) and m["cov_cut_frac"].item() == 0.0


def test_clip_cov_leaves_clipped_tokens_alone_and_draws_from_its_generator():
    logp, adv, mask = cov_batch()
    old = logp.detach().clone()
    old[0, 0] -= math.log(1.5)  # token 0: r = 1.5 > 1.2 with A > 0, already clipped by PPO
    _, m = clip_cov_loss(logp, old, adv, mask, clip_cov_ratio=0.25, generator=torch.Generator().manual_seed(0))
    assert m["cov_cut_frac"].item() == 0.0 and m["clip_frac"].item() == pytest.approx(0.25)
    # three tokens in (-3, 3), one cut: which one comes from the generator, the same for the same seed
    cuts = []
    for seed in (0, 0, 1, 2, 3):
        lp = leaf([[-0.5, -2.5, -1.5, -1.5]])
        clip_cov_loss(lp, lp.detach(), adv, mask, clip_cov_ratio=0.25, clip_cov_bounds=(-3.0, 3.0),
                      generator=torch.Generator().manual_seed(seed))[0].backward()
        assert int((lp.grad == 0).sum()) == 1
        cuts.append(int((lp.grad == 0).nonzero()[0, 1]))
    assert cuts[0] == cuts[1] and len(set(cuts)) > 1


def test_kl_cov_penalises_the_largest_covariance_token():
    logp, adv, mask = cov_batch()
    lr = torch.tensor([[0.1, 0.2, -0.1, 0.0]], dtype=torch.float64)
    loss, m = kl_cov_loss(logp, logp.detach() - lr, adv, mask, kl_cov_ratio=0.25, kl_cov_coef=1.0)
    r = [math.exp(x) for x in lr[0].tolist()]
    per = [-2 * r[0] + 0.1, -2 * r[1], 2 * r[2], 2 * r[3]]  # token 0 (cov 2) gets + |log r|
    assert loss.item() == pytest.approx(sum(per) / 4, abs=1e-12)
    loss.backward()
    grads = [-2 * r[0] + 1.0, -2 * r[1], 2 * r[2], 2 * r[3]]  # d|lr|/dlogp = sign(lr) = 1 at token 0
    torch.testing.assert_close(logp.grad, torch.tensor([grads], dtype=torch.float64) / 4, **TIGHT)
    assert m["cov_penalised_frac"].item() == pytest.approx(0.25) and m["clip_frac"].item() == 0.0
    off, _ = kl_cov_loss(logp, logp.detach() - lr, adv, mask, kl_cov_ratio=0.0)
    assert off.item() == pytest.approx((per[0] - 0.1 + sum(per[1:])) / 4, abs=1e-12)


def test_gmpo_clips_each_token_in_log_space_and_takes_the_geometric_mean():
    lr = torch.tensor([[0.5, -0.1, 9.0], [0.3, -0.5, 9.0]], dtype=torch.float64)  # last column is padding
    logp = leaf([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    old = logp.detach() - lr
    adv = torch.tensor([[1.0, 1.0, 5.0], [-2.0, -2.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    loss, m = gmpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg="seq_mean_token_mean")
    # A > 0: min(l, clamp l) = 0.2, -0.1 -> mean 0.05; A < 0: max(l, clamp l) = 0.3, -0.2 -> mean 0.05
    e = math.exp(0.05)
    assert loss.item() == pytest.approx((-1.0 * e + 2.0 * e) / 2, abs=1e-12)
    loss.backward()
    # d(-A R)/dlogp_t = -A R / n_tokens where the token's log ratio is unclipped, then / 2 sequences
    grads = [[0.0, -e / 4, 0.0], [e / 2, 0.0, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(grads, dtype=torch.float64), **TIGHT)
    assert m["clip_frac"].item() == pytest.approx(0.5)


def test_vespo_weighs_reinforce_by_the_gamma_function_of_the_sequence_ratio():
    lr = torch.tensor([[0.1, 0.2], [-0.2, 0.0]], dtype=torch.float64)
    logp = leaf([[-1.0, -2.0], [-0.5, -1.5]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, m = vespo_loss(logp, logp.detach() - lr, adv, mask, vespo_k=(2.0, 3.0), vespo_lambda=(3.0, 2.0))
    phi0 = math.exp(3.0 + 2.0 * 0.3 - 3.0 * math.exp(0.3))  # log w = 0.1 + 0.2, A >= 0: k 2, lambda 3
    phi1 = math.exp(2.0 + 3.0 * -0.2 - 2.0 * math.exp(-0.2))  # log w = -0.2, A < 0: k 3, lambda 2
    per = [-phi0 * -1.0, -phi0 * -2.0, phi1 * -0.5, phi1 * -1.5]
    assert loss.item() == pytest.approx(sum(per) / 4, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-phi0, -phi0], [phi1, phi1]], dtype=torch.float64) / 4,
                               **TIGHT)
    # on policy phi(1) = 1: REINFORCE
    lp = leaf([[-1.0, -2.0]])
    _, m = vespo_loss(lp, lp.detach(), adv[:1], mask[:1])
    assert m["phi_mean"].item() == pytest.approx(1.0, abs=1e-12)


def test_every_table_row_names_keywords_its_loss_takes():
    common = {"eps_low", "eps_high", "agg", "is_weights", "num_tokens", "num_seqs", "max_len"}
    for name, spec in POLICY_LOSSES.items():
        params = set(inspect.signature(spec.loss).parameters)
        assert common <= params, name
        assert set(spec.options) <= params, name
        assert "arXiv:" in spec.doc, name


@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES if n not in ("ppo", "gspo")])
def test_is_weights_and_masked_padding(name):
    """Weights multiply the per-token loss; junk in padded positions changes nothing."""
    spec = POLICY_LOSSES[name]
    torch.manual_seed(0)
    logp = leaf((torch.randn(3, 5) * 0.3 - 1.0).tolist())
    old = logp.detach() + torch.randn(3, 5, dtype=torch.float64) * 0.1
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    opts = spec.options_from({"sapo_temperatures": (1.0, 1.05), "clip_cov_ratio": 0.2, "clip_cov_bounds": (-9, 9),
                              "kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "vespo_k": (2.0, 3.0),
                              "vespo_lambda": (3.0, 2.0), "generator": None})
    if "generator" in opts:
        opts["generator"] = torch.Generator().manual_seed(0)
    base, _ = spec.loss(logp, old, adv, mask, **opts)
    junk_old, junk_adv = old.clone(), adv.clone()
    junk_old[~mask], junk_adv[~mask] = 50.0, 1e6
    if "generator" in opts:
        opts["generator"] = torch.Generator().manual_seed(0)
    junk, _ = spec.loss(logp, junk_old, junk_adv, mask, **opts)
    assert junk.item() == pytest.approx(base.item(), abs=1e-9)
    if "generator" in opts:
        opts["generator"] = torch.Generator().manual_seed(0)
    doubled, _ = spec.loss(logp, old, adv, mask, is_weights=torch.full_like(adv, 2.0), **opts)
    assert doubled.item() == pytest.approx(2 * base.item(), abs=1e-9)
