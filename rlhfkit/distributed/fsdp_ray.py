"""FSDP2 training on Ray: N trainer actors form one process group beside the rollout workers
(`--distributed.backend ray --fsdp.enable true --fsdp.num_ranks N`; OpenRLHF's layout of one actor
per training GPU and separate rollout engines).

    driver ──► trainer actor rank 0 ── RayEnginePool ──► rollout workers
               trainer actor rank 1..N-1  (gloo on CPU, nccl on GPUs; rank 0's address and port)

Every rank runs the RL loop of a `torchrun` FSDP run (distributed/fsdp.py) on the same data:
scoring, experience and checkpoints on every rank, the update data-parallel (each rank its share of
every optimizer step), the policy, reference and critic sharded. What differs is the rollout:

- Only rank 0 talks to the rollout workers. `BroadcastRollouts` (rank 0) hands each batch's
  trajectories to the other ranks (`broadcast_object_list`), whose `ReceivedRollouts` take them; a
  batch rank 0 drew ahead (async training, `PromptStream.peek`) is drawn by every rank at the same
  point, so their prompt streams stay equal. Broadcasts run on the loop's thread only (the async
  look-ahead generates on a background thread but hands over on the loop's).
- Weight sync gathers the full state on rank 0 (`fsdp.full_state_dict`, a collective every rank
  joins: `GatheredState` on rank 0 inside the pool's weight update, `FollowerEngine.update_weights` on
  the others) and rank 0 sends it to the workers. Rank 0 keeps the last gathered state, so a worker
  replaced after dying (possibly from the async look-ahead's thread) gets it without a collective.
- Evaluation samples on rank 0 through the workers; the other ranks get its results (`on_rank0`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from rlhfkit.data.types import Trajectory
from rlhfkit.distributed import fsdp
from rlhfkit.trainers.rl.generate import RolloutSource, Upcoming
from rlhfkit.trainers.rl.stream import PromptBatch


def free_address() -> tuple[str, int]:
    """(this machine's address as Ray knows it, a free TCP port): where rank 0's process group listens."""
    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def init_group(rank: int, world: int, address: tuple[str, int]) -> None:
    """Join the trainer actors' process group (gloo on CPU, nccl on GPUs) at rank 0's `address`."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    host, port = address
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world)


def broadcast(obj=None):
    """`obj` of rank 0 on every rank (a collective; pickled)."""
    box = [obj]
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    dist.broadcast_object_list(box, src=0, device=device)
    return box[0]


class GatheredState:
    """The policy's full state dict on rank 0, gathered at each weight sync (a collective).
    `__call__(full)` is the pool's `state_fn` source on rank 0: at a sync (`full` False) it gathers;
    for a new or replaced worker (`full` True) it returns the last gathered state (gathering only
    when there is none yet, at the pool's creation, which the other ranks' FollowerEngine joins)."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy
        self.last: dict[str, torch.Tensor] | None = None

    def gather(self) -> dict[str, torch.Tensor]:
        state = fsdp.full_state_dict(self.policy, rank0_only=True)
        if dist.get_rank() == 0:
            self.last = state
        return state

    def __call__(self, full: bool) -> dict[str, torch.Tensor]:
        if full and self.last is not None:
            return self.last
        return self.gather()


class FollowerEngine:
    """The engine of ranks > 0: it generates nothing (their trajectories are rank 0's: ReceivedRollouts);
    a weight update joins rank 0's gather of the full state (GatheredState) and sets the version. It
    joins the gather of the pool's creation at once."""

    def __init__(self, policy: torch.nn.Module, version: int = 0):
        self.policy, self._version = policy, version
        fsdp.full_state_dict(policy, rank0_only=True)

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        fsdp.full_state_dict(self.policy, rank0_only=True)
        self._version = version

    def generate(self, *args, **kwargs) -> list[Trajectory]:
        raise RuntimeError("a trainer rank > 0 of an FSDP run on Ray samples nothing: rank 0's trajectories are "
                           "broadcast to it (a bug if this is reached)")


class BroadcastRollouts:
    """Rank 0's rollout source: `source`'s trajectories, broadcast to the other ranks with how many
    batches it drew ahead."""

    def __init__(self, source: RolloutSource):
        self.source = source

    def generate(self, batch: PromptBatch, upcoming: Upcoming | None = None) -> list[Trajectory]:
        drawn = []

        def draw() -> PromptBatch:
            drawn.append(1)
            return upcoming()

        trajs = self.source.generate(batch, draw if upcoming is not None else None)
        broadcast((trajs, len(drawn)))
        return trajs

    def pop_metrics(self) -> dict[str, float]:
        return self.source.pop_metrics()


class ReceivedRollouts:
    """The rollout source of ranks > 0: rank 0's trajectories of each batch; the batches it drew ahead
    are drawn here too (`upcoming`), at the same point of the loop."""

    def generate(self, batch: PromptBatch, upcoming: Upcoming | None = None) -> list[Trajectory]:
        trajs, drawn = broadcast()
        for _ in range(drawn):
            upcoming()
        return trajs

    def pop_metrics(self) -> dict[str, float]:
        return {}


def on_rank0(fn: Callable, rank: int) -> Callable:
    """`fn(*args)` run on rank 0 and its result broadcast: every rank returns rank 0's (a collective)."""

    def shared(*args, **kwargs):
        return broadcast(fn(*args, **kwargs) if rank == 0 else None)

    return shared
