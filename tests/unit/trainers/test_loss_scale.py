"""Dynamic loss scaling (trainers.loss_scale) and the Learner's float16 steps: DeepSpeed's rules worked out
by hand, an overflow skipping the step, unscaling once per optimizer step, and the state round trip."""

import pytest
import torch

from rlhfkit.config.rl import LossScaleConfig
from rlhfkit.errors import CheckpointError, ConfigError
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.loss_scale import DynamicLossScale, loss_scale_for


def run(scale: DynamicLossScale, overflows: str) -> list[float]:
    """The scale after each update of `overflows` ("x" = an overflow, "." = a good step)."""
    out = []
    for c in overflows:
        scale.update(overflow=c == "x")
        out.append(scale.scale)
    return out


def test_deepspeed_rules_hysteresis_halving_and_window_doubling():
    # 2^3 = 8; the 1st overflow spends the hysteresis, the 2nd halves; the window counts from the last overflow
    assert run(DynamicLossScale(3, window=2, hysteresis=2), "xx..x.x") == [8, 4, 4, 8, 8, 8, 4]
    # after the doubling the hysteresis is 2 again: the overflow at update 5 only spent it, the one at 7 halved
    assert run(DynamicLossScale(16, window=3, hysteresis=1), "...") == [65536, 65536, 131072]  # 3 good steps
    floor = DynamicLossScale(1, window=1000, hysteresis=1, min_scale=1.0)
    assert not floor.at_floor and run(floor, "xx") == [1.0, 1.0] and floor.at_floor


def test_defaults_are_deepspeeds_and_bad_settings_are_config_errors():
    s = DynamicLossScale()
    assert (s.scale, s.window, s.hysteresis, s.min_scale) == (2.0**16, 1000, 2, 1.0)
    scales = run(s, "." * 1000)
    assert scales[998] == 2.0**16 and scales[999] == 2.0**17  # the 1000th good step in a row doubles it
    with pytest.raises(ConfigError, match="window"):
        DynamicLossScale(window=0)


def test_loss_scale_only_for_a_float16_forward():
    on = LossScaleConfig()
    assert isinstance(loss_scale_for("float16", on), DynamicLossScale)
    assert loss_scale_for("bfloat16", on) is None and loss_scale_for("float32", on) is None
    assert loss_scale_for("float16", LossScaleConfig(enable=False)) is None
    s = loss_scale_for("float16", LossScaleConfig(initial_scale_power=4, window=7, hysteresis=3, min_scale=0.5))
    assert (s.scale, s.window, s.hysteresis, s.min_scale) == (16.0, 7, 3, 0.5)


def _fp16_linear() -> torch.nn.Linear:
    lin = torch.nn.Linear(2, 1).to(torch.float16)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.5, -0.25]]))
        lin.bias.fill_(0.0)
    return lin


X = torch.tensor([[1.0, 2.0]])


def test_an_overflow_skips_the_step_lowers_the_scale_and_leaves_the_weights():
    """A loss multiplied by 1e6: its float16 gradient (2e6) times 2^12 overflows to inf (float16 ends at
    65504); the step is skipped, the weights, masters and Adam state stay, the scale halves (hysteresis 1);
    the next step trains."""
    lin = _fp16_linear()
    learner = Learner(lin, lr=0.1, loss_scale=DynamicLossScale(12, hysteresis=1))
    learner.backward(lin(X.half()).float().sum())
    assert learner.step()["loss_scale"] == 2.0**12
    weights, masters = lin.weight.detach().clone(), [m.clone() for m in learner.master]
    adam = learner.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    learner.backward(lin(X.half()).float().sum() * 1e6)
    assert not torch.isfinite(learner.master[0].grad).all()  # the overflow reached the float32 gradient sum
    m = learner.step()
    assert m["loss_scale"] == 2.0**11 and m["skipped_steps"] == 1.0 and learner.steps == 1
    assert torch.equal(lin.weight, weights) and all(torch.equal(a, b) for a, b in zip(learner.master, masters))
    assert torch.equal(learner.optimizer.state_dict()["state"][0]["exp_avg"], adam)
    assert learner.consecutive_skips == 0  # the scale's search, not a NaN loss: --train.max_skipped_steps
    learner.backward(lin(X.half()).float().sum())
    assert learner.step()["skipped_steps"] == 1.0 and not torch.equal(lin.weight, weights)


def test_unscaled_once_per_step_and_clipped_as_the_float32_learner():
    """Two micro-batches (gradients x and 3x of the weight): the float32 sum of the scaled gradients is
    unscaled once, clipped to max_norm 1 and stepped exactly as a float32 Learner steps the same gradients."""
    lin, ref = _fp16_linear(), _fp16_linear().float()
    learner = Learner(lin, lr=0.1, max_norm=1.0, loss_scale=DynamicLossScale(4))
    reference = Learner(ref, lr=0.1, max_norm=1.0)
    for _ in range(3):
        for k in (1.0, 3.0):
            learner.backward(k * lin(X.half()).float().sum())
            reference.backward(k * ref(X).sum())
        assert learner.master[0].grad.tolist() == [[16 * 4.0, 16 * 8.0]]  # scale 2^4 times the sum (4, 8)
        m, r = learner.step(), reference.step()
        assert m["grad_norm"] == r["grad_norm"] == pytest.approx((16 + 64 + 16) ** 0.5)
        assert all(torch.equal(a, b) for a, b in zip(learner.master, reference.params))
    assert lin.weight.dtype == torch.float16 and torch.equal(lin.weight, ref.weight.half())


def test_at_the_floor_overflows_count_toward_the_limit_and_the_state_round_trips():
    lin = _fp16_linear()
    learner = Learner(lin, lr=0.1, max_consecutive_skips=2, loss_scale=DynamicLossScale(0, hysteresis=1))
    learner.backward(lin(X.half()).float().sum() * float("nan"))
    learner.step()
    assert learner.consecutive_skips == 1  # the scale was already 1 = min_scale: a real non-finite loss
    state = learner.state_dict()
    assert state["loss_scale"] == {"scale": 1.0, "hysteresis_left": 1, "iteration": 1, "last_overflow": 0}
    other = Learner(_fp16_linear(), lr=0.1, loss_scale=DynamicLossScale(16))
    other.load_state_dict(state)
    assert other.loss_scale.state_dict() == state["loss_scale"]
    with pytest.raises(CheckpointError, match="written with float16 loss scaling, this run is without it"):
        Learner(_fp16_linear(), lr=0.1).load_state_dict(state)


def test_the_scale_keeps_gradients_below_float16s_range():
    """A loss of 1e-8 x the output: its float16 gradient (1e-8, 2e-8) is below float16's smallest subnormal
    (2^-24 ~ 6e-8) and rounds to 0 unscaled; scaled by 2^16 it is kept and unscaled in float32."""
    plain, scaled = _fp16_linear(), _fp16_linear()
    unscaled_learner = Learner(plain, lr=0.0, max_norm=0.0)
    learner = Learner(scaled, lr=0.0, max_norm=0.0, loss_scale=DynamicLossScale(16))
    unscaled_learner.backward(1e-8 * plain(X.half()).float().sum())
    learner.backward(1e-8 * scaled(X.half()).float().sum())
    assert unscaled_learner.master[0].grad.tolist() == [[0.0, 0.0]]
    assert unscaled_learner.step()["grad_norm"] == 0.0
    # 2^16 x 1e-8 = 6.55e-4 in float16 (spacing 2^-21 there: 0.1% relative), divided by 2^16 in float32
    assert learner.step()["grad_norm"] == pytest.approx(1e-8 * (1 + 4 + 1) ** 0.5, rel=2e-3)
