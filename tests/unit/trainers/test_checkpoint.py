"""Checkpoint files: pickle-free round trip, integrity check, pruning, full disk, learner state."""

import errno
import json
import random

import numpy as np
import pytest
import torch
from safetensors import SafetensorError

from rlhfkit.errors import CheckpointError, TrainingError
from rlhfkit.trainers import checkpoint as ck
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.scoring import RunningMoments


def test_pack_unpack_round_trip_keeps_types_and_bits():
    state = {0: {"step": torch.tensor(3.0), "m": torch.tensor([1.5, -2.0])}, "betas": (0.9, 0.95),
             "name": "x", "none": None, "flag": True, "nan": float("nan"), "arr": np.arange(3, dtype=np.uint32),
             "nested": [1, (2, [3.25])], (1, 2): "tuple key"}
    tensors = {}
    tree = json.loads(json.dumps(ck.pack(state, tensors)))  # through real JSON text
    back = ck.unpack(tree, tensors)
    assert set(back) == set(state)
    assert torch.equal(back[0]["m"], state[0]["m"]) and back[0]["step"].item() == 3.0
    assert back["betas"] == (0.9, 0.95) and isinstance(back["betas"], tuple)
    assert back["nested"] == [1, (2, [3.25])] and back[(1, 2)] == "tuple key"
    assert back["arr"].dtype == np.uint32 and back["arr"].tolist() == [0, 1, 2]
    assert back["none"] is None and back["flag"] is True and back["nan"] != back["nan"]
    with pytest.raises(TypeError, match="cannot checkpoint a object"):
        ck.pack(object(), {})


def test_rng_states_round_trip():
    saved = ck.rng_state()
    a = (random.random(), float(np.random.rand()), float(torch.rand(())))
    tensors = {}
    restored = ck.unpack(json.loads(json.dumps(ck.pack(saved, tensors))), tensors)
    ck.set_rng_state(restored)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == a


def _save(root, step, max_num=2, value=1.0):
    lin = torch.nn.Linear(2, 1)
    torch.nn.init.constant_(lin.weight, value)
    return ck.save_checkpoint(root, step, {"step": step, "w": torch.tensor([value])}, {"lin": (lin, None)}, max_num)


def test_save_load_prune_and_latest(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step, value=float(step))
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000003", "step_00000002"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000003"
    path, step = ck.latest_good(tmp_path)
    assert step == 3
    lin = torch.nn.Linear(2, 1)
    state = ck.load_checkpoint(path, {"lin": (lin, None)})
    assert state["step"] == 3 and torch.equal(state["w"], torch.tensor([3.0]))
    assert torch.equal(lin.weight, torch.full((1, 2), 3.0))


def test_corrupt_or_incomplete_checkpoints_are_skipped(tmp_path, caplog):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    (newest / "lin.safetensors").write_bytes(b"garbage")
    assert ck.latest_good(tmp_path)[1] == 1
    assert "lin.safetensors does not match its checksum" in caplog.text
    (tmp_path / "step_00000001" / "manifest.json").unlink()  # as if killed before the manifest
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        ck.latest_good(tmp_path)
    assert ck.latest_good(tmp_path / "none") is None


def test_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    _save(tmp_path, 1)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", full)
    with pytest.raises(CheckpointError, match="No space left on device.*last good checkpoint: .*step_00000001"):
        _save(tmp_path, 2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000001"]
    assert not list(tmp_path.glob(".tmp*")) and ck.verify(tmp_path / "step_00000001") is None


def _learner(**kw):
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1)
    return lin, Learner(lin, lr=0.1, ema_beta=0.5, total_steps=10, warmup_steps=2, scheduler="cosine", **kw)


def test_learner_state_round_trip_continues_identically(tmp_path):
    x = torch.tensor([[1.0, 2.0, 3.0]])
    lin, learner = _learner()
    for _ in range(2):
        learner.backward(lin(x).sum())
        learner.step()
    ck.save_checkpoint(tmp_path, 2, learner.state_dict(), {"lin": (lin, None)}, 1)
    learner.backward(lin(x).sum())
    learner.step()
    lin2, learner2 = _learner()
    learner2.load_state_dict(ck.load_checkpoint(tmp_path / "step_00000002", {"lin": (lin2, None)}))
    learner2.backward(lin2(x).sum())
    learner2.step()
    assert torch.equal(lin.weight, lin2.weight) and torch.equal(learner.ema[0], learner2.ema[0])
    assert learner2.steps == 3 and learner.scheduler.get_last_lr() == learner2.scheduler.get_last_lr()


def test_nan_loss_skips_steps_and_k_in_a_row_stop(caplog):
    lin, learner = _learner(max_consecutive_skips=2)
    before = lin.weight.detach().clone()
    learner.backward(lin(torch.ones(1, 3)).sum() * float("nan"))
    assert learner.step()["skipped_steps"] == 1.0
    assert torch.equal(lin.weight, before) and learner.steps == 0
    assert "skipped optimizer step 1: non-finite gradient norm (nan)" in caplog.text
    learner.backward(lin(torch.ones(1, 3)).sum())  # a good step resets the streak
    learner.step()
    assert learner.consecutive_skips == 0 and learner.steps == 1
    learner.backward(lin(torch.ones(1, 3)).sum() * float("inf"))
    learner.step()
    learner.backward(lin(torch.ones(1, 3)).sum() * float("nan"))
    with pytest.raises(TrainingError, match="2 optimizer steps in a row had a non-finite"):
        learner.step()
    assert learner.skipped_steps == 3


def test_running_moments_state():
    m = RunningMoments()
    m.update(torch.tensor([1.0, 3.0]))
    m2 = RunningMoments()
    m2.load_state_dict(m.state_dict())
    assert (m2.count, m2.mean, m2.m2) == (2, 2.0, 2.0)


@pytest.mark.parametrize("raised,fix", [
    (OSError(errno.EACCES, "Permission denied"),
     "Permission denied (PermissionError); choose a place you may write to"),
    (OSError(errno.EROFS, "Read-only file system"), "choose a place on a writable file system, then resume"),
    # safetensors' own type for an I/O error only names the errno in its text
    (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "(SafetensorError); free disk space or lower --ckpt.max_num, then resume"),
])
def test_write_errors_say_what_to_do_by_their_cause(tmp_path, monkeypatch, raised, fix):
    _save(tmp_path, 1)

    def fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr(ck, "save_file", fails)
    with pytest.raises(CheckpointError) as e:
        _save(tmp_path, 2)
    assert fix in str(e.value) and "\n" not in str(e.value)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000001"]
