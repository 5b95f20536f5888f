"""Run under torchrun by tests/integration/test_fsdp_fp16.py: the tiny Llama sharded by
`rlhfkit.distributed.fsdp.shard_model` in float16 (float32 shards gathered in fp16, float32 gradient
reduction: what --actor.dtype float16 becomes under FSDP) under float16 autocast, trained by the Learner
with a dynamic loss scale on this rank's share of a fixed global batch (gloo on CPU).

Step 0's gradient overflows on rank 1 alone (an inf written into one of its gradient shards), then 2
steps train; after step 1 a sharded checkpoint is written (distributed.fsdp_checkpoint) and, after
step 2, a fresh model and Learner load it and take step 2 again. Each rank writes its steps' loss scale
and skip count to OUT.rankR.json; rank 0 writes the full state after step 2 to OUT and the resumed
one to OUT.resumed.

    torchrun --nproc_per_node 2 tests/integration/fsdp_fp16_worker.py OUT [paths] [local]

paths: instead, one loss-scaled step of each sharded path (the policy, a LoRA policy, the critic; clipping
on and off) whose gradient overflows on rank 1 alone; each rank writes the steps' metrics to OUT.rankR.json.
local: the gradient norm taken over this rank's shards only (the cross-rank reduction switched off).
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlhfkit.distributed import fsdp  # noqa: E402 - after the checkout is on sys.path
from rlhfkit.distributed.fsdp_checkpoint import ShardedCheckpointer  # noqa: E402
from rlhfkit.models import tiny_model_and_tokenizer  # noqa: E402
from rlhfkit.models.critic import Critic  # noqa: E402
from rlhfkit.models.lora import add_lora  # noqa: E402
from rlhfkit.models.precision import autocast_ctx, float32_residual, vectors_to_float32  # noqa: E402
from rlhfkit.trainers.learner import Learner  # noqa: E402
from rlhfkit.trainers.loss_scale import DynamicLossScale  # noqa: E402

LR, SIZE = 1e-2, dict(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
OVERFLOW_STEP = 0


def build(world: int):
    """The tiny model and its Learner (2^10 loss scale, hysteresis 1: the first overflow halves it). Over
    `world` > 1 ranks: float32 shards gathered in fp16; in one process: float16 matrices with float32
    masters, norms and residual, as --actor.dtype float16 --actor.autocast float16 runs (api.builder)."""
    model, _ = tiny_model_and_tokenizer(seed=0, **SIZE)
    if world > 1:
        fsdp.shard_model(model, world, mixed_precision="float16")
    else:
        model.half()
        vectors_to_float32(model)
        float32_residual(model)
    model.train()
    scale = DynamicLossScale(initial_scale_power=10, window=1000, hysteresis=1)
    return model, Learner(model, LR, max_norm=1.0, loss_scale=scale)


def global_batch() -> torch.Tensor:
    return torch.randint(4, 80, (4, 8), generator=torch.Generator().manual_seed(3))


def summed_loss(model, ids: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """Next-token cross entropy summed over `ids` [B, T] under float16 autocast, / the GLOBAL token count."""
    with autocast_ctx("float16"):
        logits = model(input_ids=ids).logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                           reduction="sum")
    return ce / total_tokens


def poison(learner) -> None:
    """An inf in the first gradient of `learner` (on a sharded model: in this rank's shard of it)."""
    grad = next(p.grad for p in learner.train_params if p.grad is not None)
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    local.view(-1)[0] = float("inf")


def train(model, learner, rows: torch.Tensor, total_tokens: int, steps, overflow: bool) -> list[dict]:
    """Learner steps `steps` on `rows`; step OVERFLOW_STEP's gradient overflows here when `overflow`."""
    out = []
    for s in steps:
        learner.backward(summed_loss(model, rows, total_tokens))
        if overflow and s == OVERFLOW_STEP:
            poison(learner)
        m = learner.step()
        out.append({"step": s, "loss_scale": m["loss_scale"], "skipped_steps": m["skipped_steps"],
                    "grad_norm": m["grad_norm"]})
    return out


class Trainer:
    """What ShardedCheckpointer needs of a trainer: one module and its Learner."""

    def __init__(self, model, learner, step: int):
        self.model, self.learner, self.step = model, learner, step

    def can_checkpoint(self) -> bool:
        return self.learner.consecutive_skips == 0

    def checkpoint_modules(self) -> dict:
        return {"model": (self.model, None)}

    def checkpoint_learners(self) -> dict:
        return {"learner": ("model", self.learner)}

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state["learner"])


def local_norm_only() -> None:
    """The gradient norm of this rank's shards alone: the cross-rank reduction switched off."""
    from torch.distributed.tensor import DTensor

    from rlhfkit.trainers import learner as module

    total = torch.nn.utils.get_total_norm
    module.torch.nn.utils.get_total_norm = lambda grads, *a, **k: total(
        [g.to_local() if isinstance(g, DTensor) else g for g in grads], *a, **k)


def overflow_paths(rank: int, world: int) -> list[dict]:
    """One Learner step (2^4 loss scale, hysteresis 1) of the sharded policy, LoRA policy and critic, with
    --train.max_norm 0 and 1, each overflowing on rank 1 alone (an inf in its first gradient shard)."""
    out = []
    for kind in ("policy", "lora", "critic"):
        for max_norm in (0.0, 1.0):
            model = tiny_model_and_tokenizer(seed=0, **SIZE)[0]
            model = add_lora(model, 4, 8, "all-linear") if kind == "lora" else model
            if kind == "critic":
                model = fsdp.shard_critic(Critic.from_causal_lm(model), world, "float16")
            else:
                fsdp.shard_model(model, world, "float16")
            scale = DynamicLossScale(initial_scale_power=4, window=1000, hysteresis=1)
            learner = Learner(model, LR, max_norm=max_norm, loss_scale=scale, name=kind)
            ids = global_batch().tensor_split(world)[rank]
            with autocast_ctx("float16"):
                out_ = model(ids, torch.ones_like(ids)) if kind == "critic" else model(input_ids=ids).logits
            learner.backward(out_.float().square().mean())
            if rank == 1:
                poison(learner)
            m = learner.step()
            out.append({"path": kind, "max_norm": max_norm, "loss_scale": m["loss_scale"],
                        "skipped_steps": m["skipped_steps"]})
    return out


def main(out: str, paths: bool = False, local: bool = False) -> None:
    torch.set_num_threads(1)
    rank, world = fsdp.init_from_torchrun()
    if local:
        local_norm_only()
    if paths:
        Path(f"{out}.rank{rank}.json").write_text(json.dumps(overflow_paths(rank, world)))
        fsdp.finish()
        return
    ids = global_batch()
    rows, total = ids.tensor_split(world)[rank], ids[:, 1:].numel()
    model, learner = build(world=world)
    seen = []  # the dtype the layers' weights are gathered in for the forward
    model.model.layers[0].mlp.register_forward_pre_hook(lambda m, args: seen.append(str(m.up_proj.weight.dtype)))
    record = train(model, learner, rows, total, range(2), overflow=rank == 1)
    ckpt = ShardedCheckpointer(Path(out + ".ckpt"), save_steps=1, max_num=1, rank=rank, world_size=world)
    path = ckpt.save(Trainer(model, learner, step=2))
    at_save = learner.loss_scale.state_dict()
    record += train(model, learner, rows, total, [2], overflow=False)
    state = fsdp.full_state_dict(model, rank0_only=True)
    model2, learner2 = build(world=world)
    ckpt.load(Trainer(model2, learner2, step=2), path)
    resumed_scale = learner2.loss_scale.state_dict()
    resumed = train(model2, learner2, rows, total, [2], overflow=False)
    state2 = fsdp.full_state_dict(model2, rank0_only=True)
    Path(f"{out}.rank{rank}.json").write_text(json.dumps({
        "steps": record, "gathered": sorted(set(seen)), "resumed": resumed, "scale_at_resume": resumed_scale,
        "scale_at_save": at_save,
        "final_scale": learner.loss_scale.state_dict(), "resumed_final_scale": learner2.loss_scale.state_dict()}))
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, out)
        save_file({k: v.contiguous() for k, v in state2.items()}, out + ".resumed")
    fsdp.finish()


if __name__ == "__main__":
    main(sys.argv[1], paths="paths" in sys.argv[2:], local="local" in sys.argv[2:])
