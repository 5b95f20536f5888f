import math

import pytest
import torch

from rlhfkit.core import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, approx_kl

# r = ref_logp - logp at logp = 0
R = torch.tensor([[-1.0, 0.5, 0.0, 2.0]])
LOGP = torch.zeros_like(R)
E = math.e

EXPECTED = {
    "k1": [1.0, -0.5, 0.0, -2.0],
    "k2": [0.5, 0.125, 0.0, 2.0],
    "k3": [1 / E, math.exp(0.5) - 1.5, 0.0, E**2 - 3],
    # k3 for r < 0, min(k1, k3) = k1 for r >= 0 (the seed's formula, taken literally)
    "k3_stable": [1 / E, -0.5, 0.0, -2.0],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_estimators_by_hand(name):
    out = approx_kl(LOGP, R, name)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([EXPECTED[name]]), atol=1e-6, rtol=0)


def test_k3_stable_equals_k1_for_nonnegative_r():
    r = torch.linspace(0, 50, 101)[None]
    torch.testing.assert_close(approx_kl(torch.zeros_like(r), r, "k3_stable", clamp=None), -r)


def test_clamp_applies_to_estimate_and_keeps_gradient_finite():
    ref = torch.tensor([[-15.0, 30.0, 200.0]])
    logp = torch.zeros_like(ref, requires_grad=True)
    k1 = approx_kl(logp, ref, "k1")
    torch.testing.assert_close(k1, torch.tensor([[10.0, -10.0, -10.0]]))
    k3 = approx_kl(logp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([[10.0, 10.0, 10.0]]))
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()
    unclamped = approx_kl(torch.zeros(1, 1), torch.tensor([[-15.0]]), "k1", clamp=None)
    assert unclamped.item() == 15.0


def test_half_precision_inputs_computed_in_float32():
    out = approx_kl(torch.zeros(1, 2, dtype=torch.bfloat16), torch.tensor([[0.5, -1.0]], dtype=torch.bfloat16), "k3")
    assert out.dtype == torch.float32


def test_unknown_estimator_lists_valid():
    with pytest.raises(ValueError) as err:
        approx_kl(LOGP, R, "k4")
    for name in KL_ESTIMATORS:
        assert name in str(err.value)


def test_fixed_controller():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 10)
    assert ctl.value == 0.05
    other = FixedKLController(0.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


def test_adaptive_controller_one_update_by_hand():
    ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    ctl.update(9.0, n_steps=500)  # err = clip(0.5) = 0.2 -> 0.1 * (1 + 0.2 * 0.05)
    assert ctl.value == pytest.approx(0.101, abs=1e-12)
    ctl2 = AdaptiveKLController(0.1, 6.0, 10000)
    ctl2.update(torch.tensor(5.4), n_steps=500)  # err = -0.1 -> 0.1 * (1 - 0.005)
    assert ctl2.value == pytest.approx(0.0995, abs=1e-9)


def test_adaptive_controller_resume():
    a = AdaptiveKLController(0.1, 6.0, 10000)
    a.update(9.0, 500)
    state = a.state_dict()
    assert all(type(v) is float for v in state.values())
    b = AdaptiveKLController(1.0, 1.0, 1.0)
    b.load_state_dict(state)
    a.update(3.0, 500)
    b.update(3.0, 500)
    assert a.value == b.value
