"""Run under torchrun by tests/integration/test_fsdp.py: 3 AdamW steps of a summed next-token loss
on this rank's share of a fixed global batch, with the tiny Llama sharded by
`rlhfkit.distributed.fsdp.shard_model` (gloo on CPU, nccl on GPUs). Rank 0 writes the gathered
full state to OUT (safetensors).

    torchrun --nproc_per_node 2 tests/integration/fsdp_lm_worker.py OUT
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rlhfkit.distributed import fsdp  # noqa: E402
from rlhfkit.models import tiny_model_and_tokenizer  # noqa: E402

STEPS, LR = 3, 1e-2


def global_batch() -> torch.Tensor:
    return torch.randint(4, 80, (8, 12), generator=torch.Generator().manual_seed(3))


def summed_loss(model, ids: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """Next-token cross entropy summed over `ids` [B, T], divided by the GLOBAL token count."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
    return ce / total_tokens


def train(model, rows: torch.Tensor, total_tokens: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for _ in range(STEPS):
        summed_loss(model, rows, total_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main(out: str) -> None:
    torch.set_num_threads(1)
    rank, world = fsdp.init_from_torchrun()
    model, _ = tiny_model_and_tokenizer(seed=0)
    fsdp.shard_model(model, world)
    model.train()
    ids = global_batch()
    device = next(model.parameters()).device
    train(model, ids.tensor_split(world)[rank].to(device), ids[:, 1:].numel())
    state = fsdp.full_state_dict(model, rank0_only=True)
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, out)
    fsdp.finish()


if __name__ == "__main__":
    main(sys.argv[1])
