import dataclasses
import math

import pytest
import torch

from rlhfkit.core import (
    AGGREGATIONS,
    IS_KINDS,
    POLICY_LOSSES,
    RATIO_LEVELS,
    PolicyLossSpec,
    behaviour_weights,
    decoupled_policy_loss,
    dpo_loss,
    entropy_from_logits,
    is_weights,
    kto_loss,
    logprobs_from_logits,
    masked_sum,
    pairwise_loss,
    policy_loss,
    sft_loss,
    value_loss,
)


def sig(x):
    """The logistic function."""
    return 1 / (1 + math.exp(-x))

ATOL = dict(atol=1e-6, rtol=0)


# ---------------------------------------------------------------- policy loss


def ref_policy_loss(logp, old, adv, mask, eps_low, eps_high, dual_clip, level, agg, w, max_len):
    """Straightforward loops over sequences and tokens; autograd gives the reference grads."""
    B, T = mask.shape
    rows = []
    for b in range(B):
        toks = [t for t in range(T) if mask[b, t]]
        if level == "sequence" and toks:
            seq_lr = sum(logp[b, t] - old[b, t] for t in toks) / len(toks)
        row = []
        for t in toks:
            if level == "token":
                ratio = torch.exp(torch.clamp(logp[b, t] - old[b, t], -20, 20))
            else:
                ratio = torch.exp(seq_lr)
            a = adv[b, t]
            s1 = ratio * a
            s2 = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a
            val = -torch.minimum(s1, s2)
            if dual_clip is not None and a < 0:
                val = -torch.maximum(torch.minimum(s1, s2), dual_clip * a)
            if w is not None:
                val = val * w[b, t]
            row.append(val)
        rows.append(row)
    live = [r for r in rows if r]
    if agg == "token_mean":
        return sum(sum(r) for r in live) / sum(len(r) for r in live)
    if agg == "seq_mean_token_mean":
        return sum(sum(r) / len(r) for r in live) / len(live)
    if agg == "seq_mean_token_sum":
        return sum(sum(r) for r in live) / len(live)
    return sum(sum(r) / max_len for r in live) / len(live)


def policy_batch(seed=0, B=5, T=6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4).requires_grad_(True)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    mask[2] = False  # a sequence with nothing counted
    w = torch.rand(B, T, generator=g, dtype=torch.float64) + 0.5
    return logp, old, adv, mask, w


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("dual_clip,eps_high,use_w", [(None, None, False), (3.0, 0.28, True), (1.5, None, False)])
def test_policy_loss_value_and_grad_match_loops(agg, level, dual_clip, eps_high, use_w):
    logp, old, adv, mask, w = policy_batch()
    w = w if use_w else None
    kw = dict(eps_low=0.2, eps_high=eps_high, dual_clip=dual_clip, ratio_level=level, agg=agg, is_weights=w)
    loss, metrics = policy_loss(logp, old, adv, mask, max_len=6, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    ref = ref_policy_loss(logp, old, adv, mask, 0.2, eps_high or 0.2, dual_clip, level, agg, w, 6)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)
    assert all(not v.requires_grad for v in metrics.values())
    assert metrics["clip_frac"] > 0  # the batch reaches the clipped branches
    if dual_clip == 1.5 and level == "token":
        assert metrics["dual_clip_frac"] > 0


def test_clip_branches_by_hand():
    # token 0: ratio 1.5, A = +1 -> clipped at 1.2 (no grad); token 1: ratio 0.5, A = -1 -> clipped at 0.8;
    # token 2: ratio 1.1, A = +2 -> inside; token 3: ratio 1.5, A = -1 -> unclipped side wins (min)
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.5]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, m = policy_loss(logp, old, adv, mask)
    per_token = torch.tensor([-1.2, 0.8, -2.2, 1.5], dtype=torch.float64)
    torch.testing.assert_close(loss, per_token.mean(), atol=1e-12, rtol=0)
    loss.backward()
    # d(-ratio*A)/dlogp = -ratio*A for unclipped tokens, 0 for clipped ones; mean over 4
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -2.2 / 4, 1.5 / 4]], dtype=torch.float64))
    assert m["clip_frac"].item() == pytest.approx(0.5)
    torch.testing.assert_close(m["approx_kl"], -logp.detach().mean())
    torch.testing.assert_close(m["ratio_mean"], torch.tensor(4.6 / 4, dtype=torch.float64))


def test_dual_clip_branch_by_hand():
    # ratio 5, A = -1: min(surr1, surr2) = -5; dual clip 3 bounds it at -3 -> loss 3, no grad
    logp = torch.log(torch.tensor([[5.0, 0.9]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = policy_loss(logp, torch.zeros_like(adv), adv, mask, dual_clip=3.0, agg="seq_mean_token_sum")
    torch.testing.assert_close(loss, torch.tensor(3.0 + 0.9, dtype=torch.float64))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.9]], dtype=torch.float64))
    assert m["dual_clip_frac"].item() == 0.5
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, torch.zeros_like(adv), adv, mask, dual_clip=1.0)


def test_gspo_ratio_is_sequence_geometric_mean():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, 9.0], [-0.2, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.ones(2, 3)
    _, m = policy_loss(logp, old, adv, mask, ratio_level="sequence", eps_low=10.0)
    # ratios exp(0.2) on 2 tokens, exp(-0.2/3) on 3 tokens
    expected = (2 * math.exp(0.2) + 3 * math.exp(-0.2 / 3)) / 5
    assert m["ratio_mean"].item() == pytest.approx(expected, abs=1e-6)
    loss, _ = policy_loss(logp, old, adv, mask, ratio_level="sequence", eps_low=10.0, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-(math.exp(0.2) + math.exp(-0.2 / 3)) / 2, abs=1e-6)


def test_policy_loss_unknown_names():
    logp, old, adv, mask, _ = policy_batch()
    with pytest.raises(ValueError, match="sequence"):
        policy_loss(logp, old, adv, mask, ratio_level="segment")
    with pytest.raises(ValueError, match="token_mean"):
        policy_loss(logp, old, adv, mask, agg="mean")


def test_policy_loss_table_gives_the_ratio_level():
    assert {name: spec.ratio_level for name, spec in POLICY_LOSSES.items()} == {
        "ppo": "token", "gspo": "sequence", "cispo": "token", "sapo": "token", "clip_cov": "token",
        "kl_cov": "token", "gmpo": "sequence", "vespo": "sequence"}
    assert all("arXiv:" in spec.doc for spec in POLICY_LOSSES.values())
    logp, old, adv, mask, _ = policy_batch()
    gspo, _ = policy_loss(logp, old, adv, mask, ratio_level=POLICY_LOSSES["gspo"].ratio_level)
    seq, _ = policy_loss(logp, old, adv, mask, ratio_level="sequence")
    assert torch.equal(gspo, seq)


def test_policy_loss_spec_is_frozen_and_checks_its_ratio_level():
    with pytest.raises(dataclasses.FrozenInstanceError):
        POLICY_LOSSES["ppo"].ratio_level = "sequence"
    with pytest.raises(ValueError, match="unknown ratio level 'segment'; valid: token, sequence"):
        PolicyLossSpec(ratio_level="segment")


# ---------------------------------------------------------------- IS weights


def test_is_weights_kinds_by_hand():
    w = torch.tensor([[0.2, 1.0, 3.0, 7.0], [1.1, 1.2, 0.9, 50.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    rollout = torch.zeros_like(w)
    old = torch.log(w)

    tis, m = is_weights(old, rollout, mask, "tis", 0.5, 5.0)
    torch.testing.assert_close(tis, torch.tensor([[0.5, 1.0, 3.0, 5.0], [1.1, 1.2, 0.9, 0.0]]), **ATOL)
    assert m["is_clip_frac"].item() == pytest.approx(2 / 7)

    ice, m = is_weights(old, rollout, mask, "icepop", 0.5, 5.0)
    torch.testing.assert_close(ice, torch.tensor([[0.0, 1.0, 3.0, 0.0], [1.1, 1.2, 0.9, 0.0]]), **ATOL)
    assert m["is_zeroed_frac"].item() == pytest.approx(2 / 7)

    # geometric means: row 0 (0.2*1*3*7)^(1/4) = 4.2^(1/4) ~ 1.43 (kept); row 1 (1.188)^(1/3) kept
    smt, m = is_weights(old, rollout, mask, "seq_mask_tis", 0.5, 5.0)
    torch.testing.assert_close(smt, tis, **ATOL)
    assert m["is_seq_masked_frac"].item() == 0.0
    # tighter bounds: row 0's geo mean 1.43 > 1.3 -> whole row zeroed; row 1's 1.059 kept, 0.9 clamped
    smt, m = is_weights(old, rollout, mask, "seq_mask_tis", 0.95, 1.3)
    torch.testing.assert_close(smt, torch.tensor([[0.0] * 4, [1.1, 1.2, 0.95, 0.0]]), **ATOL)
    assert m["is_seq_masked_frac"].item() == 0.5
    assert not smt.requires_grad


def test_is_weights_unknown_kind():
    with pytest.raises(ValueError) as err:
        is_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "mis", 0.5, 2.0)
    for kind in IS_KINDS:
        assert kind in str(err.value)


# ---------------------------------------------------------------- decoupled PPO


def _decoupled_case():
    prox = torch.log(torch.tensor([[0.5, 0.4, 0.3]]))
    logp = torch.log(torch.tensor([[0.55, 0.2, 0.9]])).requires_grad_()  # ratios 1.1, 0.5, 3 (masked out)
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    mask = torch.tensor([[True, True, False]])
    return logp, prox, adv, mask


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("kind", [None, "tis", "icepop", "seq_mask_tis"])
def test_decoupled_with_behaviour_equal_to_proximal_is_ppo_exactly(agg, kind):
    logp, prox, adv, mask = _decoupled_case()
    kw = dict(eps_low=0.2, eps_high=0.28, agg=agg, num_tokens=2, num_seqs=1, max_len=3)
    ppo, _ = policy_loss(logp, prox, adv, mask, **kw)
    (g_ppo,) = torch.autograd.grad(ppo, logp)
    dec, m = decoupled_policy_loss(logp, prox, prox.clone(), adv, mask, is_kind=kind, is_low=0.5, is_high=2.0, **kw)
    (g_dec,) = torch.autograd.grad(dec, logp)
    assert torch.equal(dec, ppo) and torch.equal(g_dec, g_ppo)
    assert m["behav_weight_mean"].item() == 1.0 and m["rollout_kl"].item() == 0.0


def test_decoupled_behaviour_weights_by_hand():
    # PPO per token (eps 0.2): token 0 r=1.1, A=1 -> -1.1; token 1 r=0.5, A=-1 -> -min(-0.5, -0.8) = 0.8
    logp, prox, adv, mask = _decoupled_case()
    behav = torch.log(torch.tensor([[0.25, 0.8, 0.1]]))  # w = prox / behav = 2, 0.5 (3 masked -> 0)
    w, _ = behaviour_weights(prox, behav, mask)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0]]), **ATOL)
    cases = {None: (-2.2 + 0.4) / 2,                 # untruncated: 2 * -1.1 + 0.5 * 0.8
             "tis": (-1.5 * 1.1 + 0.5 * 0.8) / 2,    # clamp to [0.5, 1.5]: w = 1.5, 0.5
             "icepop": (0.0 + 0.5 * 0.8) / 2}        # outside [0.4, 1.5] zeroed: w = 0, 0.5
    bounds = {None: (0.0, float("inf")), "tis": (0.5, 1.5), "icepop": (0.4, 1.5)}
    for kind, want in cases.items():
        loss, m = decoupled_policy_loss(logp, prox, behav, adv, mask, is_kind=kind, is_low=bounds[kind][0],
                                        is_high=bounds[kind][1], eps_low=0.2)
        assert loss.item() == pytest.approx(want, abs=1e-6), kind
    ppo, _ = policy_loss(logp, prox, adv, mask, eps_low=0.2)
    assert ppo.item() == pytest.approx(-0.15, abs=1e-6)
    # the gradient is w times PPO's: d/dlogp0 of -w0 * r0 * A0 / 2 = -2 * 1.1 / 2 (token 0 unclipped)
    loss, _ = decoupled_policy_loss(logp, prox, behav, adv, mask, eps_low=0.2)
    (g,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(g, torch.tensor([[-1.1, 0.0, 0.0]]), **ATOL)


# ---------------------------------------------------------------- value loss


def test_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 2.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 1.5]])
    returns = torch.tensor([[0.5, 1.0, 0.0]])
    mask = torch.tensor([[True, True, True]])
    # clip 0.2: V_clip = [0.2, 0.0, 1.7]; (V_clip - R)^2 = [0.09, 1, 2.89]; (V - R)^2 = [0.25, 1, 4]
    loss, m = value_loss(values, old, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 1 + 4) / 3)
    assert m["value_clip_frac"].item() == 0.0
    loss2, _ = value_loss(values, old, returns, mask)
    assert loss2.item() == pytest.approx(0.5 * 5.25 / 3)
    # values moved toward the return beyond the clip: clipped term dominates
    loss3, m3 = value_loss(torch.tensor([[0.4]]), torch.tensor([[0.0]]), torch.tensor([[0.5]]),
                           torch.ones(1, 1, dtype=torch.bool), clip=0.2)
    assert loss3.item() == pytest.approx(0.5 * 0.09)
    assert m3["value_clip_frac"].item() == 1.0


# ---------------------------------------------------------------- logits


def test_entropy_matches_direct_formula():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(logits, -1)
    direct = -(p * torch.log(p)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits), direct, **ATOL)
    torch.testing.assert_close(entropy_from_logits(torch.zeros(1, 4)), torch.tensor([math.log(4)]), **ATOL)
    assert entropy_from_logits(logits.bfloat16()).dtype == torch.float32


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_from_logits_matches_log_softmax_and_grad(temperature):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 17, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 17, (3, 5), generator=g)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    ours = logprobs_from_logits(a, labels, temperature=temperature, chunk_size=4)  # 15 rows, ragged chunks
    ref = torch.log_softmax(b.float() / temperature, -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, ref, **ATOL)
    upstream = torch.randn(3, 5, generator=g)
    (ga,) = torch.autograd.grad((ours * upstream).sum(), a)
    (gb,) = torch.autograd.grad((ref * upstream).sum(), b)
    torch.testing.assert_close(ga, gb, **ATOL)
    assert torch.equal(a.detach(), logits)  # caller's logits untouched


def test_logprobs_from_logits_half_precision_upcast():
    logits = torch.randn(2, 4, 9, dtype=torch.bfloat16)
    labels = torch.randint(0, 9, (2, 4))
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(out, ref, **ATOL)


# ---------------------------------------------------------------- supervised and preference


def test_sft_loss():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -4.0, -5.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    loss, m = sft_loss(logp, mask)
    assert loss.item() == pytest.approx(15 / 5)
    loss2, _ = sft_loss(logp, mask, agg="seq_mean_token_mean")
    assert loss2.item() == pytest.approx((1.5 + 4) / 2)


def test_sft_loss_dft_weights_each_token_by_its_detached_probability():
    # p = 0.5 and 0.25: loss (0.5 ln 2 + 0.25 ln 4) / 2 = 0.5 ln 2; d loss / d logp_t = -p_t / 2
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9]])).requires_grad_()
    mask = torch.tensor([[True, True, False]])
    loss, m = sft_loss(logp, mask, dft=True)
    assert loss.item() == pytest.approx(0.5 * math.log(2))
    assert m["nll"].item() == pytest.approx((math.log(2) + math.log(4)) / 2)  # the metric stays the NLL
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -0.125, 0.0]]))


def preference_batch():
    return (torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-2.0, -1.0, -3.5]),
            torch.tensor([-1.5, -1.5, -3.0]), torch.tensor([-1.5, -1.5, -3.0]))


def test_dpo_cdpo_ipo_match_direct_formulas():
    pc, pr, rc, rr = preference_batch()
    h = torch.tensor([1.0, -1.0, 0.5])  # (pc - pr) - (rc - rr)
    beta = 0.1
    loss, m = dpo_loss(pc, pr, rc, rr, beta)
    direct = [-math.log(1 / (1 + math.exp(-beta * x))) for x in h.tolist()]
    assert loss.item() == pytest.approx(sum(direct) / 3, abs=1e-6)
    torch.testing.assert_close(m["chosen_rewards"], beta * torch.tensor([0.5, -0.5, 0.0]), **ATOL)
    torch.testing.assert_close(m["rejected_rewards"], beta * torch.tensor([-0.5, 0.5, -0.5]), **ATOL)
    assert m["accuracy"].item() == pytest.approx(2 / 3)
    assert m["margin"].item() == pytest.approx(beta * 0.5 / 3, abs=1e-7)

    eps = 0.1
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, label_smoothing=eps)
    direct = [-(1 - eps) * math.log(sig(beta * x)) - eps * math.log(sig(-beta * x)) for x in h.tolist()]
    assert loss.item() == pytest.approx(sum(direct) / 3, abs=1e-6)

    loss, _ = dpo_loss(pc, pr, rc, rr, beta, ipo=True)
    direct = [(x - 1 / (2 * beta)) ** 2 for x in h.tolist()]
    assert loss.item() == pytest.approx(sum(direct) / 3, abs=1e-5)


def test_pairwise_loss():
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    loss, m = pairwise_loss(c, r)
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2, abs=1e-6)
    assert m["accuracy"].item() == 0.5
    loss, _ = pairwise_loss(c, r, margin=torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx((math.log(2) + math.log1p(math.exp(1))) / 2, abs=1e-6)


def test_kto_loss_direct_formula_and_empty_sides():
    beta = 0.5
    pc, rc = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])  # logratios 0.5, -1.0
    pr, rr = torch.tensor([-3.0]), torch.tensor([-2.0])  # logratio -1.0
    pk, rk = torch.tensor([-1.0, -2.0]), torch.tensor([-1.2, -2.4])  # KL = mean(0.2, 0.4) = 0.3
    chosen = [1 - sig(beta * (lr - 0.3)) for lr in (0.5, -1.0)]
    rejected = [1 - sig(beta * (0.3 - -1.0))]
    loss, m = kto_loss(pc, pr, pk, rc, rr, rk, beta, desirable_weight=2.0, undesirable_weight=0.5)
    assert loss.item() == pytest.approx((2 * sum(chosen) + 0.5 * rejected[0]) / 3, abs=1e-6)
    assert m["kl"].item() == pytest.approx(0.3, abs=1e-6)
    # negative KL estimate is clamped at 0; no undesirable examples
    empty = torch.zeros(0)
    loss, m = kto_loss(pc, empty, rk, rc, empty, pk, beta)
    assert m["kl"].item() == 0.0
    assert loss.item() == pytest.approx(sum(1 - sig(beta * lr) for lr in (0.5, -1.0)) / 2, abs=1e-6)
    with pytest.raises(ValueError):
        kto_loss(empty, empty, pk, empty, empty, rk, beta)


def test_dpo_loss_is_differentiable():
    pc = torch.tensor([-1.0], requires_grad=True)
    loss, _ = dpo_loss(pc, torch.tensor([-2.0]), torch.tensor([-1.0]), torch.tensor([-1.0]), 0.5)
    loss.backward()
    # d/dpc -log sigmoid(beta h) = -beta * (1 - sigmoid(beta h)), h = 1
    assert pc.grad.item() == pytest.approx(-0.5 * (1 - 1 / (1 + math.exp(-0.5))), abs=1e-6)


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_logprobs_and_entropy_in_one_pass_equal_the_separate_functions(entropy_grad):
    from rlhfkit.core.losses import logprobs_and_entropy

    torch.manual_seed(3)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5))
    logp, ent = logprobs_and_entropy(logits, labels, temperature=0.7, chunk_size=4, entropy_grad=entropy_grad)
    torch.testing.assert_close(logp, logprobs_from_logits(logits, labels, temperature=0.7), **ATOL)
    torch.testing.assert_close(ent, entropy_from_logits(logits / 0.7), **ATOL)
    assert ent.requires_grad == entropy_grad and logp.requires_grad
    if entropy_grad:
        g1, = torch.autograd.grad(ent.sum(), logits)
        g2, = torch.autograd.grad(entropy_from_logits(logits / 0.7).sum(), logits)
        torch.testing.assert_close(g1, g2, **ATOL)



def test_a_new_ratio_level_is_one_table_entry(monkeypatch):
    """docs/algorithms.md, "How to add a policy loss": a new ratio is one RATIO_LEVELS function
    and one PolicyLossSpec naming it."""

    def seq_sum(log_ratio, loss_mask):  # exp of the summed log-ratio of each sequence
        return torch.exp(masked_sum(log_ratio, loss_mask, dim=-1)).unsqueeze(-1).expand_as(log_ratio)

    monkeypatch.setitem(RATIO_LEVELS, "sequence_sum", seq_sum)
    monkeypatch.setitem(POLICY_LOSSES, "seq_sum_po", PolicyLossSpec(ratio_level="sequence_sum"))
    logp = torch.tensor([[0.1, 0.2, 7.0]])
    mask = torch.tensor([[True, True, False]])
    old, adv = torch.zeros(1, 3), torch.ones(1, 3)
    loss, m = policy_loss(logp, old, adv, mask, eps_low=10.0,
                          ratio_level=POLICY_LOSSES["seq_sum_po"].ratio_level)
    # ratio exp(0.1 + 0.2) on both action tokens, inside the clip range: loss -exp(0.3)
    assert loss.item() == pytest.approx(-math.exp(0.3), abs=1e-6)
    assert m["ratio_mean"].item() == pytest.approx(math.exp(0.3), abs=1e-6)
