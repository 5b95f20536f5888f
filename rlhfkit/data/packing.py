"""Sample packing: several prompt + response samples in one row without padding.

The B samples are laid end to end in a single row [1, L] (L = total tokens). `position_ids`
restart at 0 for every sample, and `attention_mask` is None: HF transformers then builds a
block-diagonal causal mask from the position ids (`masking_utils.find_packed_sequence_indices`,
eager and SDPA alike, CPU included), so no token attends across a sample boundary. The
response-aligned tensors ([B, R]) are the same as `collate`'s, so the losses do not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlhfkit.data.batch import collate


@dataclass
class PackedBatch:
    """B samples in one row. The response-aligned fields are those of `TokenBatch`.

    input_ids      [1, L]   sample 0, sample 1, ... (no padding)
    position_ids   [1, L]   0..len_b-1 for each sample b
    starts         [B]      offset of sample b in the row
    prompt_lengths [B], response_ids [B, R], loss_mask [B, R], response_mask [B, R]
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    starts: torch.Tensor
    prompt_lengths: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    response_mask: torch.Tensor
    attention_mask: None = None

    @property
    def batch_size(self) -> int:
        return int(self.starts.numel())

    def response_positions(self) -> torch.Tensor:
        """LongTensor [B, R]: the row position whose logits predict response token j of sample b."""
        r = self.response_ids.shape[1]
        pos = (self.starts + self.prompt_lengths).unsqueeze(1) - 1 + torch.arange(r).unsqueeze(0)
        return pos.clamp(max=self.input_ids.shape[1] - 1)


def pack(samples: Sequence, pad_id: int) -> PackedBatch:
    """Pack samples (anything with prompt_ids [P], response_ids [R], loss_mask [R]) into one row."""
    padded = collate(samples, pad_id)  # response-aligned tensors, shared with the padded path
    rows = [torch.cat([s.prompt_ids, s.response_ids]) for s in samples]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
    return PackedBatch(
        input_ids=torch.cat(rows).unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        starts=starts,
        prompt_lengths=padded.prompt_lengths,
        response_ids=padded.response_ids,
        loss_mask=padded.loss_mask,
        response_mask=padded.response_mask,
    )
