import threading

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rewards.guard import TimeLimitedReward


def _ok(queries, prompts, labels, **kw):
    r = torch.tensor([float(len(q)) for q in queries])
    return RewardOutput(r, r, {"n": torch.tensor([float(kw["k"])] * len(queries))})


def test_passes_results_and_kwargs_through():
    out = TimeLimitedReward(_ok, 5.0, "ok.py")(["ab", "c"], ["", ""], [None, None], k=3)
    assert out.rewards.tolist() == [2.0, 1.0] and out.extra_logs["n"].tolist() == [3.0, 3.0]
    assert TimeLimitedReward(_ok, None, "ok.py")(["abc"], [""], [None], k=1).rewards.tolist() == [3.0]


def test_reraises_the_functions_error():
    def bad(*a, **k):
        raise RewardError("reward function bad.py raised KeyError")

    with pytest.raises(RewardError, match="bad.py raised KeyError"):
        TimeLimitedReward(bad, 5.0, "bad.py")(["a"], [""], [None])


def test_hanging_function_times_out():
    release = threading.Event()

    def hang(*a, **k):
        release.wait(10)

    with pytest.raises(RewardError, match=r"hang.py did not return within 0.05 s for a batch of 1 queries"):
        TimeLimitedReward(hang, 0.05, "hang.py")(["a"], [""], [None])
    release.set()
