"""How the rows of a rollout batch are cut into micro-batches and laid out for the forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfkit.data.batch import TokenBatch, select_rows
from rlhfkit.data.packing import micro_batches, pack_shared_prefix
from rlhfkit.models.logprobs import note_once

# Shortest row of the shared-prefix layout: a row holds one prompt and responses up to this many
# tokens (or the longest sample). Its attention is dense over the row, so rows stay short.
SHARED_ROW_TOKENS = 512


@dataclass(frozen=True)
class MicroBatcher:
    """Micro-batches of `micro_batch_size` samples, or of about `max_tokens` real tokens when it is
    set (OpenRLHF's dynamic batch); with `shared_prefix`, each prompt is computed once per row for
    the samples of its group, and rows are filled by length (short samples of several prompts share
    a row: `data.packing.rows_by_length`) (exact: same logprobs and gradients as one copy per
    sample)."""

    pad_id: int
    micro_batch_size: int
    max_tokens: int | None = None
    shared_prefix: bool = True

    def row_tokens(self, batch: TokenBatch) -> int | None:
        """Row size of the shared-prefix layout, None when it is off or the batch holds images (whose
        tensors belong to padded rows: one logged line)."""
        if not self.shared_prefix:
            return None
        if batch.vision is not None:
            note_once("prompts with images: the shared-prefix layout cannot hold their image tensors; their "
                      "micro-batches run as padded rows (same numbers, more compute)")
            return None
        return max(SHARED_ROW_TOKENS, int(batch.attention_mask.sum(dim=1).max()))

    def layout(self, batch: TokenBatch):
        """(batch, rows) -> the micro-batch in the shared-prefix layout (rows of up to
        max(SHARED_ROW_TOKENS, longest sample) tokens) or as padded rows."""
        row_tokens = self.row_tokens(batch)
        if row_tokens is None:
            return select_rows
        return lambda b, rows: pack_shared_prefix(b, rows, self.pad_id, row_tokens)

    def cut(self, batch: TokenBatch, group_ids: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
        """`rows` cut into micro-batches. With the shared prefix, the rows are first ordered by group
        (one optimizer step sums the same gradients in any order) so that samples of one prompt meet
        in a micro-batch."""
        if self.shared_prefix:
            rows = rows[torch.argsort(group_ids[rows], stable=True)]
        cuts = micro_batches(
            rows.tolist(), batch.prompt_lengths.tolist(), batch.response_mask.sum(dim=1).tolist(), group_ids.tolist(),
            max_samples=None if self.max_tokens is not None else self.micro_batch_size,
            max_tokens=self.max_tokens, shared_prefix_row_tokens=self.row_tokens(batch),
        )
        return [torch.tensor(c, dtype=torch.long) for c in cuts]

    def rank_share(self, step_rows: torch.Tensor, group_ids: torch.Tensor, rank: int, world: int) -> torch.Tensor:
        """This rank's equal share of an optimizer step's rows under FSDP (all of them in one process; one
        more row on the first ranks when the step does not split evenly, as DAPO's filtered batches).
        With the shared prefix, rows are ordered by group first, so a rank holds whole groups and its
        micro-batches are the ones one process would cut."""
        if world == 1:
            return step_rows
        if self.shared_prefix:
            step_rows = step_rows[torch.argsort(group_ids[step_rows], stable=True)]
        return step_rows.tensor_split(world)[rank]
