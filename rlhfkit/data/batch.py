"""Collate trajectories into padded tensors for the logprob forward and the losses.

Layout (right padding everywhere, so default position ids are correct):
  input_ids      [B, L]  prompt_b + response_b, then pad_id
  attention_mask [B, L]  1 on real tokens
  prompt_lengths [B]     P_b
  response_ids   [B, R]  response_b, then pad_id (R = longest response)
  loss_mask      [B, R]  bool, True = action token that counts
  response_mask  [B, R]  bool, True = a real response token (action or feedback)
  vision         per row: the prompt's image tensors (data.images.VisionInputs) or None; None
                 for a batch without images (rows of one prompt share one object)
  experts        [B, L, layers, k] the engine's recorded experts of each token (routing replay, codes
                 of core.moe: skip_code on padding and on the tokens after the last action's
                 predecessor, whose routing reaches no trained logprob); None when not recorded
Response token j of row b sits at input position P_b + j; the logits that predict it are
those at position P_b + j - 1. Every per-token loss tensor is response-aligned: [B, R].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlhfkit.core.moe import missing_code, skip_code
from rlhfkit.data.types import Trajectory


@dataclass
class TokenBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    response_mask: torch.Tensor
    vision: list | None = None
    experts: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens the forward runs on."""
        return int(self.attention_mask.sum())

    def response_positions(self) -> torch.Tensor:
        """LongTensor [B, R]: the input position whose logits predict response token j."""
        r = self.response_ids.shape[1]
        pos = self.prompt_lengths.unsqueeze(1) - 1 + torch.arange(r).unsqueeze(0)
        return pos.clamp(max=self.input_ids.shape[1] - 1)

    def hidden_index(self) -> torch.Tensor:
        """LongTensor [B, R]: `response_positions` as indices into the [B*L] flattened hidden states."""
        return self.response_positions() + torch.arange(self.batch_size).unsqueeze(1) * self.input_ids.shape[1]


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> TokenBatch:
    """Pad `trajectories` into a `TokenBatch` (see module docstring for the layout)."""
    if not trajectories:
        raise ValueError("collate() needs at least one trajectory")
    b = len(trajectories)
    p_lens = torch.tensor([t.prompt_ids.numel() for t in trajectories], dtype=torch.long)
    r_lens = torch.tensor([t.response_ids.numel() for t in trajectories], dtype=torch.long)
    seq_len = int((p_lens + r_lens).max())
    r_max = max(int(r_lens.max()), 1)
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, seq_len), dtype=torch.long)
    response_ids = torch.full((b, r_max), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, r_max), dtype=torch.bool)
    response_mask = torch.zeros((b, r_max), dtype=torch.bool)
    for i, t in enumerate(trajectories):
        p, r = int(p_lens[i]), int(r_lens[i])
        input_ids[i, :p] = t.prompt_ids
        input_ids[i, p : p + r] = t.response_ids
        attention_mask[i, : p + r] = 1
        response_ids[i, :r] = t.response_ids
        loss_mask[i, :r] = t.loss_mask
        response_mask[i, :r] = True
    vision = [getattr(t, "vision", None) for t in trajectories]  # Trajectory or data.supervised.TokenSample
    return TokenBatch(input_ids, attention_mask, p_lens, response_ids, loss_mask, response_mask,
                      vision=vision if any(v is not None for v in vision) else None,
                      experts=collate_experts(trajectories, seq_len))


def routed_length(sample) -> int:
    """How many leading tokens of `sample` (prompt_ids [P], loss_mask [R]) have a routing that reaches a
    trained logprob: those before the last action token (which is predicted at position P + j - 1)."""
    actions = sample.loss_mask.nonzero()
    return 0 if actions.numel() == 0 else int(sample.prompt_ids.numel()) + int(actions[-1])


def collate_experts(samples: Sequence, width: int) -> torch.Tensor | None:
    """[B, width, layers, k] the samples' recorded experts (their `experts` [P + R, layers, k]) over their
    routed tokens (`routed_length`; missing_code where a sample carries none), skip_code elsewhere; None
    when no sample carries any."""
    recorded = [getattr(s, "experts", None) for s in samples]
    sample = next((e for e in recorded if e is not None), None)
    if sample is None:
        return None
    out = torch.full((len(samples), width, *sample.shape[1:]), skip_code(sample.dtype), dtype=sample.dtype)
    for i, (s, e) in enumerate(zip(samples, recorded)):
        n = routed_length(s)
        out[i, :n] = missing_code(sample.dtype) if e is None else e[:n]
    return out


def pad_response_values(values: Sequence[torch.Tensor], width: int, fill: float = 0.0) -> torch.Tensor:
    """Stack per-trajectory response-aligned 1-D tensors into [B, width], right-padded with `fill`."""
    out = torch.full((len(values), width), fill, dtype=torch.float32)
    for i, v in enumerate(values):
        out[i, : v.numel()] = v.float()
    return out


def select_rows(batch: TokenBatch, rows: torch.Tensor) -> TokenBatch:
    """The sub-batch of `rows` (LongTensor [b]), trimmed to its own longest sequence and response."""
    p_lens = batch.prompt_lengths[rows]
    resp = batch.response_mask[rows]
    r_lens = resp.sum(dim=1)
    seq_len = int((p_lens + r_lens).max())
    r_max = max(int(r_lens.max()), 1)
    return TokenBatch(
        input_ids=batch.input_ids[rows, :seq_len],
        attention_mask=batch.attention_mask[rows, :seq_len],
        prompt_lengths=p_lens,
        response_ids=batch.response_ids[rows, :r_max],
        loss_mask=batch.loss_mask[rows, :r_max],
        response_mask=resp[:, :r_max],
        vision=None if batch.vision is None else [batch.vision[int(i)] for i in rows],
        experts=None if batch.experts is None else batch.experts[rows, :seq_len],
    )
