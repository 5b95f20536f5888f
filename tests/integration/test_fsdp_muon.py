"""Muon (--actor.optim muon) over FSDP2-sharded parameters: 2 gloo processes step the hidden matrices
as one process does (trainers.sharded_muon), bit for bit on the same gradients. The RL run with it
under torchrun is tests/integration/test_fsdp.py::test_muon_under_fsdp_trains_as_muon_in_one_process."""

from pathlib import Path

import torch
from safetensors.torch import load_file

from rlhfkit.trainers.learner import Learner
from tests.integration.conftest import torchrun_worker, worker_module

WORKER = Path(__file__).with_name("fsdp_muon_worker.py")


def worker():
    return worker_module(WORKER)


def run_worker(out: Path, mode: str) -> dict[str, torch.Tensor]:
    """fsdp_muon_worker.py MODE in 2 torchrun processes; the full state rank 0 wrote."""
    torchrun_worker(WORKER, str(out), mode)
    return load_file(out)


def test_two_ranks_step_muon_as_one_process_bit_for_bit_on_fixed_gradients(tmp_path):
    """Matrices of 5, 4 and 7 rows over 2 ranks (shards of 3 + 2, 2 + 2, 4 + 3 rows): each Muon update is
    gathered and orthogonalised whole, so 3 steps give one process's matrices exactly; the biases
    (AdamW) agree to float rounding. torch.optim.Muon stepping the shards itself does not: its
    Newton-Schulz runs on bfloat16 partial sums of the shards."""
    w = worker()
    model = w.Stack()
    learner = Learner(model, **w.ADAM, max_norm=0.0, muon=w.MUON)
    assert len(learner.muon.param_groups[0]["params"]) == 3  # the three weight matrices
    w.step_fixed(model, learner)
    one = {k: v.detach() for k, v in model.state_dict().items()}
    two = run_worker(tmp_path / "two.safetensors", "exact")
    start = w.Stack().state_dict()
    for name in ("a.weight", "b.weight", "c.weight"):
        assert not torch.equal(one[name], start[name])
        assert torch.equal(two[name], one[name]), name
    for name in ("a.bias", "b.bias", "c.bias"):
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6)
    plain = run_worker(tmp_path / "torch.safetensors", "torch")
    assert any(not torch.equal(plain[n], one[n]) for n in ("a.weight", "b.weight", "c.weight"))
