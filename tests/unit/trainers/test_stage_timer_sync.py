"""Stage timers synchronise a CUDA device at both ends of a stage (CUDA runs asynchronously: without it
`time/update` is the time to queue the update's kernels); on the CPU they do not."""

import torch

from rlhfkit.models import precision
from rlhfkit.trainers.rl.loop import StepTimer


def _patched_cuda(monkeypatch) -> list:
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", device)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: events.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2 * 1024**3)
    return events


def test_a_cuda_stage_is_timed_between_two_synchronisations(monkeypatch):
    events = _patched_cuda(monkeypatch)
    cuda = torch.device("cuda", 0)
    timer = StepTimer(device=cuda)
    with timer("update"):
        events.append(("work", None))
    assert [e for e, _ in events] == ["sync", "reset", "work", "sync"]
    assert all(d == cuda for e, d in events if e == "sync")
    assert timer.peaks == {"update": 2.0} and timer.times["update"] >= 0


def test_the_cpu_is_not_synchronised(monkeypatch):
    events = _patched_cuda(monkeypatch)
    with StepTimer()("update"):
        pass
    precision.synchronize(torch.device("cpu"))
    assert events == []
