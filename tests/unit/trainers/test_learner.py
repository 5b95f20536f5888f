import math

import pytest
import torch

from rlhfkit.errors import ConfigError
from rlhfkit.trainers.learner import Learner, adam_kernel, clip_grad_norm, lr_lambda
from rlhfkit.trainers.rl.scoring import RunningMoments


def test_warmup_then_cosine_with_min_lr():
    f = lr_lambda("cosine_with_min_lr", total_steps=12, warmup_steps=2, min_lr_ratio=0.1)
    assert f(0) == 0.0 and f(1) == pytest.approx(0.5)  # from 0, as transformers' schedules (OpenRLHF, TRL)
    assert f(2) == pytest.approx(1.0)  # start of the decay
    assert f(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)
    assert lr_lambda("constant", 10, 0, 0.0)(9) == 1.0
    assert lr_lambda("cosine", 10, 0, 0.5)(10) == pytest.approx(0.0)
    linear = lr_lambda("linear", total_steps=10, warmup_steps=2, min_lr_ratio=0.5)  # the floor is cosine_with_min_lr's
    assert [linear(s) for s in (0, 1, 2, 6, 10, 20)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0, 0.0])


def test_non_finite_gradient_skips_the_step():
    lin = torch.nn.Linear(2, 1)
    learner = Learner(lin, lr=0.1)
    before = lin.weight.detach().clone()
    learner.backward((lin(torch.ones(1, 2)) * float("nan")).sum())
    m = learner.step()
    assert m["skipped_steps"] == 1.0 and torch.equal(lin.weight, before)
    learner.backward(lin(torch.ones(1, 2)).sum())
    learner.step()
    assert not torch.equal(lin.weight, before) and learner.steps == 1


def test_ema_tracks_parameters():
    lin = torch.nn.Linear(1, 1, bias=False)
    learner = Learner(lin, lr=1.0, betas=(0.0, 0.0), max_norm=0.0, ema_beta=0.5)
    w0 = lin.weight.item()
    learner.backward(lin(torch.ones(1, 1)).sum())
    learner.step()
    assert learner.ema[0].item() == pytest.approx(0.5 * w0 + 0.5 * lin.weight.item())


def test_running_moments_match_concatenation():
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, -4.0])
    rm = RunningMoments()
    rm.update(a)
    rm.update(b)
    allv = torch.cat([a, b])
    assert rm.mean == pytest.approx(float(allv.mean()))
    assert rm.std == pytest.approx(float(allv.std(unbiased=False)))


def _bf16_weight(value: float) -> torch.nn.Linear:
    lin = torch.nn.Linear(1, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.fill_(value)
    return lin


def test_bf16_parameters_keep_updates_below_their_spacing_in_float32_masters():
    """Adam with betas (0, 0) moves a weight by lr * sign(grad) per step. At 1.0 a bf16 weight's
    spacing is 2^-7: ten steps of lr 1e-4 would round away in bf16; the float32 master keeps them
    and the module gets the master rounded to bf16."""
    lin = _bf16_weight(1.0)
    learner = Learner(lin, lr=1e-4, betas=(0.0, 0.0), eps=0.0, max_norm=0.0)
    for _ in range(10):
        learner.backward(lin(torch.ones(1, 1, dtype=torch.bfloat16)).sum())  # d/dw = 1
        learner.step()
    assert learner.master[0].dtype == torch.float32
    assert learner.master[0].item() == pytest.approx(1.0 - 10 * 1e-4, abs=1e-6)
    assert lin.weight.dtype == torch.bfloat16 and lin.weight.item() == 1.0  # 0.999 rounds to 1.0 in bf16
    for _ in range(90):
        learner.backward(lin(torch.ones(1, 1, dtype=torch.bfloat16)).sum())
        learner.step()
    assert learner.master[0].item() == pytest.approx(0.99, abs=1e-5)
    assert lin.weight.item() == float(torch.tensor(0.99).to(torch.bfloat16))  # 0.98828125


def test_bf16_gradients_sum_over_micro_batches_in_float32():
    """Micro-batch gradients 256 and 1: bf16 would sum them to 256 (spacing 2 at 256), float32 to 257."""
    lin = _bf16_weight(0.5)
    learner = Learner(lin, lr=0.0, max_norm=0.0)
    x = torch.ones(1, 1, dtype=torch.bfloat16)
    learner.backward(256 * lin(x).sum())
    learner.backward(lin(x).sum())
    assert lin.weight.grad is None and learner.master[0].grad.item() == 257.0
    assert learner.step()["grad_norm"] == 257.0


def test_bf16_masters_round_trip_the_state_dict_and_skip_non_finite_steps():
    lin = _bf16_weight(1.0)
    learner = Learner(lin, lr=1e-3, betas=(0.0, 0.0), eps=0.0, max_norm=0.0, ema_beta=0.5)
    learner.backward(lin(torch.ones(1, 1, dtype=torch.bfloat16)).sum())
    learner.step()
    master = learner.master[0].clone()
    learner.backward((lin(torch.ones(1, 1, dtype=torch.bfloat16)) * float("nan")).sum())
    assert learner.step()["skipped_steps"] == 1.0 and torch.equal(learner.master[0], master)
    assert learner.ema[0].dtype == torch.float32 and learner.ema[0].item() == pytest.approx(0.5 + 0.5 * 0.999)
    state = learner.state_dict()
    other_lin = _bf16_weight(1.0)
    other = Learner(other_lin, lr=1e-3, betas=(0.0, 0.0), eps=0.0, max_norm=0.0, ema_beta=0.5)
    other.load_state_dict(state)
    assert torch.equal(other.master[0], master) and other_lin.weight.item() == float(master.to(torch.bfloat16))
    from rlhfkit.errors import CheckpointError
    with pytest.raises(CheckpointError, match="written with bfloat16 parameters, this run has float32"):
        Learner(torch.nn.Linear(1, 1, bias=False), lr=1e-3, ema_beta=0.5).load_state_dict(state)


@pytest.mark.parametrize("kw,cause", [
    (dict(lr=-1.0), "Invalid learning rate: -1.0"),
    (dict(lr=1e-3, betas=(0.9, 1.0)), "Invalid beta parameter at index 1: 1.0"),
    (dict(lr=1e-3, eps=-1e-8), "Invalid epsilon value: -1e-08"),
    (dict(lr=1e-3, weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
])
def test_settings_the_optimizer_refuses_are_a_config_error(kw, cause):
    """The config's ranges refuse these first; a Learner built by hand gets the same one-line error."""
    with pytest.raises(ConfigError) as e:
        Learner(torch.nn.Linear(2, 1), name="critic", **kw)
    assert str(e.value).startswith(f"critic: AdamW refuses its settings (ValueError: {cause}); the learning rate")


def test_plain_parameters_step_with_the_fused_kernel_and_match_the_reference_adamw():
    torch.manual_seed(0)
    ref, lin = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    lin.load_state_dict(ref.state_dict())
    learner = Learner(lin, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, max_norm=0.0)
    assert learner.optimizer.defaults["fused"] is True
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=False)
    for _ in range(5):
        x = torch.randn(3, 8)
        learner.backward(lin(x).square().sum())
        learner.step()
        ref(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
    for a, b in zip(lin.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_fused_kernel_is_not_used_for_tensor_subclasses():
    class Shard(torch.Tensor):  # stands for a DTensor shard, which keeps torch's default path
        pass

    assert adam_kernel([torch.zeros(2)]) == {"fused": True}
    assert adam_kernel([torch.zeros(2).as_subclass(Shard)]) == {}
    assert adam_kernel([torch.zeros(2, dtype=torch.int64)]) == {}
    assert adam_kernel([]) == {}


def _with_grads(scale: float) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in ((3, 4), (5,), (2, 2))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * scale
    params.append(torch.nn.Parameter(torch.zeros(2)))  # no gradient: left out, as torch does
    return params


@pytest.mark.parametrize("scale", [0.01, 10.0])
def test_clip_grad_norm_equals_torchs(scale):
    ours, theirs = _with_grads(scale), _with_grads(scale)
    norm = clip_grad_norm(ours, 1.0)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.equal(norm, expected)
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
    by_hand = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in _with_grads(scale)[:3]))
    assert float(norm) == pytest.approx(by_hand, rel=1e-6)
    if scale == 10.0:  # clipped to norm 1
        clipped = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in ours[:3]))
        assert clipped == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_leaves_gradients_within_the_norm_unwritten():
    params = _with_grads(0.01)
    versions = [p.grad._version for p in params[:3]]
    clip_grad_norm(params, 1.0)
    assert [p.grad._version for p in params[:3]] == versions  # no multiply by 1.0
    clip_grad_norm(params, 1e-4)  # now clipped: written
    assert all(p.grad._version > v for p, v in zip(params[:3], versions, strict=True))
