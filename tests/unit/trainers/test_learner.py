import math

import pytest
import torch

from rlhfkit.trainers.learner import Learner, lr_lambda
from rlhfkit.trainers.rl import RunningMoments


def test_warmup_then_cosine_with_min_lr():
    f = lr_lambda("cosine_with_min_lr", total_steps=12, warmup_steps=2, min_lr_ratio=0.1)
    assert f(0) == pytest.approx(0.5) and f(1) == pytest.approx(1.0)
    assert f(2) == pytest.approx(1.0)  # start of the decay
    assert f(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)
    assert lr_lambda("constant", 10, 0, 0.0)(9) == 1.0
    assert lr_lambda("cosine", 10, 0, 0.5)(10) == pytest.approx(0.0)


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
