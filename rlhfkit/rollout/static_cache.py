"""The static KV cache of `HFEngine`'s compiled decode step (`compile_decode`, see rollout/hf.py).

On CUDA the compiled step (torch.compile mode "reduce-overhead") replays CUDA graphs, and a graph is
recorded again for every new input shape and every new address of a static input. So that a run
records few graphs:
- the cache length is bucketed (`static_cache_length`: prompt width + max new tokens rounded up to a
  multiple of `STATIC_LENGTH_BUCKET`), so chunks whose prompts differ a little in width share a shape;
- the rows are bucketed to powers of two when rows finish (`bucketed_rows`);
- the buffers are the engine's own (`StaticBuffers`), reused by every chunk and every row drop: the
  rows a step decodes are the first rows of one buffer per layer, at the same address.
`StaticBuffers.allocations` and `.shapes` count what each of those would have re-recorded (the GPU
check reports them beside the measured graph recordings).
"""

from __future__ import annotations

import functools

import torch

from rlhfkit.models.logprobs import note_once

# Static cache lengths are multiples of this (tokens): the positions past a chunk's prompt width + max new
# tokens are never opened in the attention mask.
STATIC_LENGTH_BUCKET = 256


def static_cache_length(width: int, max_new: int) -> int:
    """The static cache length of a chunk of prompts `width` wide decoding up to `max_new` tokens."""
    return -(-(width + max_new) // STATIC_LENGTH_BUCKET) * STATIC_LENGTH_BUCKET


class StaticBuffers:
    """One engine's static key / value buffers, one pair per layer, reused by every chunk and row drop:
    `place(layer, keys, values)` copies [b, heads, L, head_dim] rows into the first b rows of the layer's
    buffers (allocated again only for a larger b or another shape) and returns those views."""

    def __init__(self):
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.allocations = 0  # buffer (re)allocations: each one a new static address for the compiled step
        self.shapes: set[tuple[int, ...]] = set()  # the [b, heads, L, head_dim] shapes the rows took

    def place(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        have = self.buffers.get(layer)
        fits = (have is not None and have[0].shape[0] >= keys.shape[0] and have[0].shape[1:] == keys.shape[1:]
                and have[0].dtype == keys.dtype and have[0].device == keys.device)
        if not fits:
            have = (torch.empty_like(keys), torch.empty_like(values))
            for buf in have:
                torch._dynamo.mark_static_address(buf)
            self.buffers[layer] = have
            self.allocations += 1
        rows = keys.shape[0]
        k, v = have[0][:rows], have[1][:rows]
        k.copy_(keys)
        v.copy_(values)
        self.shapes.add(tuple(k.shape))
        return k, v


def bucketed_rows(keep: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """The rows a static-cache (compiled) batch keeps after a stop check: the `keep` rows still
    decoding, padded with finished ones up to a power of two of at least 2 (or all rows where that
    is no fewer). So the compiled step sees at most log2(B) batch sizes, and never 1 row unless it
    started with 1: each new size would be a new CUDA graph, and 1 (which torch.compile specializes)
    a recompile. keep [k] sorted row indices, alive [B] -> sorted row indices [b]."""
    rows = alive.numel()
    size = max(2, 1 << (keep.numel() - 1).bit_length())
    if size >= rows:
        return torch.arange(rows, device=alive.device)
    finished = (~alive).nonzero().squeeze(-1)[: size - keep.numel()]
    return torch.cat([keep, finished]).sort().values


def static_cache_support(model: torch.nn.Module) -> bool:
    """Whether transformers lays out only plain full-attention `StaticLayer`s for `model` (what the
    compiled decode step needs); otherwise a note is logged once and the loop decodes eagerly."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    try:
        kinds = {type(layer) for layer in StaticCache(config=model.config, max_cache_len=1).layers}
    except Exception as e:  # noqa: BLE001 - a config transformers lays out no static cache for
        kinds = {type(e)}
    if kinds == {StaticLayer}:
        return True
    note_once(f"--rollout.compile_decode: {type(model).__name__}'s static cache has layers other than plain full "
              f"attention ({', '.join(sorted(k.__name__ for k in kinds))}); the rollout decodes eagerly")
    return False


def new_static_cache(model: torch.nn.Module, length: int, buffers: StaticBuffers | None = None):
    """transformers' StaticCache of `length` positions whose layers can also be copied per sample and
    have rows dropped (as the loop does after the prefill and when rows finish), their rows kept in
    `buffers` when given."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=length)
    layer = static_layer_class()
    cache.layers = [layer(max_cache_len=length, buffers=buffers, index=i) for i in range(len(cache.layers))]
    return cache


@functools.cache
def static_layer_class():
    from transformers.cache_utils import StaticLayer

    class RowStaticLayer(StaticLayer):
        """A StaticLayer (fixed-length buffers written in place at the cache position) whose rows can be
        repeated or selected, into the engine's `StaticBuffers` (else new buffers, marked static)."""

        def __init__(self, *args, buffers: StaticBuffers | None = None, index: int = 0, **kwargs):
            super().__init__(*args, **kwargs)
            self.buffers, self.index = buffers, index

        def update(self, key_states, value_states, *args, **kwargs):
            # as GrowingLayer.update: keep the cache in the autocast dtype the attention uses
            device = key_states.device.type
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                key_states, value_states = key_states.to(dtype), value_states.to(dtype)
            return super().update(key_states, value_states, *args, **kwargs)

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.is_initialized:
                self._rows(self.keys.repeat_interleave(repeats, 0), self.values.repeat_interleave(repeats, 0))

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized:
                self._rows(self.keys[indices], self.values[indices])  # gathered copies, then placed

        def _rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            if self.buffers is not None:
                keys, values = self.buffers.place(self.index, keys, values)
            else:
                torch._dynamo.mark_static_address(keys)
                torch._dynamo.mark_static_address(values)
            self.keys, self.values, self.batch_size = keys, values, keys.shape[0]

    return RowStaticLayer
