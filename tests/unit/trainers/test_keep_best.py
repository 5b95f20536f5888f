"""--ckpt.keep_best: the checkpoint of the best evaluation is kept besides the newest --ckpt.max_num,
replaced only by a better one, and a resumed run keeps beating the value it had reached."""

import json

import pytest
import torch

from rlhfkit.errors import CheckpointError
from rlhfkit.trainers import checkpoint as ck


class Toy:
    """A trainer for the Checkpointer: a linear layer whose weight is the step number."""

    def __init__(self):
        self.lin, self.step = torch.nn.Linear(2, 1, bias=False), 0

    def advance(self):
        self.step += 1
        torch.nn.init.constant_(self.lin.weight, float(self.step))

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]

    def checkpoint_modules(self):
        return {"lin": (self.lin, None)}

    def can_checkpoint(self):
        return True


def run(ckpt, toy, evals):
    """One step per entry of `evals` (an eval/loss value, or None: no evaluation at that step)."""
    for loss in evals:
        toy.advance()
        ckpt.periodic(toy, toy.step, {"loss": 9.0, **({} if loss is None else {"eval/loss": loss})})


def best(root):
    manifest = json.loads((root / ck.BEST / ck.MANIFEST).read_text())
    weight = ck.load_checkpoint(root / ck.BEST, {"lin": (torch.nn.Linear(2, 1, bias=False), None)})
    return manifest["step"], manifest["value"], weight["trainer"]["step"]


def test_the_best_evaluation_is_kept_beside_the_newest_and_replaced_only_by_a_better_one(tmp_path):
    ckpt, toy = ck.Checkpointer(tmp_path, save_steps=1, max_num=2, keep_best="eval/loss:min"), Toy()
    run(ckpt, toy, [3.0, 2.0, None, 2.5, 4.0])
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000005", "step_00000004"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000005"  # best/ is never the latest
    assert best(tmp_path) == (2, 2.0, 2)
    lin = torch.nn.Linear(2, 1, bias=False)
    ck.load_checkpoint(tmp_path / ck.BEST, {"lin": (lin, None)})
    assert torch.equal(lin.weight, torch.full((1, 2), 2.0))  # the weights of step 2
    assert ck.latest_good(tmp_path)[1] == 5


def test_max_is_the_default_and_the_metric_may_omit_eval(tmp_path):
    ckpt, toy = ck.Checkpointer(tmp_path, save_steps=-1, max_num=1, keep_best="loss"), Toy()
    run(ckpt, toy, [1.0, 3.0, 2.0])
    assert best(tmp_path) == (2, 3.0, 2)
    assert ck.list_checkpoints(tmp_path) == []  # no periodic checkpoints: only best/


def test_a_resumed_run_keeps_beating_the_best_it_had(tmp_path):
    ckpt, toy = ck.Checkpointer(tmp_path, save_steps=2, max_num=3, keep_best="eval/loss:min"), Toy()
    run(ckpt, toy, [3.0, 1.0, 2.0])  # best at step 2 (1.0); killed after step 3
    again, toy2 = ck.Checkpointer(tmp_path, save_steps=2, max_num=3, keep_best="eval/loss:min"), Toy()
    path, step = ck.latest_good(tmp_path)
    again.load(toy2, path)
    assert step == 2 and again.best == 1.0
    run(again, toy2, [1.5, 0.5])  # steps 3 (worse than 1.0: kept) and 4 (better)
    assert best(tmp_path) == (4, 0.5, 4)
    third = ck.Checkpointer(tmp_path, save_steps=2, max_num=3, keep_best="eval/loss:max")  # another mode
    third.load(Toy(), ck.latest_good(tmp_path)[0])
    assert third.best is None  # a best judged the other way is not this run's


def test_a_missing_metric_names_the_ones_there_are(tmp_path):
    ckpt, toy = ck.Checkpointer(tmp_path, save_steps=-1, max_num=1, keep_best="eval/acc"), Toy()
    toy.advance()
    with pytest.raises(CheckpointError, match=r"no metric 'eval/acc'; it has eval/loss"):
        ckpt.periodic(toy, 1, {"eval/loss": 1.0})
    ckpt.periodic(toy, 1, {"loss": 1.0})  # a step without an evaluation is not judged
    assert ck.parse_keep_best("eval/loss:min") == ("eval/loss", "min")
    assert ck.parse_keep_best("a:b") == ("a:b", "max")
