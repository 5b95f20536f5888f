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

from rlhfkit.core.moe import skip_code
from rlhfkit.data.batch import TokenBatch, collate, select_rows


@dataclass
class PackedBatch:
    """B samples in one row. The response-aligned fields are those of `TokenBatch`.

    input_ids      [1, L]   sample 0, sample 1, ... (no padding)
    position_ids   [1, L]   0..len_b-1 for each sample b
    starts         [B]      offset of sample b in the row
    prompt_lengths [B], response_ids [B, R], loss_mask [B, R], response_mask [B, R]
    experts        [1, L, layers, k] or None  the recorded experts of each token (data.batch)
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    starts: torch.Tensor
    prompt_lengths: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    response_mask: torch.Tensor
    attention_mask: None = None
    experts: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.starts.numel())

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def response_positions(self) -> torch.Tensor:
        """LongTensor [B, R]: the row position whose logits predict response token j of sample b."""
        r = self.response_ids.shape[1]
        pos = (self.starts + self.prompt_lengths).unsqueeze(1) - 1 + torch.arange(r).unsqueeze(0)
        return pos.clamp(max=self.input_ids.shape[1] - 1)

    def hidden_index(self) -> torch.Tensor:
        """[B, R] index into the flattened hidden states (one row: the positions themselves)."""
        return self.response_positions()

    def padded(self) -> TokenBatch:
        """The same samples as `collate` lays them out (one right-padded row each): the layout
        for a model that cannot separate the samples of a packed row."""
        lengths = self.prompt_lengths + self.response_mask.sum(dim=1)
        spans = list(zip(self.starts.tolist(), lengths.tolist()))
        rows = [self.input_ids[0, s : s + n] for s, n in spans]
        experts = None if self.experts is None else [self.experts[0, s : s + n] for s, n in spans]
        return _padded_batch(rows, self, experts)


def pack(samples: Sequence, pad_id: int) -> PackedBatch:
    """Pack samples (anything with prompt_ids [P], response_ids [R], loss_mask [R]) into one row."""
    padded = collate(samples, pad_id)  # response-aligned tensors, shared with the padded path
    rows = [torch.cat([s.prompt_ids, s.response_ids]) for s in samples]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
    experts = padded.experts
    if experts is not None:  # each sample's row of the padded layout, end to end
        experts = torch.cat([experts[b, :n] for b, n in enumerate(lengths.tolist())]).unsqueeze(0)
    return PackedBatch(
        input_ids=torch.cat(rows).unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        starts=starts,
        prompt_lengths=padded.prompt_lengths,
        response_ids=padded.response_ids,
        loss_mask=padded.loss_mask,
        response_mask=padded.response_mask,
        experts=experts,
    )


@dataclass
class SharedPrefixBatch:
    """B samples laid out so that samples with the same prompt share ONE copy of it.

    Each row holds a prompt followed by the responses of several samples that start with it, and
    when they fit (`rows_by_length`) more such blocks of other prompts:
        [prompt_a | response_a1 | response_a2 | ... | prompt_b | response_b1 | ...]   then pad_id up to L
    A response attends to its prompt and, causally, to itself only, a prompt to itself only (the
    4-D `attention_mask`);
    its position ids continue from the prompt's length, so every response token sees exactly
    the context it had in `collate`'s layout and gets the same logits, while the prompt's
    forward (and backward) runs once per row instead of once per sample.

    input_ids      [K, L]        K rows
    position_ids   [K, L]
    attention_mask [K, 1, L, L]  bool, True = may attend (padding attends only to itself)
    flat_index     [B, R]        index into the K*L flattened hidden states of the position whose
                                 output predicts response token j of sample b
    prompt_lengths [B], response_ids [B, R], loss_mask [B, R], response_mask [B, R]: as `collate`
    experts        [K, L, layers, k] or None  the recorded experts of each token (data.batch); samples
                                 share a prompt only when its recorded experts are the same
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    flat_index: torch.Tensor
    prompt_lengths: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    response_mask: torch.Tensor
    num_tokens: int  # real tokens: every row's prompt once + its responses
    experts: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.prompt_lengths.numel())

    def hidden_index(self) -> torch.Tensor:
        return self.flat_index

    def padded(self) -> TokenBatch:
        """The same samples as `collate` lays them out (a prompt copy per sample): the layout for
        a model that cannot take the 4-D mask."""
        flat = self.input_ids.reshape(-1)
        codes = None if self.experts is None else self.experts.reshape(-1, *self.experts.shape[2:])
        rows, experts = [], []
        for b, (p, r) in enumerate(zip(self.prompt_lengths.tolist(), self.response_mask.sum(dim=1).tolist())):
            end = int(self.flat_index[b, 0])  # token 0 is predicted by the prompt's last position
            rows.append(torch.cat([flat[end - p + 1 : end + 1], self.response_ids[b, :r]]))
            if codes is not None:  # response token j sits where token j + 1 is predicted; the last one routes nothing
                last = torch.full((min(r, 1), *codes.shape[1:]), skip_code(codes.dtype), dtype=codes.dtype)
                experts.append(torch.cat([codes[end - p + 1 : end + 1], codes[self.flat_index[b, 1:r]], last]))
        return _padded_batch(rows, self, experts if codes is not None else None)


def _padded_batch(rows: list[torch.Tensor], batch, experts: list[torch.Tensor] | None = None) -> TokenBatch:
    """A TokenBatch of `rows` (prompt + response tokens per sample) with `batch`'s response tensors
    (and `experts`: each row's recorded experts, or None)."""
    width = max(len(r) for r in rows)
    input_ids = torch.zeros((len(rows), width), dtype=torch.long)  # padding is masked out: any id will do
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, : len(r)], attention_mask[b, : len(r)] = r, 1
    codes = None
    if experts is not None:
        codes = torch.full((len(rows), width, *experts[0].shape[1:]), skip_code(experts[0].dtype),
                           dtype=experts[0].dtype)
        for b, e in enumerate(experts):
            codes[b, : len(e)] = e
    return TokenBatch(input_ids, attention_mask, batch.prompt_lengths, batch.response_ids, batch.loss_mask,
                      batch.response_mask, experts=codes)


def shared_prefix_rows(prompt_lengths: Sequence[int], response_lengths: Sequence[int], keys: Sequence,
                       max_row_tokens: int) -> list[list[int]]:
    """Which samples share a row: samples with equal `keys` (their prompt), in order of first
    appearance, as many per row as fit in `max_row_tokens` (at least one)."""
    rows: list[list[int]] = []
    open_row: dict = {}  # key -> (row index, its length so far)
    for i, (key, p, r) in enumerate(zip(keys, prompt_lengths, response_lengths)):
        k, length = open_row.get(key, (None, 0))
        if k is None or length + r > max_row_tokens:
            rows.append([])
            k, length = len(rows) - 1, p
        rows[k].append(i)
        open_row[key] = (k, length + r)
    return rows


def rows_by_length(prompt_lengths: Sequence[int], response_lengths: Sequence[int], keys: Sequence,
                   width: int) -> list[list[int]]:
    """Which samples share a row of `width` tokens, rows filled by length: samples longest first
    (prompt + response), each into the first row that already holds its prompt (`keys`) and has room
    for its response, else the first row with room for prompt + response, else a new row. A row may
    hold several prompts, each with responses of its own samples, so short samples of different
    prompts fill one row instead of each padding a row of its own. Every sample must fit in `width`."""
    order = sorted(range(len(keys)), key=lambda i: -(prompt_lengths[i] + response_lengths[i]))
    rows: list[list[int]] = []
    used: list[int] = []
    prompts: list[set] = []
    for i in order:
        p, r, key = prompt_lengths[i], response_lengths[i], keys[i]
        if p + r > width:
            raise ValueError(f"sample {i} ({p} + {r} tokens) does not fit in a row of {width}")
        fit = next((k for k in range(len(rows)) if key in prompts[k] and used[k] + r <= width), None)
        if fit is None:
            fit = next((k for k in range(len(rows)) if used[k] + p + r <= width), None)
        if fit is None:
            rows.append([]), used.append(0), prompts.append(set())
            fit = len(rows) - 1
        used[fit] += r if key in prompts[fit] else p + r
        prompts[fit].add(key)
        rows[fit].append(i)
    return rows


def pack_shared_prefix(batch: TokenBatch, rows: torch.Tensor, pad_id: int, max_row_tokens: int, *,
                       by_length: bool = True) -> SharedPrefixBatch:
    """The samples `rows` of a collated `batch` in the shared-prefix layout (see SharedPrefixBatch).

    The rows are as wide as `shared_prefix_rows` (one prompt per row, up to `max_row_tokens` or the
    longest sample) makes them; with `by_length` they are then filled by `rows_by_length` (several
    prompts per row; same width, fewer rows, less padding). The response-aligned tensors are those of
    `select_rows(batch, rows)`, in the order of `rows`.
    """
    sub = select_rows(batch, rows)
    p_lens = sub.prompt_lengths.tolist()
    r_lens = sub.response_mask.sum(dim=1).tolist()
    prompts = [sub.input_ids[b, :p] for b, p in enumerate(p_lens)]
    keys = [tuple(x.tolist()) for x in prompts]
    codes = sub.experts
    if codes is not None:  # samples share a prompt only where the engine routed it the same way
        keys = [(key, codes[b, :p].numpy().tobytes()) for b, (key, p) in enumerate(zip(keys, p_lens))]
    layout = shared_prefix_rows(p_lens, r_lens, keys, max_row_tokens)
    width = max(p_lens[m[0]] + sum(r_lens[b] for b in m) for m in layout)
    if by_length:
        layout = rows_by_length(p_lens, r_lens, keys, width)
    k = len(layout)
    experts = None if codes is None else torch.full((k, width, *codes.shape[2:]), skip_code(codes.dtype),
                                                    dtype=codes.dtype)
    input_ids = torch.full((k, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((k, width), dtype=torch.long)
    segment = torch.full((k, width), -1, dtype=torch.long)  # a prompt or a response; -1 = padding
    owner = torch.full((k, width), -1, dtype=torch.long)  # the segment of the prompt a token sees
    flat_index = torch.zeros(sub.response_ids.shape, dtype=torch.long)
    for row, members in enumerate(layout):
        at, seg = 0, 0
        for key in dict.fromkeys(keys[b] for b in members):  # each prompt once, then its responses
            first = next(b for b in members if keys[b] == key)
            p, prompt_seg = p_lens[first], seg
            input_ids[row, at : at + p], position_ids[row, at : at + p] = prompts[first], torch.arange(p)
            segment[row, at : at + p], owner[row, at : at + p] = prompt_seg, prompt_seg
            if experts is not None:
                experts[row, at : at + p] = codes[first, :p]
            end, at, seg = at + p - 1, at + p, seg + 1  # end: the prompt's last position
            for b in (b for b in members if keys[b] == key):
                r = r_lens[b]
                input_ids[row, at : at + r] = sub.response_ids[b, :r]
                position_ids[row, at : at + r] = torch.arange(p, p + r)
                segment[row, at : at + r], owner[row, at : at + r] = seg, prompt_seg
                if experts is not None:
                    experts[row, at : at + r] = codes[b, p : p + r]
                # token 0 is predicted by the prompt's last position, token j by response token j - 1
                pos = torch.cat([torch.tensor([end]), torch.arange(at, at + r - 1)]) if r else torch.tensor([end])
                flat_index[b, : pos.numel()] = row * width + pos
                flat_index[b, pos.numel() :] = row * width + pos[-1]
                at, seg = at + r, seg + 1
    q, kv = segment.unsqueeze(2), segment.unsqueeze(1)  # [K, L, 1], [K, 1, L]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = causal & (q >= 0) & (kv >= 0) & ((kv == q) | (kv == owner.unsqueeze(2)))
    mask |= torch.eye(width, dtype=torch.bool)  # a padding position attends to itself: no all-masked row (NaN)
    return SharedPrefixBatch(input_ids, position_ids, mask.unsqueeze(1), flat_index, sub.prompt_lengths,
                             sub.response_ids, sub.loss_mask, sub.response_mask, int((segment >= 0).sum()),
                             experts)


def micro_batches(
    rows: Sequence[int],
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[int],
    keys: Sequence,
    *,
    max_samples: int | None = None,
    max_tokens: int | None = None,
    shared_prefix_row_tokens: int | None = None,
) -> list[list[int]]:
    """Cut `rows` (sample indices, in order) into micro-batches of at most `max_samples` samples
    and, when `max_tokens` is set, about `max_tokens` real tokens (a sample longer than that gets a
    micro-batch of its own). With `shared_prefix_row_tokens`, a sample whose prompt (`keys`) is
    already in the micro-batch costs only its response tokens, as in `pack_shared_prefix` with
    that row size. The lengths and keys are indexed by sample index."""
    out: list[list[int]] = []
    cur: list[int] = []
    tokens, open_row = 0, {}
    for i in rows:
        p, r, key = int(prompt_lengths[i]), int(response_lengths[i]), keys[i]
        row = open_row.get(key) if shared_prefix_row_tokens else None
        shares = row is not None and row + r <= shared_prefix_row_tokens
        cost = r if shares else p + r
        full = (max_samples is not None and len(cur) >= max_samples) or (
            max_tokens is not None and tokens + cost > max_tokens)
        if cur and full:
            out.append(cur)
            cur, tokens, open_row, shares, cost = [], 0, {}, False, p + r
        cur.append(i)
        tokens += cost
        open_row[key] = row + r if shares else p + r
    if cur:
        out.append(cur)
    return out
