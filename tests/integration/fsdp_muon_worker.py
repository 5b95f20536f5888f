"""Run under torchrun by tests/integration/test_fsdp_muon.py: the Learner with Muon (--actor.optim muon)
over FSDP2-sharded parameters (gloo on CPU). Rank 0 writes the gathered full state to OUT (safetensors).

    torchrun --nproc_per_node 2 tests/integration/fsdp_muon_worker.py OUT exact|torch

exact: `Stack` (matrices of 5x3, 4x5 and 7x4 rows x cols, so a shard of 3 and one of 2 rows too, and
biases), 3 Learner steps whose gradients are set to fixed full matrices (`fixed_grads`), each rank's
rows of them: the steps see the one-process gradients bit for bit. torch: the same with
torch.optim.Muon stepping the sharded matrices itself (what the Learner did without ShardedMuon).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlhfkit.distributed import fsdp  # noqa: E402 - after the checkout is on sys.path
from rlhfkit.trainers.learner import Learner  # noqa: E402 - after the checkout is on sys.path

STEPS = 3
MUON = dict(lr=0.02, momentum=0.95, ns_steps=5, nesterov=True)
ADAM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(3, 5), torch.nn.Linear(5, 4), torch.nn.Linear(4, 7)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def fixed_grads(model: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
    """Step `step`'s full gradient of every parameter (a seeded draw)."""
    gen = torch.Generator().manual_seed(100 + step)
    return {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def set_grads(model: torch.nn.Module, grads: dict[str, torch.Tensor]) -> None:
    """Each parameter's gradient: its part of the full one (a sharded parameter: this rank's rows)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for n, p in model.named_parameters():
        g = grads[n]
        p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None) if isinstance(p, DTensor) else g


def step_fixed(model: torch.nn.Module, learner) -> None:
    for s in range(STEPS):
        set_grads(model, fixed_grads(model, s))
        learner.step()


def main(out: str, mode: str) -> None:
    torch.set_num_threads(1)
    from torch.distributed.fsdp import fully_shard

    rank, _ = fsdp.init_from_torchrun()
    model = Stack()
    for unit in (model.a, model.b, model.c, model):
        fully_shard(unit)
    learner = Learner(model, **ADAM, max_norm=0.0, muon=MUON)
    if mode == "torch":  # the hidden matrices stepped by torch.optim.Muon over the DTensors
        learner.muon = torch.optim.Muon(learner.muon.param_groups[0]["params"], weight_decay=ADAM["weight_decay"],
                                        **MUON)
        learner.optimizers[-1] = learner.muon
    step_fixed(model, learner)
    state = fsdp.full_state_dict(model, rank0_only=True)
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, out)
    fsdp.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
