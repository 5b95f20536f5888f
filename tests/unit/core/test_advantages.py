import dataclasses
import math
import random

import pytest
import torch

from rlhfkit.core import (
    ESTIMATORS,
    GROUP_BASELINES,
    EstimatorSpec,
    compute_advantages,
    discounted_returns,
    gae,
    group_baseline,
    token_rewards,
)

ATOL = dict(atol=1e-6, rtol=0)


# ---------------------------------------------------------------- plain-loop references


def ref_group_baseline(scores, ids, method):
    scores, ids = scores.tolist(), ids.tolist()
    out = []
    for i, r in enumerate(scores):
        grp = [scores[j] for j in range(len(scores)) if ids[j] == ids[i]]
        n, mean = len(grp), sum(grp) / len(grp)
        if method == "none":
            out.append(r)
        elif method == "mean":
            out.append(r - mean)
        elif method == "rloo":
            out.append(r - (sum(grp) - r) / (n - 1))
        elif method == "group_norm":
            if n == 1 or max(grp) == min(grp):
                out.append(0.0)
            else:
                std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (n - 1))
                out.append((r - mean) / (std + 1e-9))
        elif method == "batch_std":
            m = sum(scores) / len(scores)
            std = math.sqrt(sum((x - m) ** 2 for x in scores) / (len(scores) - 1))
            out.append(0.0 if max(scores) == min(scores) else (r - mean) / (std + 1e-9))
    return torch.tensor(out, dtype=torch.float64)


def ref_compute(estimator, rewards, mask, ids, gamma, lam, values, kl, kl_coef, whiten, clip):
    """OpenRLHF's order, one sample and one token at a time."""
    baseline = {"gae": "none", "reinforce": "none", "reinforce_baseline": "mean", "rloo": "rloo",
                "group_norm": "group_norm", "dr_grpo": "mean", "group_mean_batch_std": "batch_std"}[estimator]
    shaped = ref_group_baseline(rewards, ids, baseline).tolist()
    if clip is not None:
        shaped = [min(max(r, clip[0]), clip[1]) for r in shaped]
    B, T = mask.shape
    m = mask.tolist()
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    if estimator != "gae" and estimator != "reinforce":
        gamma = 1.0
    for b in range(B):
        last = max(t for t in range(T) if m[b][t])
        tok = [(-kl_coef * float(kl[b, t]) if kl is not None else 0.0) if m[b][t] else 0.0 for t in range(T)]
        tok[last] += shaped[b]
        if estimator == "gae":
            v = [float(values[b, t]) if m[b][t] else 0.0 for t in range(T)]
            a = 0.0
            for t in reversed(range(T)):
                nv = v[t + 1] if t + 1 < T else 0.0
                a = tok[t] + gamma * nv - v[t] + gamma * lam * a
                adv[b][t], ret[b][t] = a, a + v[t]
        else:
            g = 0.0
            for t in reversed(range(T)):
                g = tok[t] + gamma * g
                adv[b][t] = ret[b][t] = g
    if estimator in ("gae", "reinforce", "reinforce_baseline") and whiten:
        vals = [adv[b][t] for b in range(B) for t in range(T) if m[b][t]]
        mean = sum(vals) / len(vals)
        var = sum((x - mean) ** 2 for x in vals) / len(vals)
        scale = 1.0 if whiten == "mean" else 1.0 / math.sqrt(max(var, 1e-8))
        adv = [[(x - mean) * scale for x in row] for row in adv]
    adv = [[adv[b][t] if m[b][t] else 0.0 for t in range(T)] for b in range(B)]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def make_batch(seed=0, B=10, T=7):
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([7, 7, 7, 3, 3, 42, 42, 42, 42, 3])  # unequal group sizes
    perm = torch.randperm(B, generator=g)
    ids = ids[perm]
    rewards = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    mask[0, 1] = False  # multi-turn hole: an environment token inside the response
    mask[0, 0] = True
    mask[0, 2:] = True
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    kl = torch.randn(B, T, generator=g, dtype=torch.float64).abs() * 0.1
    return rewards, mask, ids, values, kl


# ---------------------------------------------------------------- hand-computed values


def test_discounted_returns_seed_example():
    out = discounted_returns(torch.tensor([[0.0, 0.0, 3.0]]), torch.ones(1, 3, dtype=torch.bool), 0.9)
    torch.testing.assert_close(out, torch.tensor([[2.43, 2.7, 3.0]]), **ATOL)


def test_discounted_returns_hole_is_a_time_step():
    mask = torch.tensor([[True, False, True]])
    out = discounted_returns(torch.tensor([[0.0, 5.0, 3.0]]), mask, 0.9)  # the 5 is masked away
    torch.testing.assert_close(out, torch.tensor([[2.43, 2.7, 3.0]]), **ATOL)


def test_gae_two_steps_by_hand():
    # r = [0, 1], V = [0.5, 0.2], gamma 0.9, lam 0.8
    # delta_1 = 1 - 0.2 = 0.8; A_1 = 0.8
    # delta_0 = 0 + 0.9 * 0.2 - 0.5 = -0.32; A_0 = -0.32 + 0.72 * 0.8 = 0.256
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2, dtype=torch.bool), 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.256, 0.8]]), **ATOL)
    torch.testing.assert_close(ret, torch.tensor([[0.756, 1.0]]), **ATOL)


def test_gae_masks_values_and_rewards():
    mask = torch.tensor([[True, True, False]])
    adv, _ = gae(torch.tensor([[0.0, 1.0, 9.0]]), torch.tensor([[0.5, 0.2, 7.0]]), mask, 0.9, 0.8)
    torch.testing.assert_close(adv[:, :2], torch.tensor([[0.256, 0.8]]), **ATOL)


def test_token_rewards_by_hand():
    mask = torch.tensor([[True, True, False, True, False], [False, True, True, False, False]])
    kl = torch.full((2, 5), 0.5)
    out = token_rewards(torch.tensor([2.0, -1.0]), kl, 0.1, mask)
    expected = torch.tensor([[-0.05, -0.05, 0.0, 1.95, 0.0], [0.0, -0.05, -1.05, 0.0, 0.0]])
    torch.testing.assert_close(out, expected, **ATOL)
    torch.testing.assert_close(token_rewards(torch.tensor([2.0, -1.0]), None, 0.0, mask),
                               torch.tensor([[0.0, 0, 0, 2, 0], [0, 0, -1, 0, 0]]))
    with pytest.raises(ValueError, match="configuration error"):
        token_rewards(torch.tensor([2.0, -1.0]), kl, -0.1, mask)


# ---------------------------------------------------------------- group baselines


@pytest.mark.parametrize("method", ["none", "mean", "rloo", "group_norm", "batch_std"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_baseline_matches_loop_with_shuffled_ids(method, seed):
    rng = random.Random(seed)
    ids = [100] * 4 + [-5] * 2 + [9] * 3 + [0] * 5
    rng.shuffle(ids)
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(len(ids), generator=g, dtype=torch.float64)
    ids = torch.tensor(ids)
    torch.testing.assert_close(group_baseline(scores, ids, method), ref_group_baseline(scores, ids, method),
                               atol=1e-9, rtol=0)


def test_group_norm_all_equal_group_is_exactly_zero():
    # in float32 the mean of [0.9, 0.9, 0.9] is not 0.9: the naive formula turns that noise
    # into ~0.81 per member (noise / (noise std + 1e-9)); ours gives exactly 0
    naive = torch.full((3,), 0.9)
    assert ((naive - naive.mean()) / (naive.std() + 1e-9)).abs().min() > 0.5
    scores = torch.tensor([0.9, 0.7, 0.9, 0.9, 0.3, 0.5], dtype=torch.float32)
    ids = torch.tensor([4, 2, 4, 4, 2, 8])
    out = group_baseline(scores, ids, "group_norm")
    assert out[0].item() == 0.0 and out[2].item() == 0.0 and out[3].item() == 0.0
    assert out[5].item() == 0.0  # group of size 1
    # group 2: mean 0.5, unbiased std sqrt(0.08) -> +-0.2 / sqrt(0.08)
    torch.testing.assert_close(out[[1, 4]], torch.tensor([0.2, -0.2]) / math.sqrt(0.08), atol=1e-5, rtol=0)


def test_batch_std_by_hand():
    # groups {1, 0} and {1, 1}: group means 0.5 and 1; the batch [1, 0, 1, 1] has mean 0.75 and
    # unbiased std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5; an all-equal group keeps 0 (its own mean)
    out = group_baseline(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([3, 3, 7, 7]), "batch_std")
    torch.testing.assert_close(out, torch.tensor([1.0, -1.0, 0.0, 0.0]), **ATOL)
    # group_norm divides by each group's std instead: +-0.5 / sqrt(0.5)
    torch.testing.assert_close(group_baseline(torch.tensor([1.0, 0.0]), torch.tensor([3, 3]), "group_norm"),
                               torch.tensor([0.5, -0.5]) / math.sqrt(0.5), **ATOL)
    flat = group_baseline(torch.full((3,), 0.9), torch.tensor([0, 0, 1]), "batch_std")
    assert flat.tolist() == [0.0, 0.0, 0.0]  # all equal: exactly 0, not noise / 1e-9
    assert group_baseline(torch.tensor([2.0]), torch.tensor([0]), "batch_std").tolist() == [0.0]


def test_rloo_needs_two_samples_per_group():
    with pytest.raises(ValueError, match="at least 2"):
        group_baseline(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]), "rloo")


def test_rloo_by_hand():
    out = group_baseline(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([5, 5, 5, 5]), "rloo")
    # 1 - (2 - 1) / 3 = 2/3;  0 - (2 - 0) / 3 = -2/3
    torch.testing.assert_close(out, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]), **ATOL)


def test_unknown_group_baseline_lists_valid():
    with pytest.raises(ValueError) as err:
        group_baseline(torch.ones(2), torch.zeros(2, dtype=torch.long), "median")
    for name in GROUP_BASELINES:
        assert name in str(err.value)


# ---------------------------------------------------------------- compute_advantages


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("whiten", [True, "mean", False])
def test_compute_advantages_matches_openrlhf_order(estimator, whiten):
    rewards, mask, ids, values, kl = make_batch()
    kw = dict(gamma=0.95, lam=0.9, kl_coef=0.05, whiten=whiten, reward_clip=(-0.8, 0.8))
    adv, ret = compute_advantages(estimator, rewards, mask, ids, values=values, kl=kl, **kw)
    ref_adv, ref_ret = ref_compute(estimator, rewards, mask, ids, kw["gamma"], kw["lam"], values, kl,
                                   kw["kl_coef"], whiten, kw["reward_clip"])
    torch.testing.assert_close(adv, ref_adv, atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-9, rtol=0)
    assert (adv[~mask] == 0).all()


def test_group_estimators_force_gamma_one():
    rewards, mask, ids, _, _ = make_batch()
    a1, _ = compute_advantages("rloo", rewards, mask, ids, gamma=0.5)
    a2, _ = compute_advantages("rloo", rewards, mask, ids, gamma=1.0)
    assert torch.equal(a1, a2)


def test_reward_clip_comes_after_baseline():
    rewards = torch.tensor([10.0, 0.0])
    mask = torch.ones(2, 1, dtype=torch.bool)
    ids = torch.tensor([0, 0])
    adv, _ = compute_advantages("dr_grpo", rewards, mask, ids, reward_clip=(-1.0, 1.0))
    # mean 5 -> [5, -5] -> clip -> [1, -1]; clipping first would give [0.5, -0.5]
    torch.testing.assert_close(adv, torch.tensor([[1.0], [-1.0]]))


def test_group_norm_end_to_end_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True], [True, True, True]])
    ids = torch.tensor([0, 0, 1, 1])
    adv, ret = compute_advantages("group_norm", rewards, mask, ids, whiten=True)
    a = 0.5 / (math.sqrt(0.5) + 1e-9)
    expected = torch.tensor([[a, a, 0.0], [-a, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected, **ATOL)
    torch.testing.assert_close(ret, expected, **ATOL)


def test_configuration_errors():
    rewards, mask, ids, values, kl = make_batch()
    with pytest.raises(ValueError, match="configuration error"):
        compute_advantages("reinforce", rewards, mask, ids, kl=kl, kl_coef=-0.01)
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", rewards, mask, ids)
    with pytest.raises(ValueError) as err:
        compute_advantages("grpo", rewards, mask, ids)
    for name in ESTIMATORS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="whiten"):
        compute_advantages("reinforce", rewards, mask, ids, whiten="std")
    with pytest.raises(ValueError, match="whiten"):
        compute_advantages("reinforce", rewards, mask, ids, whiten=1)


def test_whiten_is_one_enum_whose_values_are_the_flag_spellings():
    from rlhfkit.core import Whiten

    assert [Whiten.of(v) for v in (True, False, "mean", "true", Whiten.FALSE)] == [
        Whiten.TRUE, Whiten.FALSE, Whiten.MEAN, Whiten.TRUE, Whiten.FALSE]
    rewards, mask = torch.tensor([1.0, 0.0]), torch.ones(2, 1, dtype=torch.bool)
    adv = {w: compute_advantages("reinforce", rewards, mask, None, whiten=w)[0].flatten().tolist() for w in Whiten}
    # returns 1, 0: mean 0.5; std (biased) 0.5
    assert adv == {Whiten.TRUE: [1.0, -1.0], Whiten.MEAN: [0.5, -0.5], Whiten.FALSE: [1.0, 0.0]}


# ---------------------------------------------------------------- the estimator table


def test_estimator_specs_say_what_each_estimator_does():
    def names(prop):
        return [name for name, spec in ESTIMATORS.items() if getattr(spec, prop)]

    assert names("grouped") == ["reinforce_baseline", "rloo", "group_norm", "dr_grpo", "group_mean_batch_std"]
    assert names("force_gamma_one") == names("grouped")
    assert names("needs_critic") == ["gae"]
    assert names("whiten") == ["gae", "reinforce", "reinforce_baseline"]
    assert all(s.baseline in GROUP_BASELINES and s.doc for s in ESTIMATORS.values())


def test_estimator_spec_is_frozen_keyword_only_and_checks_its_baseline():
    spec = EstimatorSpec(baseline="mean", force_gamma_one=True, whiten=False, needs_critic=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.whiten = True
    with pytest.raises(TypeError):
        EstimatorSpec("mean", True, False, False)
    with pytest.raises(ValueError, match="unknown group baseline 'median'; valid: none, mean, rloo, group_norm"):
        EstimatorSpec(baseline="median", force_gamma_one=True, whiten=False, needs_critic=False)


# ---------------------------------------------------------------- dense (process) rewards


def test_token_rewards_adds_dense_rewards_at_action_tokens():
    mask = torch.tensor([[True, True, True, False]])
    kl = torch.tensor([[1.0, 2.0, 0.0, 9.0]])
    dense = torch.tensor([[0.2, 0.0, 0.4, 5.0]])  # 5.0 sits on a non-action token: dropped
    out = token_rewards(torch.tensor([1.0]), kl, 0.1, mask, dense_rewards=dense)
    # -0.1 * kl + dense, and the scalar 1 on the last action token
    torch.testing.assert_close(out, torch.tensor([[0.1, -0.2, 1.4, 0.0]]), **ATOL)


def test_dense_rewards_reinforce_by_hand():
    mask = torch.tensor([[True, True, True, False]])
    kl = torch.tensor([[1.0, 2.0, 0.0, 9.0]])
    dense = torch.tensor([[0.2, 0.0, 0.4, 5.0]])
    adv, ret = compute_advantages("reinforce", torch.tensor([1.0]), mask, None, gamma=0.5, kl=kl,
                                  kl_coef=0.1, whiten=False, dense_rewards=dense)
    # token rewards [0.1, -0.2, 1.4, 0]; G_2 = 1.4, G_1 = -0.2 + 0.5 * 1.4 = 0.5,
    # G_0 = 0.1 + 0.5 * 0.5 = 0.35
    torch.testing.assert_close(ret, torch.tensor([[0.35, 0.5, 1.4, 0.0]]), **ATOL)
    torch.testing.assert_close(adv, torch.tensor([[0.35, 0.5, 1.4, 0.0]]), **ATOL)


def test_dense_rewards_gae_by_hand():
    mask = torch.ones(1, 3, dtype=torch.bool)
    values = torch.tensor([[0.5, 0.0, 1.0]])
    dense = torch.tensor([[1.0, 0.0, 0.0]])
    adv, ret = compute_advantages("gae", torch.tensor([1.0]), mask, None, gamma=0.5, lam=0.5,
                                  values=values, whiten=False, dense_rewards=dense)
    # r = [1, 0, 1]; delta_2 = 1 - 1 = 0, delta_1 = 0 + 0.5 * 1 - 0 = 0.5,
    # delta_0 = 1 + 0.5 * 0 - 0.5 = 0.5; A_2 = 0, A_1 = 0.5, A_0 = 0.5 + 0.25 * 0.5 = 0.625
    torch.testing.assert_close(adv, torch.tensor([[0.625, 0.5, 0.0]]), **ATOL)
    torch.testing.assert_close(ret, torch.tensor([[1.125, 0.5, 1.0]]), **ATOL)


def test_dense_rewards_are_not_group_shaped_nor_clipped():
    mask = torch.ones(2, 2, dtype=torch.bool)
    dense = torch.tensor([[3.0, 0.0], [0.0, 0.0]])
    adv, _ = compute_advantages("rloo", torch.tensor([1.0, 0.0]), mask, torch.tensor([7, 7]),
                                gamma=0.5, reward_clip=(-1.0, 1.0), dense_rewards=dense)
    # rloo shapes the scalars to [1, -1] (clip leaves them); the dense 3.0 is added as given;
    # gamma forced to 1: sample 0 gets [3 + 1, 1], sample 1 gets [-1, -1]
    torch.testing.assert_close(adv, torch.tensor([[4.0, 1.0], [-1.0, -1.0]]), **ATOL)


def test_dense_rewards_none_or_zero_change_nothing_and_shape_is_checked():
    rewards, mask, ids, values, kl = make_batch()
    for estimator in ESTIMATORS:
        kw = dict(values=values, kl=kl, kl_coef=0.05, gamma=0.9, lam=0.8)
        plain = compute_advantages(estimator, rewards, mask, ids, **kw)
        zeros = torch.zeros_like(kl)
        zero = compute_advantages(estimator, rewards, mask, ids, dense_rewards=zeros, **kw)
        torch.testing.assert_close(plain, zero, atol=0, rtol=0)
    with pytest.raises(ValueError, match="dense_rewards shape"):
        compute_advantages("reinforce", rewards, mask, ids, dense_rewards=torch.zeros(len(mask)))


def test_a_new_estimator_is_one_table_entry(monkeypatch):
    """docs/algorithms.md, "How to add an advantage estimator": one EstimatorSpec is enough."""
    spec = EstimatorSpec(baseline="mean", force_gamma_one=False, whiten=False, needs_critic=False,
                         doc="group mean baseline, discounted, not whitened")
    monkeypatch.setitem(ESTIMATORS, "mean_discounted", spec)
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[True, True], [True, False]])
    adv, ret = compute_advantages("mean_discounted", rewards, mask, torch.tensor([3, 3]), gamma=0.5,
                                  whiten=True)
    # group mean 0.5 -> shaped [0.5, -0.5], each on its row's last action token:
    # token rewards [[0, 0.5], [-0.5, 0]]; gamma 0.5 kept (not forced to 1), whiten ignored:
    # row 0: [0.5 * 0.5, 0.5] = [0.25, 0.5]; row 1: [-0.5, 0]
    torch.testing.assert_close(adv, torch.tensor([[0.25, 0.5], [-0.5, 0.0]]), **ATOL)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5], [-0.5, 0.0]]), **ATOL)
    with pytest.raises(ValueError, match="needs group_ids"):  # grouped: the ids are required
        compute_advantages("mean_discounted", rewards, mask, None)
    with pytest.raises(ValueError, match="valid: gae, .*, group_mean_batch_std, mean_discounted"):
        compute_advantages("mean_discounted2", rewards, mask, None)
