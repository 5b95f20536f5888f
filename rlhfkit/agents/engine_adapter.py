"""A `GenerationEngine` seen through the methods OpenRLHF agent files call on vLLM's async engine.

Agent files of OpenRLHF's mid-2025 contract receive `llm_engine` (a vLLM `AsyncLLMEngine`) and
call, token-in token-out:

    final = None
    async for out in llm_engine.generate({"prompt_token_ids": ids}, sampling_params, request_id):
        final = out
    final.outputs[0].token_ids, final.outputs[0].text, final.outputs[0].logprobs

(files of 2026 `await llm_engine.generate(ids, sampling_params)` instead; both work here).
`EngineAdapter` offers that face over rlhfkit's engine:

- Each call belongs to one episode (the `EpisodeRecord` the runner set for the asyncio task that
  runs its `execute`); the episode's k-th call samples with its k-th seed, drawn from the
  episode's own seed, so an episode's tokens do not depend on the other episodes of the batch.
- A call from another thread (an agent file that serves its own OpenAI-compatible API, as
  OpenRLHF's server-executor example does, and calls the engine from its server's thread) has no
  episode: it is generated on the runner's loop, seeded from the batch, and recorded with the
  batch's other such calls; a result's action tokens are looked up there too.
- Calls made while other episodes are busy are gathered and sent to the engine in ONE batched
  `engine.generate` (grouped by sampling parameters): the HF engine on CPU gains a lot from it.
- Every generation is recorded in the episode (context ids, output ids, logprobs): the runner
  takes the rollout logprobs of a result's action tokens from this record and checks that they
  are tokens the engine generated after exactly the tokens before them.
- `max_tokens` is capped at `per_turn` (--rollout.max_new_tokens) and at the room left under the
  episode's `max_length`; `stop` strings cut the output after the generation (the tokens up to
  the one that completes the string are what sampling would have produced had it stopped
  there). `min_tokens` above 1 is refused: the engine cannot hold back its stop tokens.
- With a vision-language policy a call may carry images as vLLM takes them,
  `generate(ids, sampling_params, multi_modal_data={"image": [...]})`: `images` (an ImageEncoder)
  turns them into the prompt's image tensors, checked against the image tokens of its ids; the
  recorded generation keeps them (their keys and tensors) for the trajectory's trainer forward.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.agents.images import ImageEncoder
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.errors import RewardError
from rlhfkit.rollout.base import GenerationEngine, SamplingParams


@dataclass
class VLLMSamplingParams:
    """vLLM's `SamplingParams` fields that rlhfkit honours; mutable, as agent files set `max_tokens`.

    `logprobs` (None or k): whether outputs carry `logprobs`; rlhfkit records them regardless.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    seed: int | None = None  # ignored: each episode samples from its own seed


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str  # "stop" or "length"
    stop_reason: str | int | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class Generation:
    """One recorded sample: the context it was generated after, its tokens and their logprobs; the
    context's images (their keys and tensors) with a vision-language policy."""

    context: list[int]
    tokens: list[int]
    logprobs: list[float]
    used: bool = False
    image_keys: tuple[str, ...] = ()
    vision: Any = None


@dataclass
class EpisodeRecord:
    """What the adapter knows of one `execute` call (one sample of one prompt)."""

    group_id: int
    seed: int
    max_length: int  # prompt tokens + the response budget
    max_steps: int = 1  # --agent.max_turns
    generations: list[Generation] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)  # what execute put on the result queue
    _seeds: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._seeds = torch.Generator().manual_seed(self.seed)

    def next_seed(self) -> int:
        """The seed of this episode's next engine call (call k: the k-th draw from `seed`)."""
        return int(torch.randint(0, 2**62, (1,), generator=self._seeds))


@dataclass
class _Request:
    ids: list[int]
    params: SamplingParams
    seed: int
    future: asyncio.Future
    vision: Any = None


class EngineAdapter:
    """`llm_engine` for agent files: vLLM's `generate` over a rlhfkit `GenerationEngine`.

    Args:
      tokenizer: decodes outputs (`text`) and encodes string prompts.
      per_turn: most new tokens of one call (--rollout.max_new_tokens).
      source: the agent file, for error messages.
    `engine` is set by the runner before each rollout batch; with a vision-language policy so is
    `images` (an `ImageEncoder`: a call's `multi_modal_data` images become the prompt's image tensors).
    """

    def __init__(self, tokenizer, per_turn: int, source: str):
        self.tokenizer, self.per_turn, self.source = tokenizer, per_turn, source
        self.engine: GenerationEngine | None = None
        self.episode: contextvars.ContextVar[EpisodeRecord] = contextvars.ContextVar(f"agent_episode_{id(self)}")
        self.engine_error: BaseException | None = None  # an engine failure, re-raised as it is
        self._pending: list[_Request] = []
        self._flusher: asyncio.Task | None = None
        self.home: asyncio.AbstractEventLoop | None = None  # the runner's loop (set per batch)
        self.foreign: EpisodeRecord | None = None  # the calls made from other threads in this batch
        self.images: ImageEncoder | None = None  # a vision-language policy's (set per batch)

    # ------------------------------------------------------------------ vLLM's face
    def generate(self, prompt: Any, sampling_params: Any, request_id: str | None = None,
                 multi_modal_data: Any = None, **kwargs: Any) -> _Call:
        """Token ids in (`{"prompt_token_ids": ids}`, a list of ids, or a string), a RequestOutput out;
        await it or iterate it with `async for` (one, final output). Images as vLLM takes them:
        `multi_modal_data={"image": [...]}` (or that key of the prompt dict), the ids holding each
        image's tokens expanded (ImageEncoder)."""
        if isinstance(prompt, dict) and multi_modal_data is None:
            multi_modal_data = prompt.get("multi_modal_data")
        return _Call(lambda: self._generate(prompt, sampling_params, request_id or "0", multi_modal_data))

    def placeholders(self) -> list[int]:
        """The engine's image placeholder ids (a VisionEngine's `banned_ids`; none for a text engine)."""
        banned = getattr(self.engine, "banned_ids", None)
        return [] if banned is None else [int(t) for t in banned.tolist()]

    async def get_tokenizer(self, *args: Any, **kwargs: Any):
        return self.tokenizer

    # ------------------------------------------------------------------ the runner's side
    def current(self, what: str) -> EpisodeRecord:
        record = self.episode.get(None)
        if record is None:
            raise RewardError(f"agent {self.source}: {what} was called outside execute(); rlhfkit ties each "
                              "engine call and result to the execute() call that makes it")
        return record

    def cancel_pending(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        self._pending, self._flusher = [], None

    # ------------------------------------------------------------------ internals
    async def _generate(self, prompt: Any, sp: Any, request_id: str, data: Any = None) -> RequestOutput:
        record = self.episode.get(None)
        here = asyncio.get_running_loop()
        if record is None and self.home is not None and here is not self.home and self.foreign is not None:
            # a call from the agent file's own thread (e.g. a server it runs): generated on the runner's loop,
            # recorded beside the episodes (result_to_trajectory finds its tokens there)
            call = self._generate_for(self.foreign, prompt, sp, request_id, data)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self.home))
        return await self._generate_for(self.current("llm_engine.generate"), prompt, sp, request_id, data)

    async def _generate_for(self, record: EpisodeRecord, prompt: Any, sp: Any, request_id: str,
                            data: Any = None) -> RequestOutput:
        ids = self._prompt_ids(prompt)
        if self.images is not None:
            vision, keys = self.images(ids, data, self.placeholders())
        elif data:
            raise RewardError(f"agent {self.source}: llm_engine.generate got multi_modal_data, which needs a "
                              "vision-language policy")
        else:
            vision, keys = None, ()
        room = min(self.per_turn, record.max_length - len(ids))
        max_tokens = getattr(sp, "max_tokens", None)
        room = room if max_tokens is None else min(room, int(max_tokens))
        params = self._engine_params(sp, room)
        if room <= 0:
            samples = [([], [], FINISH_LENGTH)] * params.n
        else:
            future = asyncio.get_running_loop().create_future()
            self._pending.append(_Request(ids, params, record.next_seed(), future, vision))
            if self._flusher is None:
                self._flusher = asyncio.get_running_loop().create_task(self._flush_when_idle())
            trajs: list[Trajectory] = await future
            samples = [(t.response_ids.tolist(), t.logprobs.tolist(), t.finish_reason) for t in trajs]
        outputs = [self._output(i, ids, *s, sp, record, (keys, vision)) for i, s in enumerate(samples)]
        return RequestOutput(request_id, ids, outputs)

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        if isinstance(prompt, str):  # as vLLM encodes a text prompt
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise RewardError(f"agent {self.source}: llm_engine.generate got a prompt of type {type(prompt).__name__}; "
                          "give {'prompt_token_ids': [ids]}, a list of token ids or a string")

    def _engine_params(self, sp: Any, room: int) -> SamplingParams:
        min_tokens = getattr(sp, "min_tokens", 0) or 0
        if min_tokens > 1:
            raise RewardError(f"agent {self.source}: sampling_params.min_tokens={min_tokens} is not supported "
                              "(the engine cannot hold back its stop tokens); set it to 0 or 1")
        top_k = getattr(sp, "top_k", -1)
        return SamplingParams(
            max_new_tokens=max(room, 1), temperature=float(getattr(sp, "temperature", 1.0)),
            top_p=float(getattr(sp, "top_p", 1.0)), top_k=-1 if top_k in (None, 0) else int(top_k),
            n=int(getattr(sp, "n", 1) or 1), stop_token_ids=tuple(getattr(sp, "stop_token_ids", None) or ()),
            repetition_penalty=float(getattr(sp, "repetition_penalty", None) or 1.0))

    async def _flush_when_idle(self) -> None:
        """Wait until the episodes that can run have all asked for a generation, then generate."""
        seen = -1
        while len(self._pending) != seen:
            seen = len(self._pending)
            await asyncio.sleep(0)
        batch, self._pending, self._flusher = self._pending, [], None
        groups: dict[SamplingParams, list[_Request]] = {}
        for r in batch:
            groups.setdefault(r.params, []).append(r)
        for params, reqs in groups.items():
            images = {"vision": [r.vision for r in reqs]} if any(r.vision is not None for r in reqs) else {}
            try:
                trajs = self.engine.generate([r.ids for r in reqs], params, seeds=[r.seed for r in reqs], **images)
            except Exception as exc:  # noqa: BLE001 - NaN weights and the like: the trainer reports them
                self.engine_error = exc
                for r in reqs:
                    r.future.set_exception(exc)
                continue
            for j, r in enumerate(reqs):
                r.future.set_result(trajs[j * params.n:(j + 1) * params.n])

    def _output(self, index: int, context: list[int], tokens: list[int], logprobs: list[float], finish: str,
                sp: Any, record: EpisodeRecord, images: tuple = ((), None)) -> CompletionOutput:
        skip = bool(getattr(sp, "skip_special_tokens", True))
        text = self.tokenizer.decode(tokens, skip_special_tokens=skip)
        stop_reason = None
        stops = getattr(sp, "stop", None) or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        hit = min(((text.find(s), s) for s in stops if s and s in text), default=None)
        if hit is not None:
            at, stop_reason = hit
            keep = _tokens_covering(self.tokenizer, tokens, at + len(stop_reason), skip)
            tokens, logprobs, finish = tokens[:keep], logprobs[:keep], FINISH_STOP
            text = text[: at + len(stop_reason)] if getattr(sp, "include_stop_str_in_output", False) else text[:at]
        elif finish == FINISH_STOP and tokens:
            stop_reason = tokens[-1]
        record.generations.append(Generation(list(context), list(tokens), list(logprobs), False, *images))
        wanted = getattr(sp, "logprobs", None) is not None
        return CompletionOutput(
            index=index, text=text, token_ids=list(tokens),
            cumulative_logprob=float(sum(logprobs)) if wanted else None,
            logprobs=[{t: Logprob(lp, rank=1)} for t, lp in zip(tokens, logprobs)] if wanted else None,
            finish_reason=finish, stop_reason=stop_reason)


def _tokens_covering(tokenizer, tokens: list[int], chars: int, skip: bool) -> int:
    """The fewest leading tokens whose decoded text holds `chars` characters (binary search)."""
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(tokens[:mid], skip_special_tokens=skip)) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Call:
    """An engine call that is both awaitable (`await g`) and async-iterable (`async for out in g`)."""

    def __init__(self, start):
        self._start = start

    def __await__(self):
        return self._start().__await__()

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        yield await self._start()


def vllm_params(params: SamplingParams, logprobs: int | None = 1) -> VLLMSamplingParams:
    """The sampling parameters handed to `execute` (one sample: OpenRLHF calls execute per sample),
    with OpenRLHF's defaults: special tokens kept in `text`, logprobs returned."""
    return VLLMSamplingParams(
        n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        max_tokens=params.max_new_tokens, min_tokens=1, stop_token_ids=list(params.stop_token_ids) or None,
        skip_special_tokens=False, logprobs=logprobs, repetition_penalty=params.repetition_penalty)


def merge_vllm_params(current: Any, new: Any, source: str) -> Any:
    """A step()'s `sampling_params`: None/falsy keeps `current`; a dict updates a copy of it; an
    object with vLLM's fields replaces it."""
    if not new:
        return current
    if isinstance(new, dict):
        names = {f.name for f in dataclasses.fields(VLLMSamplingParams)}
        unknown = set(new) - names
        if unknown:
            raise RewardError(f"agent {source}: sampling_params has unknown fields {sorted(unknown)}; "
                              f"valid: {sorted(names)}")
        merged = copy.copy(current)
        for k, v in new.items():
            setattr(merged, k, v)
        return merged
    if not hasattr(new, "max_tokens"):
        raise RewardError(f"agent {source}: sampling_params must be None, a dict or a SamplingParams, "
                          f"got {type(new).__name__}")
    return new
