"""`Prefill`: the HF engine's prefill paths, mixed into `rollout.hf.HFEngine` (its only user).

A chunk of prompts is prefilled once (`_prefill`), then its cache and logits are expanded to the n
samples of each prompt; the state before the first decoded token is a `DecodeState`. Three layouts:
- plain: the prompts left-padded (`_left_pad`), one forward;
- shared prefix: the tokens every prompt starts with prefilled once, then each prompt's own tokens
  (rollout.prefix; `_shared_prefix` says how many);
- kept turns: an episode's kept KV cache starts its next turn's prefill, only the new tokens run
  (rollout.turns).
`_prefill_chunk` is the per-chunk entry the decode loop calls (rollout.vision's engine overrides it to
add image inputs).

The class holds no state of its own: it reads the engine's (`model`, `device`, `pad_id`, `_forward`,
`_growing`, `_cached`, `_compiled_step`, `static_buffers`, `turns`, `share_prefix`, `row_hook`,
`recorder`, `routed`, `position_limit`, `_version`) and counts `prefilled_tokens`.
"""

from __future__ import annotations

import torch

from rlhfkit.errors import ModelError
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.decode_state import DecodeState, PartialGeneration
from rlhfkit.rollout.kv_cache import new_cache, repeat_rows
from rlhfkit.rollout.prefix import prefill_shared, shared_prefix_length
from rlhfkit.rollout.routing import missing_codes, prompt_codes
from rlhfkit.rollout.sampling import chunk_uniforms, seen_tokens
from rlhfkit.rollout.static_cache import new_static_cache, static_cache_length
from rlhfkit.rollout.turns import prefill_kept


class Prefill:
    """HFEngine's prefill methods (module docstring): the engine's state before a chunk's first token."""

    def _prefill_chunk(self, gen: PartialGeneration, start: int, stop: int, gens) -> DecodeState:
        """The prefill of `gen`'s prompts [start, stop) (an engine with more inputs per prompt adds them)."""
        keys = None if gen.episode_keys is None else gen.episode_keys[start:stop]
        if self.row_hook is not None:
            self.row_hook(list(range(start, stop)))
        state = self._prefill(gen.prompts[start:stop], gen.params, gen.generator, gens, keys=keys)
        state.first = start
        return state

    def _prefill(self, prompts: list[list[int]], params: SamplingParams, generator, gens=None,
                 extra: dict | None = None, keys: list | None = None) -> DecodeState:
        """Prefill `prompts` once and expand to n rows each: the state before the first token.
        `gens`: one generator per prompt (rows of prompt i sample from gens[i]), or None. `extra`: more
        keyword arguments of the prefill's forward (e.g. pixel values). `keys`: the prompts' episode
        keys (n = 1): kept caches start their prefill, and their rows are kept when they finish."""
        n, max_new = params.n, params.max_new_tokens
        input_ids, attention_mask = self._left_pad(prompts)
        device, width = input_ids.device, input_ids.shape[1]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        static = self._compiled_step is not None
        if static:  # the mask covers the static cache's whole length: the new tokens' columns open as they come
            length = static_cache_length(width, max_new)  # bucketed: chunks of similar widths share the shape
            cache = new_static_cache(self.model, length, self.static_buffers)
            attention_mask = torch.nn.functional.pad(attention_mask, (0, length - width))
        else:
            cache = new_cache(self.model, reserve=max_new) if self._cached else None
        keep = [(k, p) for k, p in zip(keys, prompts)] if keys and not extra and self._growing(cache) else None
        kept = None if keep is None else [self.turns.take(k, p, self._version) for k, p in keep]
        before = [0] * len(prompts)  # per prompt, its tokens prefilled before (kept or shared) its own forward
        if kept is not None and any(e is not None for e in kept):  # [padding | kept | padding | new tokens]
            logits, attention_mask, position_ids = prefill_kept(self._forward, prompts, kept, cache, self.pad_id,
                                                                device)
            before = [len(e.tokens) if e is not None else 0 for e in kept]
            self.turns.reused_tokens += sum(before)
            self.prefilled_tokens -= sum(before)
        elif shared := (None if extra else self._shared_prefix(prompts, cache)):
            # [prefix | padding | own tokens]: the padding sits after the shared prefix
            logits, attention_mask, position_ids = prefill_shared(self._forward, prompts, shared, cache, self.pad_id,
                                                                  device)
            before = [shared] * len(prompts)
            self.prefilled_tokens -= shared * (len(prompts) - 1)
        else:
            logits = self._forward(input_ids, attention_mask, position_ids, cache, extra=extra)  # [U, V]
        if cache is not None and not static:
            self._check_cache_width(cache, attention_mask.shape[1])
        self.prefilled_tokens += sum(len(p) for p in prompts)
        calls, self.routed = self.routed, []  # the prefill's recorded forwards
        prompt_experts = None if self.recorder is None else prompt_codes(prompts, before, calls, self._missing)
        if cache is not None:
            repeat_rows(cache, n)
        batch = len(prompts) * n
        return DecodeState(
            params=params, generator=generator, cache=cache,
            uniforms=None if gens is None else chunk_uniforms(gens, max_new, n).to(device),  # one copy per chunk
            seqs=None if cache is not None else input_ids.repeat_interleave(n, dim=0),  # without a cache: [B, P + step]
            logits=logits.repeat_interleave(n, dim=0), logits_version=self._version,
            attention_mask=attention_mask.repeat_interleave(n, dim=0),
            next_pos=position_ids[:, -1:].repeat_interleave(n, dim=0) + 1,  # [B, 1]
            active=torch.arange(batch),  # rows still in the batch, in the order of the cache rows (host side)
            rows=torch.arange(batch, device=device),  # the same, on the device
            alive=torch.ones(batch, dtype=torch.bool, device=device),  # per batch row: no stop token yet
            finite=torch.ones((), dtype=torch.bool, device=device),
            tokens=torch.full((batch, max_new), self.pad_id, dtype=torch.long, device=device),
            logprobs=torch.zeros((batch, max_new), dtype=torch.float32, device=device),
            versions=torch.zeros((batch, max_new), dtype=torch.long, device=device),
            lengths=torch.zeros(batch, dtype=torch.long, device=device),
            stopped=torch.zeros(batch, dtype=torch.bool, device=device),
            width=width if static else None, keep=keep, prefill_width=attention_mask.shape[1],
            kv_version=self._version, prompt_experts=prompt_experts,
            experts=None if prompt_experts is None else self._missing((batch, max_new), device),
            seen=None if params.repetition_penalty == 1.0 else seen_tokens(prompts, logits.shape[-1], device
                                                                          ).repeat_interleave(n, dim=0),
            room=self._room(prompts, max_new, n, device))

    def _room(self, prompts: list[list[int]], max_new: int, n: int, device) -> torch.Tensor | None:
        """Per row, the response tokens that fit the model's learned positions with its prompt (rows stop
        there, as at max_new_tokens); None when every row has room for max_new_tokens."""
        limit = self.position_limit
        if limit is None or max(map(len, prompts)) + max_new <= limit:
            return None
        return torch.tensor([limit - len(p) for p in prompts], device=device).repeat_interleave(n)

    def _missing(self, shape: tuple, device: torch.device) -> torch.Tensor:
        """Expert codes [*shape, layers, k] of tokens the engine did not compute (record_experts)."""
        return missing_codes(shape, self.recorder, device)

    def _shared_prefix(self, prompts: list[list[int]], cache) -> int:
        """How many leading tokens of `prompts` to prefill once for all (rollout.prefix); 0 = none."""
        return shared_prefix_length(prompts) if self.share_prefix and self._growing(cache) else 0

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _check_cache_width(self, cache, width: int) -> None:
        """After a prefill: the cache holds the `width` columns of the attention mask, no more (CPM-Ant's
        forward prepends prompt tokens of its own, which the engine's masks would not cover)."""
        added = cache.get_seq_length() - width
        if added > 0:
            raise ModelError(f"{type(self.model).__name__}: its forward adds {added} tokens of its own to the KV "
                             "cache, which the HF engine's attention masks do not cover; it cannot be decoded here: "
                             "pick another causal LM")

