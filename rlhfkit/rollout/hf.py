"""`HFEngine`: a transformers generation engine with its own KV-cache decode loop.

Per chunk of prompts: left-pad them, prefill each prompt ONCE, copy its cache to the n samples
(`kv_cache.repeat_rows`), then decode one token per step for every unfinished
row. Finished rows are dropped from the batch (`kv_cache.select_rows`), and the loop stops as
soon as every row has hit a stop token or `max_new_tokens`. The prefill paths (plain, shared-prefix,
kept-turn) are in rollout/prefill.py (`Prefill`, which `HFEngine` inherits); this module holds the
engine's protocol, the interruptible generation, the decode loop and its forwards.

Why not `model.generate`: it prefills each prompt n times (num_return_sequences repeats the
input before the prefill), keeps decoding finished rows, and gives processed scores rather than
the logprobs we return; it measured 1.45-1.9x slower on SmolLM2 on CPU (see
bench/rollout_vs_generate.py). transformers' continuous batching was also reported slower on CPU.

Interruptible: `start` + `resume(gen, max_new_tokens_this_call)` run a generation in slices, its
decode state (tokens, KV cache, samplers, finished rows) kept in a `PartialGeneration` between
calls, so that a weight update can land in between (partial rollouts); `generate` is one `resume`
to the end. Every token is stamped with the version of the weights whose logits it came from.

Any causal LM: the fast parts are taken where they give the model's own numbers, and a note is
logged once (logger "rlhfkit", INFO) where they are not. The growing KV-cache layers replace only
transformers' plain full-attention `DynamicLayer`s (sliding-window, linear-attention and other
layers stay as transformers builds them). A model that takes no `DynamicCache` (e.g. RWKV, Mamba),
or whose cache layers cannot be copied per sample (linear attention, e.g. Qwen3-Next), is
decoded without a cache: one prompt per chunk (no padding), the whole sequence at each step. The
grouped one-token attention replaces SDPA on CPU only for plain attention (no soft-capping, no
attention sinks, no dropout); other calls go to SDPA as before.

With `compile_decode`, the decode steps run the model under torch.compile over a static KV
cache (transformers' `StaticLayer`s, one fixed-length buffer per layer of prompt width + max new
tokens rounded up to a bucket, written in place; the attention mask covers the whole buffer), so each
step has the same shapes and runs as one compiled graph (a CUDA graph on CUDA); the prefill stays
eager. Finished rows are still dropped (the rows bucketed to powers of two), and the buffers are the
engine's own, reused by every chunk and row drop, so CUDA graphs are not recorded again for new
addresses (rollout/static_cache.py). The compiled step is one per model and process
(`models.compile.compile_decode_step`): a new engine over the same model does not compile again.
It is off on the CPU, where it measured no faster than the eager loop (`compile_on_cpu` turns it on
there, for tests and benches). Where it cannot be built (no C++ compiler for the CPU backend, cache
layers other than plain full attention, a compile error at the first step) one line is logged and
the loop decodes eagerly.

Host syncs: the sampled tokens, logprobs and lengths stay on the model's device until the chunk
ends; the loop reads back (syncs) only to learn which rows finished, every step on the CPU (where
it costs nothing and a finished row is dropped at once) and every `STOP_CHECK_EVERY["cuda"]` steps
on CUDA (rows that finished in between keep decoding until then; their extra tokens are discarded).
With per-prompt seeds, a chunk's sampling uniforms are drawn at its prefill and copied to the device
once (`chunk_uniforms`), not copied at every step (each copy waited for the device).

The logprob of each sampled token is
log_softmax(logits / T) in float32 BEFORE top-k/top-p truncation (T = 1 for greedy), which is
what `rlhfkit.models.response_logprobs` computes at the same temperature.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

import torch

from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.errors import ConfigError
from rlhfkit.models.host import own_memory
from rlhfkit.models.loading import position_limit, position_offset
from rlhfkit.models.logprobs import forward_parameters, note_once
from rlhfkit.models.moe import ExpertRecorder, routing_shape
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.bf16_decode import Bf16Decoder, bf16_decode_support
from rlhfkit.rollout.constrained import Constraint, Grammars
from rlhfkit.rollout.decode_attention import decode_attention
from rlhfkit.rollout.decode_state import DecodeState, PartialGeneration
from rlhfkit.rollout.kv_cache import cache_support, growing_layer_class, left_padding_changes_numbers, select_rows
from rlhfkit.rollout.prefill import Prefill
from rlhfkit.rollout.sampling import check_finite, check_params, sample, seeded
from rlhfkit.rollout.static_cache import StaticBuffers, bucketed_rows, static_cache_support
from rlhfkit.rollout.turns import TurnCaches, row_entry

# Decode steps between the loop's reads of which rows finished (a host sync), per device type; 1
# elsewhere. On CUDA a read per step would stall the queue of (graph-replayed) steps at every token.
STOP_CHECK_EVERY = {"cuda": 8}


class HFEngine(Prefill):
    """Generation engine over a transformers causal LM (CPU or GPU). Implements GenerationEngine.

    Args:
      model: a causal LM; may be the trainer's own policy module (then weights are shared and
        `update_weights({}, v)` only stamps the version).
      tokenizer: gives the pad and EOS ids.
      max_batch_size: most sequences (prompts x n) decoded at once; None = no limit.
      max_batch_tokens: most (prompt + new) tokens held in the KV cache at once; None = no limit.
        A chunk always holds at least one prompt with its n samples.
      autocast_dtype: run forwards under torch.autocast with this dtype (bf16 is ~1.7x faster
        than fp32 on CPU here). float16 (for GPUs without bf16) runs on a CPU too, far slower than
        float32 there (one logged line).
      version: the initial policy version.
      inference_mode: decode under torch.inference_mode; False uses torch.no_grad, which an
        FSDP2-sharded model needs (its all-gather buffers must not become inference tensors). With
        `autocast_dtype` no_grad is used anyway: under inference mode autocast does not cache its
        casts of the weights, so every weight was cast again at every decode step (the LM head
        alone, 49152 x 576, took 19 ms per step on this CPU).
      compile_decode: decode steps under torch.compile over a static KV cache (module docstring);
        off on the CPU (measured no faster than the eager loop there) and where it cannot be built:
        the eager loop, with one logged line.
      compile_on_cpu: with `compile_decode`, compile on the CPU too (tests of the compiled path, benches).
      gather: `gather(model)` is a context every decoding call runs inside; FSDP passes
        `distributed.fsdp.unsharded` (the parameters gathered once per call, not per decoded token).
      share_prefix: the tokens every prompt of a chunk starts with (a chat template's system prompt)
        prefilled once for the chunk, their KV cache copied to each prompt's row (rollout.prefix);
        only over a growing (full-attention) cache of a model that takes position ids.
      keep_turns: keep an episode's KV cache across its turns when `generate` gets `episode_keys`
        (rollout.turns): its next turn prefills only its new tokens. Under the same conditions as
        `share_prefix`, with n = 1 and without `compile_decode`; the kept caches hold at most
        `max_batch_tokens` tokens, and a weight update drops them.
      row_hook: called before every forward with, for each row of its batch, the index of the prompt
        (in the generation's prompts) the row belongs to: a model whose rows differ (per-row LoRA
        adapters, models.lora_rows) sets itself up for that batch. Turns off `share_prefix`,
        `keep_turns` and `bf16_decode` (their forwards mix rows or skip the model's modules); not with
        `compile_decode`.
      bf16_decode: with bfloat16 autocast on the CPU, prefills and decode steps over a bf16 copy of
        the weights (q/k/v and gate/up stacked, packed for oneDNN), made when a generation starts
        (again if the weights change between its slices) and freed when it ends (rollout.bf16_decode);
        Llama and Qwen2 models only, else the model's forward. The same ops, up to bf16 rounding.
      record_experts: a mixture-of-experts model's routing is recorded (routing replay): each
        trajectory's `experts` holds the experts every MoE layer chose for each prompt and response
        token the engine ran through the model, in the forward that first computed it (a kept turn's
        tokens and each response's last token, never run: missing). Not recorded by the compiled
        decode step (its tokens missing, one logged line).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        max_batch_size: int | None = None,
        max_batch_tokens: int | None = None,
        autocast_dtype: torch.dtype | None = None,
        version: int = 0,
        inference_mode: bool = True,
        compile_decode: bool = False,
        compile_on_cpu: bool = False,
        gather=None,
        share_prefix: bool = True,
        keep_turns: bool = True,
        row_hook=None,
        bf16_decode: bool = True,
        record_experts: bool = False,
    ):
        if row_hook is not None and compile_decode:
            raise ConfigError("HFEngine: row_hook (per-row model setup) does not run under compile_decode")
        self.model, self.gather, self.share_prefix = model, gather, share_prefix and row_hook is None
        self.row_hook = row_hook
        self.recorder = ExpertRecorder(model) if record_experts and routing_shape(model) else None
        if record_experts and self.recorder is None:
            note_once(f"routing replay: {type(model).__name__} has no routers returning (logits, weights, experts); "
                      "nothing is recorded or replayed")
        self.routed: list = []  # the recorded experts of the forwards since the last read (with `recorder`)
        self._no_grad = torch.inference_mode if inference_mode and autocast_dtype is None else torch.no_grad
        if autocast_dtype == torch.float16 and self.device.type == "cpu":
            note_once("the HF engine decodes under float16 autocast on the CPU, where float16 matmuls run far "
                      "slower than float32 (float16 is for GPUs without bf16); bfloat16 or float32 run faster here")
        for name, value in (("max_batch_size", max_batch_size), ("max_batch_tokens", max_batch_tokens)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1 or None, got {value}")
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.autocast_dtype = autocast_dtype
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._grammars = Grammars(tokenizer)  # constrained sampling's (its llguidance tokenizer built on first use)
        self.eos_ids = eos_ids(model, tokenizer)
        takes = forward_parameters(model)
        self._keep_last_logits = "logits_to_keep" in takes
        self._takes_positions = "position_ids" in takes  # else the model derives them (e.g. from the mask)
        self._position_offset = position_offset(model)  # the RoBERTa family numbers from pad_token_id + 1
        self._cached = cache_support(model) is None
        self._pads_prompts = self._cached and not left_padding_changes_numbers(model, self.pad_id,
                                                                              self._position_offset)
        self.position_limit = position_limit(model)  # a learned position table's rows (GPT-2, OPT), else None
        self._version = version
        self._owns_weights = False  # whether update_weights gave the weights memory of their own (own_memory)
        self._compiled_step = None
        self.banned_ids: torch.Tensor | None = None  # token ids never sampled (a VisionEngine's image tokens)
        self.static_buffers = StaticBuffers()  # the compiled step's KV rows, reused by every chunk
        self.turns = TurnCaches(max_batch_tokens)  # episodes' kept caches (rollout.turns)
        self.prefilled_tokens = 0  # prompt tokens run through prefill forwards (those of kept turns not counted)
        if compile_decode and self._cached and static_cache_support(model):
            from rlhfkit.models.compile import compile_decode_step

            self._compiled_step = compile_decode_step(model, on_cpu=compile_on_cpu)
        self._bf16 = None  # the decode step over a bf16 copy of the weights (rollout.bf16_decode)
        if (bf16_decode and row_hook is None and autocast_dtype == torch.bfloat16 and self._cached
                and self._compiled_step is None):
            reason = bf16_decode_support(model)
            if reason is None:
                self._bf16 = Bf16Decoder(model)
            else:
                note_once(f"the HF engine's bf16 decode step is off for {type(model).__name__}: {reason}")
        # the hint of GenerationEngine.generate's callers (rollout.base.turn_kwargs)
        self.keeps_turns = (keep_turns and row_hook is None and self._cached and self._takes_positions
                            and self._compiled_step is None)

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def device(self) -> torch.device:
        """Where the model's weights are now (read per call: the trainer may move the model)."""
        return next(self.model.parameters()).device

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load `state` (possibly partial; strict=False) when non-empty, and set `version`. Before the first
        load, parameters a checkpoint file maps get memory of their own (`models.host.own_memory`:
        writing into the mapping would copy it out page by page)."""
        if state:
            if not self._owns_weights:  # once: the copies stay the parameters' storage after
                own_memory(self.model.parameters())
                self._owns_weights = True
            result = self.model.load_state_dict(dict(state), strict=False)
            if result.unexpected_keys:
                raise ConfigError(f"update_weights got keys the model lacks: {result.unexpected_keys[:5]}")
        self._version = version
        self.turns.clear()  # even with no state: a shared module's weights changed in place

    def end_episodes(self, keys: Sequence) -> None:
        """Free the kept caches of the episodes `keys` (they are finished)."""
        self.turns.end(keys)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
        episode_keys: Sequence | None = None,
        constraints: Sequence[Constraint | None] | None = None,
    ) -> list[Trajectory]:
        """Sample `params.n` responses per prompt; sample s of prompt i is at index i*n + s.

        With `seeds` (one per prompt), prompt i's samples are drawn from its own generator
        seeded with seeds[i] (n uniforms per prompt per token, one per sample), so they do not depend on
        which other prompts share the call or in what order: any sharding of the prompts over
        engines gives the same samples. Otherwise one `generator` samples the whole batch.

        `episode_keys` (one hashable per prompt, n = 1): the prompts are turns of these episodes; each
        row's KV cache is kept for the episode's next turn, and a kept one starts this turn's prefill
        where it still holds (rollout.turns). `end_episodes` frees them. `constraints` (one per prompt, None:
        unconstrained): what each prompt's responses must be, sampled under its grammar (rollout.constrained)."""
        return self.resume(self.start(prompts, params, generator, group_ids, seeds, episode_keys, constraints))

    # ------------------------------------------------------------------ interruptible generation
    def start(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
              generator: torch.Generator | None = None, group_ids: Sequence[int] | None = None,
              seeds: Sequence[int] | None = None, episode_keys: Sequence | None = None,
              constraints: Sequence[Constraint | None] | None = None) -> PartialGeneration:
        """A generation not run yet (arguments as `generate`); `resume` runs it, in slices if asked."""
        check_params(params, prompts, group_ids)
        longest = max(map(len, prompts), default=0)
        if self.position_limit is not None and longest >= self.position_limit:
            raise ConfigError(f"a prompt of {longest} tokens leaves no room for a response in "
                              f"{type(self.model).__name__}'s {self.position_limit} positions; keep prompts shorter "
                              "(--data.prompt_max_len)")
        for name, values in (("seeds", seeds), ("episode_keys", episode_keys), ("constraints", constraints)):
            if values is not None and len(values) != len(prompts):
                raise ConfigError(f"{name} has {len(values)} entries for {len(prompts)} prompts")
        keys = list(episode_keys) if episode_keys is not None and self.keeps_turns and params.n == 1 else None
        stop_ids = torch.tensor(sorted(set(self.eos_ids) | set(params.stop_token_ids)), dtype=torch.long)
        return PartialGeneration([list(p) for p in prompts], params, stop_ids, generator,
                                 None if seeds is None else list(seeds),
                                 None if group_ids is None else list(group_ids), list(self._chunks(prompts, params)),
                                 episode_keys=keys, constraints=self._constraints(constraints))

    def resume(self, gen: PartialGeneration, max_new_tokens_this_call: int | None = None) -> list[Trajectory] | None:
        """Decode at most `max_new_tokens_this_call` more tokens of `gen` (None: to the end); the
        trajectories once every chunk is done, else None. Between calls `gen` keeps the tokens, the
        KV cache and the samplers' state: a weight update in between (`update_weights`) is used by
        the tokens decoded after it, each token stamped with the version of the weights whose
        logits it was sampled from; nothing already decoded is recomputed."""
        budget = math.inf if max_new_tokens_this_call is None else max_new_tokens_this_call
        was_training = self.model.training
        self.model.eval()
        try:
            gathered = self.gather(self.model) if self.gather is not None else contextlib.nullcontext()
            with self._no_grad(), self._autocast(), decode_attention(self.model), gathered:
                if self._bf16 is not None and self.device.type == "cpu":
                    self._bf16.refresh()  # a copy of the weights of this call (rebuilt if they changed)
                while budget > 0 and len(gen.done) < len(gen.chunks):
                    start, stop = gen.chunks[len(gen.done)]
                    if gen.state is None:
                        gens = None if gen.seeds is None else [seeded(x) for x in gen.seeds[start:stop]]
                        gen.state = self._prefill_chunk(gen, start, stop, gens)
                        if gen.constraints is not None:
                            gen.state.matchers = self._grammars.rows(gen.constraints[start:stop], gen.params.n,
                                                                     gen.stop_ids)
                    budget -= self._decode(gen.state, gen.stop_ids, budget)
                    if gen.state.finished:
                        gen.done.append(gen.state)
                        gen.state = None
        finally:
            self.model.train(was_training)
        if len(gen.done) < len(gen.chunks):
            return None
        if self._bf16 is not None:  # the weights change before the next generation: no copy held meanwhile
            self._bf16.release()
        return self._trajectories(gen)

    def _constraints(self, constraints: Sequence[Constraint | None] | None) -> list | None:
        """The generation's per-prompt constraints, None when none is set (the decode loop then keeps no matchers)."""
        if constraints is None or all(c is None for c in constraints):
            return None
        return list(constraints)

    def _trajectories(self, gen: PartialGeneration) -> list[Trajectory]:
        # Built outside inference mode: trajectories hold ordinary tensors a loss may save for backward.
        out: list[Trajectory] = []
        for (start, _), st in zip(gen.chunks, gen.done):
            for row in range(st.tokens.shape[0]):
                i = start + row // gen.params.n
                group = gen.group_ids[i] if gen.group_ids is not None else i
                t = self._trajectory(gen.prompts[i], st.tokens[row], st.logprobs[row], st.lengths[row],
                                     st.stopped[row], group, st.versions[row])
                if st.experts is not None:  # prompt + response tokens (the last never ran: missing)
                    prompt = st.prompt_experts[row // gen.params.n]
                    t.experts = torch.cat([prompt, st.experts[row, : t.response_length]])
                out.append(t)
        return out

    # ------------------------------------------------------------------ decode loop

    def _growing(self, cache) -> bool:
        """Whether `cache` is growing full-attention layers only, of a model that takes position ids:
        what laying rows out with padding inside them needs (sliding-window layers keep their own cache)."""
        return (cache is not None and self._takes_positions
                and all(type(layer) is growing_layer_class() for layer in cache.layers))

    def _decode(self, s: DecodeState, stop_ids: torch.Tensor, budget: float) -> int:
        """Decode at most `budget` tokens per row of `s` (stops early when every row is done);
        returns the tokens decoded per row. The results stay on the device until the chunk ends."""
        params, max_new, n = s.params, s.params.max_new_tokens, s.params.n
        stop_ids = stop_ids.to(s.alive.device)
        check_every = STOP_CHECK_EVERY.get(s.alive.device.type, 1)
        if s.keep is not None and s.kv_version != self._version:
            s.keep = None  # the weights changed since the prefill: its rows' caches mix two versions
        decoded = 0
        while decoded < budget and not s.finished:
            step = s.step
            u = None if s.uniforms is None else s.uniforms[s.rows // n, step, s.rows % n]  # on the device
            seen = None if s.seen is None else s.seen[s.rows]
            allowed = None if s.matchers is None else s.matchers.allowed(s.active, s.logits.shape[-1], s.logits.device)
            tok, lp = sample(s.logits, params, s.generator, u, self.banned_ids, seen, allowed)
            if s.matchers is not None:  # each constrained row's grammar takes its token
                s.matchers.advance(s.active, tok, s.alive)
            if s.seen is not None:
                s.seen[s.rows, tok] = True
            s.finite &= (torch.isfinite(lp) | ~s.alive).all()  # finished rows may still be in the batch
            s.tokens[s.rows, step] = torch.where(s.alive, tok, self.pad_id)
            s.logprobs[s.rows, step] = torch.where(s.alive, lp, 0.0)
            s.versions[s.rows, step] = s.logits_version
            s.lengths[s.rows] += s.alive
            hit = torch.isin(tok, stop_ids) & s.alive
            s.stopped[s.rows] |= hit
            s.alive &= ~hit
            if s.room is not None:  # out of positions: the row ends as at max_new_tokens
                s.alive &= s.lengths[s.rows] < s.room[s.rows]
            s.step, decoded = step + 1, decoded + 1
            if step == max_new - 1:
                self._keep_rows(s)
                self._finish(s)
                break
            if (step + 1) % check_every == 0:  # the loop's only host sync
                check_finite(s.finite)
                keep = s.alive.nonzero().squeeze(-1)
                if keep.numel() == 0:
                    self._keep_rows(s)
                    self._finish(s)
                    break
                if s.width is not None:  # the compiled step: a few batch sizes only
                    keep = bucketed_rows(keep, s.alive)
                if keep.numel() < s.alive.numel():  # drop finished rows from the batch and the cache
                    self._keep_rows(s, (~s.alive).nonzero().squeeze(-1))
                    s.active, s.rows, s.alive = s.active[keep.cpu()], s.rows[keep], s.alive[keep]
                    tok, s.next_pos, s.attention_mask = tok[keep], s.next_pos[keep], s.attention_mask[keep]
                    if s.cache is not None:
                        select_rows(s.cache, keep)
                    else:
                        s.seqs = s.seqs[keep]
                    if s.matchers is not None and not s.matchers.constrains(s.active):
                        s.matchers = None  # the constrained rows are done: no mask, no token read-back per step
            if s.width is not None:  # static cache: open the new token's column
                s.attention_mask[:, s.width + step] = 1
            else:
                mask = s.attention_mask
                s.attention_mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            if self.row_hook is not None:
                self.row_hook((s.first + s.active // n).tolist())
            if s.cache is not None:
                s.logits = self._forward(tok.unsqueeze(-1), s.attention_mask, s.next_pos, s.cache, compiled=True,
                                         extra=self._decode_extra(s))
            else:
                s.seqs = torch.cat([s.seqs, tok.unsqueeze(-1)], dim=1)
                s.logits = self._uncached_logits(s)
            if s.experts is not None:  # the fed token's experts (the last column of the forward)
                fed = self.routed.pop()
                if fed is not None:
                    s.experts[s.rows, step] = fed[:, -1]
            s.logits_version = self._version
            s.next_pos = s.next_pos + 1
        return decoded

    def _keep_rows(self, s: DecodeState, positions: torch.Tensor | None = None) -> None:
        """Keep, for their episodes' next turns, the caches of the batch rows at `positions` (all when
        None) that finished or stop now: the real columns of the prefill and the response tokens the
        row ran through the model (all but its last). No-op for a chunk without episode keys."""
        if s.keep is None:
            return
        lengths = s.lengths[s.rows].tolist()  # at a stop check: the host reads the device anyway
        for pos in range(len(s.active)) if positions is None else positions.tolist():
            row, length = int(s.active[pos]), lengths[pos]
            key, prompt = s.keep[row]
            real = s.attention_mask[pos, : s.prefill_width].nonzero().squeeze(-1)
            fed = torch.arange(s.prefill_width, s.prefill_width + length - 1, device=real.device)
            tokens = prompt + s.tokens[row, : length - 1].tolist()
            self.turns.put(key, row_entry(s.cache, pos, torch.cat([real, fed]), tokens, s.kv_version))

    def _decode_extra(self, s: DecodeState) -> dict | None:
        """More keyword arguments of a cached decode step of `s` (none for text; rollout.vision's per-token image
        inputs)."""
        return None

    def _uncached_logits(self, s: DecodeState) -> torch.Tensor:
        """The next-token logits of a model decoded without a cache: a forward over the whole sequences `s.seqs`."""
        return self._forward(s.seqs, s.attention_mask, (s.attention_mask.cumsum(-1) - 1).clamp(min=0), None)

    @staticmethod
    def _finish(s: DecodeState) -> None:
        """The chunk is done: check the logprobs, bring its results to the CPU, free its cache."""
        check_finite(s.finite)
        s.finished, s.cache, s.seqs, s.logits = True, None, None, None
        s.tokens, s.logprobs, s.versions = s.tokens.cpu(), s.logprobs.cpu(), s.versions.cpu()
        s.lengths, s.stopped = s.lengths.cpu(), s.stopped.cpu()
        if s.experts is not None:
            s.experts, s.prompt_experts = s.experts.cpu(), [e.cpu() for e in s.prompt_experts]

    def _forward(self, input_ids, attention_mask, position_ids, cache, compiled: bool = False,
                 extra: dict | None = None) -> torch.Tensor:
        """One forward of the model (`compiled`: a decode step, through the compiled step when there is
        one; with `cache`, or over the whole sequence when it is None); float32 logits of the last
        position [B, V]. `extra`: more keyword arguments (they win over the ones made here)."""
        kwargs = {"logits_to_keep": 1} if self._keep_last_logits else {}
        if self._takes_positions:
            kwargs["position_ids"] = position_ids + self._position_offset if self._position_offset else position_ids
        if cache is not None:
            kwargs["past_key_values"] = cache
        kwargs.update(input_ids=input_ids, attention_mask=attention_mask, use_cache=cache is not None)
        kwargs.update(extra or {})
        if self._bf16 is not None and self._bf16.ready and not extra and self._growing(cache) and self.recorder is None:
            return self._bf16.forward(input_ids, attention_mask, position_ids, cache)
        step = self._compiled_step if compiled else None
        if step is None:
            with self._recording(input_ids.shape[0]):
                return self.model(**kwargs).logits[:, -1].float()
        if self.recorder is not None:
            note_once("routing replay: the compiled decode step (--rollout.compile_decode) records no experts; the "
                      "trainer's routers choose the experts of the tokens it decodes")
            self.routed.append(None)
        try:
            out = step(self.model, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure to build the compiled step: decode eagerly
            from rlhfkit.models.compile import decode_step_failed

            note_once(f"--rollout.compile_decode: torch.compile failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); the rollout decodes eagerly")
            decode_step_failed(self.model, step)
            self._compiled_step = None
            out = self.model(**kwargs)
        return out.logits[:, -1].float()

    def _recording(self, rows: int):
        """The routers' choices of one forward over `rows` rows appended to `self.routed` (record_experts)."""
        return contextlib.nullcontext() if self.recorder is None else self.recorder.recording(rows, self.routed)

    def _chunks(self, prompts: Sequence[Sequence[int]], params: SamplingParams):
        """Yield [start, stop) ranges of prompts that fit max_batch_size / max_batch_tokens (one
        prompt per chunk when decoding without a cache or a model left padding changes: its rows need no
        padding)."""
        if not self._cached or not self._pads_prompts:
            yield from ((i, i + 1) for i in range(len(prompts)))
            return
        start = 0
        while start < len(prompts):
            stop, width = start, 0
            while stop < len(prompts):
                new_width = max(width, len(prompts[stop]))
                rows = (stop - start + 1) * params.n
                too_many = self.max_batch_size is not None and rows > self.max_batch_size
                cached = rows * (new_width + params.max_new_tokens)
                too_long = self.max_batch_tokens is not None and cached > self.max_batch_tokens
                if stop > start and (too_many or too_long):
                    break
                stop, width = stop + 1, new_width
            yield start, stop
            start = stop

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _trajectory(self, prompt, tokens, logprobs, length, stopped, group_id, versions) -> Trajectory:
        length = int(length)
        versions = versions[:length].clone()
        return Trajectory(
            prompt_ids=torch.tensor(list(prompt), dtype=torch.long),
            response_ids=tokens[:length].clone(),
            loss_mask=torch.ones(length, dtype=torch.bool),
            logprobs=logprobs[:length].clone(),
            finish_reason=FINISH_STOP if bool(stopped) else FINISH_LENGTH,
            version=int(versions.min()) if length else self._version,
            group_id=int(group_id),
            versions=versions,
        )


# ---------------------------------------------------------------------- helpers


def eos_ids(model: torch.nn.Module, tokenizer) -> tuple[int, ...]:
    """EOS ids from the tokenizer and the model's generation config (which may list several)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(i) for i in ([gen_eos] if isinstance(gen_eos, int) else gen_eos))
    return tuple(sorted(ids))
