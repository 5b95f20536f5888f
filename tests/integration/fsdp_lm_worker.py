"""Run under torchrun by tests/integration/test_fsdp.py: 3 AdamW steps of a summed next-token loss
on this rank's share of a fixed global batch, with the tiny Llama sharded by
`rlhfkit.distributed.fsdp.shard_model` (gloo on CPU, nccl on GPUs). Rank 0 writes the gathered
full state to OUT (safetensors) and the global loss of each step to OUT.json. With `bf16`, the
shards are float32 computing in bf16 (mixed_precision).

    torchrun --nproc_per_node 2 tests/integration/fsdp_lm_worker.py OUT [bf16]
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlhfkit.distributed import fsdp  # noqa: E402 - after the checkout is on sys.path
from rlhfkit.models import tiny_model_and_tokenizer  # noqa: E402 - after the checkout is on sys.path

STEPS, LR = 3, 1e-2


def global_batch() -> torch.Tensor:
    return torch.randint(4, 80, (8, 12), generator=torch.Generator().manual_seed(3))


def summed_loss(model, ids: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """Next-token cross entropy summed over `ids` [B, T], divided by the GLOBAL token count."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                           reduction="sum")
    return ce / total_tokens


def train(model, rows: torch.Tensor, total_tokens: int) -> list[float]:
    """The steps' losses (this rank's share of each)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = summed_loss(model, rows, total_tokens)
        loss.backward()
        losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def main(out: str, bf16: bool = False) -> None:
    torch.set_num_threads(1)
    rank, world = fsdp.init_from_torchrun()
    model, _ = tiny_model_and_tokenizer(seed=0)
    fsdp.shard_model(model, world, mixed_precision=bf16)
    model.train()
    ids = global_batch()
    device = next(model.parameters()).device
    losses = torch.tensor(train(model, ids.tensor_split(world)[rank].to(device), ids[:, 1:].numel()), device=device)
    torch.distributed.all_reduce(losses)
    state = fsdp.full_state_dict(model, rank0_only=True)
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, out)
        Path(out + ".json").write_text(json.dumps(losses.tolist()))
    fsdp.finish()


if __name__ == "__main__":
    main(sys.argv[1], bf16=sys.argv[2:] == ["bf16"])
