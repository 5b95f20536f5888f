"""distributed.fsdp_checkpoint in one process (a 1-rank gloo group, plain modules): the sharded
checkpoint round trip continues identically, a failed write is one CheckpointError that keeps the
previous checkpoint, torn temporary folders are removed, and each checkpointer refuses the other's
checkpoints. The 2-rank kill/resume and resharding runs are tests/integration/test_fsdp_resume.py."""

import errno
import json

import pytest
import torch
import torch.distributed as dist

from rlhfkit.distributed import fsdp_checkpoint as fc
from rlhfkit.errors import CheckpointError
from rlhfkit.trainers import checkpoint as ck
from rlhfkit.trainers.learner import Learner

MUON = dict(lr=0.02, momentum=0.95, ns_steps=5, nesterov=True)


@pytest.fixture(scope="module", autouse=True)
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Trainer:
    """The trainer side of a checkpointer: a policy with an EMA and a critic, each with AdamW (`muon`: Muon
    for their weight matrices, AdamW for their biases)."""

    def __init__(self, seed: int, muon: bool = False):
        torch.manual_seed(seed)
        self.policy, self.critic = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1)
        m = MUON if muon else None
        self.learner = Learner(self.policy, lr=0.1, ema_beta=0.5, total_steps=10, warmup_steps=2, scheduler="cosine",
                               muon=m)
        self.critic_learner = Learner(self.critic, lr=0.05, muon=m)
        self.step = 0

    def train_step(self) -> None:
        x = torch.randn(4, 3)  # the global RNG: restored by the checkpoint
        for module, learner in ((self.policy, self.learner), (self.critic, self.critic_learner)):
            learner.backward(module(x).square().sum())
            learner.step()
        self.step += 1

    def state_dict(self) -> dict:
        return {"step": self.step, "learner": self.learner.state_dict(),
                "critic_learner": self.critic_learner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        self.learner.load_state_dict(state["learner"])
        self.critic_learner.load_state_dict(state["critic_learner"])

    def checkpoint_modules(self) -> dict:
        return {"model": (self.policy, None), "critic": (self.critic, None)}

    def checkpoint_learners(self) -> dict:
        return {"learner": ("model", self.learner), "critic_learner": ("critic", self.critic_learner)}

    def can_checkpoint(self) -> bool:
        return True


@pytest.mark.parametrize("muon", [False, True], ids=["adam", "muon"])
def test_round_trip_continues_identically_and_prunes(tmp_path, muon):
    ckpt = fc.ShardedCheckpointer(tmp_path, save_steps=1, max_num=2, rank=0, world_size=1)
    a = Trainer(seed=0, muon=muon)
    for _ in range(3):
        a.train_step()
        ckpt.periodic(a, a.step, {})
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000003", "step_00000002"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000003"
    path, step = ck.latest_good(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert step == 3 and manifest["world_size"] == 1
    assert sorted(manifest["files"]) == ["rank_00000/state.json", "rank_00000/state.safetensors",
                                         "shards/shard-00001-model-00001-of-00001.safetensors"]
    for _ in range(2):  # the uninterrupted run (the global RNG is the one of the checkpoint's step)
        a.train_step()
    b = Trainer(seed=1, muon=muon)  # other initial weights, another RNG state
    ckpt.load(b, path)
    for _ in range(2):
        b.train_step()
    assert b.step == 5 and b.learner.steps == 5
    for x, y in ((a.policy, b.policy), (a.critic, b.critic)):
        assert all(torch.equal(p, q) for p, q in zip(x.parameters(), y.parameters(), strict=True))
    assert all(torch.equal(e, f) for e, f in zip(a.learner.ema, b.learner.ema, strict=True))
    sa, sb = a.learner.optimizer.state_dict(), b.learner.optimizer.state_dict()
    assert all(torch.equal(sa["state"][i]["exp_avg_sq"], sb["state"][i]["exp_avg_sq"]) for i in sa["state"])
    assert a.learner.scheduler.get_last_lr() == b.learner.scheduler.get_last_lr()
    if muon:  # the matrices' momentum is in the shards, read back; an AdamW run refuses the checkpoint
        ma, mb = a.learner.muon.state_dict()["state"], b.learner.muon.state_dict()["state"]
        assert ma and all(torch.equal(ma[i]["momentum_buffer"], mb[i]["momentum_buffer"]) for i in ma)
        assert a.learner.schedulers[-1].get_last_lr() == b.learner.schedulers[-1].get_last_lr()
        with pytest.raises(CheckpointError, match="written with the muon optimizer, this run uses adam"):
            ckpt.load(Trainer(seed=2), path)


def test_failed_write_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt = fc.ShardedCheckpointer(tmp_path, save_steps=1, max_num=2, rank=0, world_size=1)
    t = Trainer(seed=0)
    t.train_step()
    ckpt.save(t)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fc, "write_state", full)
    t.train_step()
    with pytest.raises(CheckpointError) as info:
        ckpt.save(t)
    message = str(info.value)
    assert "\n" not in message and "No space left on device" in message
    assert "free disk space" in message and "last good checkpoint: " in message and "step_00000001" in message
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000001"]
    assert not list(tmp_path.glob(".tmp*")) and ck.verify(tmp_path / "step_00000001") is None


def test_torn_temp_folders_are_removed_at_start_and_formats_do_not_mix(tmp_path):
    torn = tmp_path / ".tmp.step_00000002.fsdp"
    (torn / "shards").mkdir(parents=True)
    ckpt = fc.ShardedCheckpointer(tmp_path, save_steps=1, max_num=2, rank=0, world_size=1)
    assert not torn.exists()
    t = Trainer(seed=0)
    t.train_step()
    sharded = ckpt.save(t)
    with pytest.raises(CheckpointError, match="holds FSDP shards.*--fsdp.enable true"):
        ck.load_checkpoint(sharded, t.checkpoint_modules())
    single = ck.save_checkpoint(tmp_path / "single", 1, {"trainer": t.state_dict(), "rng": ck.rng_state()},
                                t.checkpoint_modules(), 1)
    with pytest.raises(CheckpointError, match="written by a single process.*without --fsdp.enable"):
        ckpt.load(t, single)


def test_tied_weights_are_stored_once_and_restored_under_both_names():
    from rlhfkit.distributed.fsdp_checkpoint import tied_names, untied

    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight  # tied, as SmolLM2's LM head
    model = torch.nn.ModuleDict({"embed": emb, "head": head, "other": torch.nn.Linear(3, 3)})
    state = model.state_dict()
    assert tied_names(state) == {"head.weight": "embed.weight"}
    assert set(untied(state)) == {"embed.weight", "other.weight", "other.bias"}
