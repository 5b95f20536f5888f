"""The HF engine's KV cache: whether a model can be decoded with transformers' `DynamicCache`, and
that cache with its full-attention layers replaced by layers that grow in place (a decode step
writes its token into a buffer instead of concatenating the whole cache)."""

from __future__ import annotations

import functools

import torch

from rlhfkit.models.logprobs import forward_parameters, note_once


def cache_support(model: torch.nn.Module) -> str | None:
    """Why the engine cannot decode `model` with a transformers `DynamicCache` (noted once), or None."""
    reason = None
    if "past_key_values" not in forward_parameters(model):
        reason = "its forward takes no past_key_values"
    elif not getattr(model, "_supports_default_dynamic_cache", lambda: True)():
        reason = "it does not use transformers' DynamicCache"
    else:
        from transformers import DynamicCache
        from transformers.cache_utils import CacheLayerMixin

        try:
            kinds = {type(layer) for layer in DynamicCache(config=model.config).layers}
        except Exception as e:  # noqa: BLE001 - a config transformers lays out no cache for
            kinds, reason = set(), f"transformers lays out no DynamicCache for it ({type(e).__name__})"
        lacking = sorted(k.__name__ for k in kinds if not _copies_rows(k))
        if lacking:
            reason = f"its cache layers ({', '.join(lacking)}) cannot be copied per sample or have rows dropped"
        elif kinds and not any(issubclass(k, CacheLayerMixin) for k in kinds):
            reason = "its cache has no attention layer (transformers counts a cache's tokens on one)"
    if reason is not None:
        note_once(f"{type(model).__name__}: {reason}; the HF engine decodes it without a KV cache (one prompt "
                  "at a time, the whole sequence at each step)")
    return reason


@torch.no_grad()
def left_padding_changes_numbers(model: torch.nn.Module, pad_id: int, position_offset: int = 0) -> bool:
    """Whether `model` gives a left-padded row other logits than the same tokens unpadded, with the mask and
    position ids the HF engine passes: TrOCR counts positions from a row's first column (it takes no
    position ids), DeepSeek-V4 compresses blocks of keys counted from the first column. Such a model's
    prompts are not padded to one width in the HF engine (one prompt at a time, noted once). Probed once
    on a 16-token row, only for a model that takes no position ids or has cache layers of its own; a
    model the probe cannot run keeps the padded prompts."""
    from rlhfkit.models.vision import is_vision_model

    takes = forward_parameters(model)
    if is_vision_model(model) or ("position_ids" in takes and not _own_cache_layers(model)):
        return False  # positions and mask passed, transformers' own cache layers: nothing counts the padding
    param, training = next(model.parameters()), model.training
    ids = torch.arange(5, 5 + 16, device=param.device)[None]  # 16 tokens after 5 pads
    padded = torch.cat([torch.full((1, 5), pad_id, device=param.device), ids], 1)
    mask = torch.cat([torch.zeros_like(padded[:, :5]), torch.ones_like(ids)], 1)
    rows = {"plain": (ids, torch.ones_like(ids)), "padded": (padded, mask)}
    logits = {}
    model.eval()
    try:
        for name, (row, mask) in rows.items():
            kwargs = {"input_ids": row, "attention_mask": mask, "use_cache": False}
            if "position_ids" in takes:
                kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0) + position_offset
            logits[name] = model(**kwargs).logits[0, -1].float()
    except Exception:  # noqa: BLE001 - the probe says nothing: the engine pads as before
        return False
    finally:
        model.train(training)
    plain = logits["plain"]
    tol = 1e-4 if param.dtype == torch.float32 else 2e-2 * float(plain.abs().max())  # bf16/fp16: its rounding
    changes = not torch.allclose(plain, logits["padded"], atol=tol, rtol=0)
    if changes:
        note_once(f"{type(model).__name__}: left padding changes its numbers (the first columns of a row count, "
                  "padding or not); the HF engine decodes one prompt at a time")
    return changes


def _own_cache_layers(model: torch.nn.Module) -> bool:
    """Whether the model's DynamicCache holds layers its modeling file defines (DeepSeek-V4's compressed
    ones) rather than transformers' cache_utils layers."""
    from transformers import DynamicCache

    try:
        return any(type(layer).__module__ != "transformers.cache_utils" for layer in DynamicCache(
            config=model.config).layers)
    except Exception:  # noqa: BLE001 - no cache laid out: the engine decodes without one anyway
        return False


def _linear_states():
    """transformers' base class of cache layers holding convolution / recurrent states (Mamba, gated
    DeltaNet, short convolutions), or None where this transformers has none."""
    from transformers import cache_utils

    return getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)


def _copies_rows(kind: type) -> bool:
    """Whether cache layers of `kind` can be copied per sample and have rows dropped (`repeat_rows`,
    `select_rows`): a layer with both batch methods, or one holding linear-attention states, whose
    rows `reorder_cache` picks (its keys and values too, in a hybrid attention + Mamba layer)."""
    linear = _linear_states()
    if linear is not None and issubclass(kind, linear):
        return callable(getattr(kind, "reorder_cache", None))
    return all(hasattr(kind, m) for m in ("batch_repeat_interleave", "batch_select_indices"))


def repeat_rows(cache, repeats: int) -> None:
    """Each row of `cache` repeated `repeats` times in place (row i becomes rows i*repeats ...), in every
    layer: keys and values, a linear-attention layer's convolution and recurrent states, and the states
    of a layer whose own `reorder_cache` picks rows of more than its keys and values (`_by_reorder`)."""
    rows = None
    for layer in cache.layers:
        if _by_reorder(type(layer)):
            if rows is None:
                rows = torch.arange(_batch_size(layer), device="cpu").repeat_interleave(repeats)
            layer.reorder_cache(rows)
        else:
            layer.batch_repeat_interleave(repeats)


def select_rows(cache, indices: torch.Tensor) -> None:
    """Keep the rows `indices` of `cache` in every layer (as `repeat_rows`, by row index)."""
    for layer in cache.layers:
        if _by_reorder(type(layer)):
            layer.reorder_cache(indices)
        else:
            layer.batch_select_indices(indices)


@functools.cache
def _by_reorder(kind: type) -> bool:
    """Whether rows of a `kind` layer are picked by its `reorder_cache`: a linear-attention layer, or one
    that overrides `reorder_cache` below the class giving its batch methods (DeepSeek-V4's compressed
    cache keeps buffers beside its keys and values that only its `reorder_cache` picks rows of)."""
    linear = _linear_states()
    if linear is not None and issubclass(kind, linear):
        return True

    def owner(name: str) -> int:  # how far up the MRO the method is defined (0: kind itself)
        return next((i for i, c in enumerate(kind.__mro__) if name in vars(c)), len(kind.__mro__))

    return owner("reorder_cache") < owner("batch_repeat_interleave")


def _batch_size(layer) -> int:
    keys = getattr(layer, "keys", None)
    states = [t for t in (*getattr(layer, "conv_states", {}).values(), *getattr(layer, "recurrent_states", {}).values(),
                          keys) if isinstance(t, torch.Tensor) and t.numel()]
    if not states:
        raise RuntimeError(f"{type(layer).__name__}: no state to count the rows of before the prefill")
    return states[0].shape[0]


def new_cache(model: torch.nn.Module, reserve: int = 0):
    """transformers' DynamicCache, its full-attention layers replaced by growing-buffer layers with room
    for `reserve` more tokens (other layer kinds, e.g. sliding windows, are kept as they are)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    growing = growing_layer_class()
    cache.layers = [growing(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@functools.cache
def growing_layer_class():
    """The class is built on first use: transformers is imported lazily (CLI start-up stays light)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer whose keys and values are views of buffers with room to grow: a decode
        step writes its token in place, where DynamicLayer concatenates (copies) the whole cache of
        every layer at every step (18% of a SmolLM2 rollout on this CPU)."""

        def __init__(self, reserve: int):
            super().__init__()
            self.reserve, self.length, self._k, self._v = reserve, 0, None, None

        def update(self, key_states, value_states, *args, **kwargs):
            # Under autocast the attention casts keys and values to its dtype anyway: keep them in it,
            # not in the float32 that RoPE's float32 cos/sin promote them to, so the cache is not cast
            # whole at every step in every layer (the same numbers; 10% of a bf16 rollout here).
            device = key_states.device.type
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                key_states, value_states = key_states.to(dtype), value_states.to(dtype)
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            if self._k is None or self.length + n > self._k.shape[-2]:
                self._k, self._v = (self._grown(old, new, n) for old, new in ((self._k, key_states),
                                                                             (self._v, value_states)))
            self._k[..., self.length : self.length + n, :] = key_states
            self._v[..., self.length : self.length + n, :] = value_states
            self.length += n
            return self._views()

        def _grown(self, old, new, n):
            buf = new.new_empty(*new.shape[:-2], self.length + n + self.reserve, new.shape[-1])
            if old is not None:
                buf[..., : self.length, :] = old[..., : self.length, :]
            return buf

        def _views(self):
            self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]
            return self.keys, self.values

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.length:
                self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
                self._views()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.length:
                self._k, self._v = self._k[indices], self._v[indices]
                self._views()

    return GrowingLayer
