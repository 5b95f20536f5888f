"""The update reads its metrics back once per update, not per micro-batch: a micro-step's
metric sums stay detached tensors on the policy's device (on CUDA every `float(tensor)` waits for the
queued forward/backward), and `read_once` reads the update's sums in one transfer. Copies to CUDA go from
pinned memory without blocking (`models.precision.to_device`)."""

import sys

import pytest
import torch

from rlhfkit.data.types import Trajectory
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.precision import to_device
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl import update as update_module
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate, read_once

READS = ("item", "tolist", "__float__", "__int__", "__bool__")


def _trajs():
    def traj(prompt, response, group):
        r = torch.tensor(response)
        return Trajectory(torch.tensor(prompt), r, torch.ones(len(r), dtype=torch.bool), torch.zeros(len(r)) - 1.0,
                          "stop", 0, group)
    return [traj([5, 6], [7, 8], 0), traj([5, 6], [9], 0), traj([3, 4, 5], [6, 7, 8], 1), traj([3, 4, 5], [2], 1)]


def _update_reads(micro_batch: int, monkeypatch) -> tuple[int, int, dict]:
    """(reads from update.py's own code in one update, those inside micro_step, the update's metrics)."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    maker = ExperienceMaker(model, None, None, MicroBatcher(tok.pad_token_id, 4), estimator="group_norm", gamma=1.0,
                            lam=1.0, whiten=False, reward_clip=None, kl_estimator="k1", kl_in_reward=True,
                            multi_step=False, temperature=1.0, autocast=None, proximal=True)
    exp = maker(_trajs(), torch.tensor([1.0, 0.0, 0.5, 0.0]), kl_coef=0.0)
    learner = Learner(model, 1e-2, (0.9, 0.95), 1e-8, 0.0, total_steps=10)
    up = PolicyUpdate(model, learner, MicroBatcher(tok.pad_token_id, micro_batch), LossSettings(max_len=4),
                      batch_size=4, max_epochs=1, shuffle_gen=torch.Generator().manual_seed(0), autocast=None)
    calls = {"all": 0, "micro": 0}
    inside = []
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counting(self, *args, _real=real, **kwargs):
            if sys._getframe(1).f_code.co_filename == update_module.__file__:
                calls["all"] += 1
                calls["micro"] += bool(inside)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    real_micro = PolicyUpdate.micro_step

    def micro_step(self, *args, **kwargs):
        inside.append(1)
        try:
            return real_micro(self, *args, **kwargs)
        finally:
            inside.pop()

    monkeypatch.setattr(PolicyUpdate, "micro_step", micro_step)
    try:
        metrics = up(exp, kl_coef=0.0)
    finally:
        monkeypatch.undo()
    return calls["all"], calls["micro"], metrics


def test_reads_do_not_grow_with_the_micro_batches(monkeypatch):
    one, one_micro, m1 = _update_reads(4, monkeypatch)  # 1 micro-batch per step
    four, four_micro, m4 = _update_reads(1, monkeypatch)  # 4 micro-batches per step
    assert one_micro == four_micro == 0  # nothing read inside a micro-step
    assert one == four  # the step's reads do not grow with its micro-batches
    assert m1["optimizer_steps"] == m4["optimizer_steps"] == 1.0
    for key in ("policy_loss", "clip_frac", "ppo_kl", "entropy"):
        assert isinstance(m4[key], float)
        assert m4[key] == pytest.approx(m1[key], abs=1e-5)


def test_read_once_reads_tensors_in_one_transfer(monkeypatch):
    tolist = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: tolist.append(1) or real(self))
    out = read_once({"a": torch.tensor(1.5), "b": 2.0, "c": torch.tensor([3.0]).sum()})
    assert out == {"a": 1.5, "b": 2.0, "c": 3.0} and len(tolist) == 1


def test_to_device_copies_to_cuda_from_pinned_memory_without_blocking(monkeypatch):
    events = []
    t = torch.arange(3)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: events.append("pin") or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **kw: events.append(("to", a, kw)) or self)
    to_device(t, torch.device("cuda", 0))
    assert events == ["pin", ("to", (torch.device("cuda", 0),), {"non_blocking": True})]
    events.clear()
    assert to_device(t, torch.device("cpu")) is t and events == []
