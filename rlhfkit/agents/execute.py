"""OpenRLHF's mid-2025 agent-file contract: `class AgentExecutor(AgentExecutorBase)` and its `execute`.

    from rlhfkit.agents import AgentExecutorBase, AgentInstanceBase

    class AgentExecutor(AgentExecutorBase):
        def __init__(self, max_steps, max_length, llm_engine, hf_tokenizer, result_queue):
            super().__init__(AgentInstance, max_steps, max_length, llm_engine, hf_tokenizer, result_queue)

        async def execute(self, prompt, label, sampling_params):   # optional override
            ...
            await self.result_queue.put({
                "observation_tokens": ids,          # prompt + actions + feedback, as token ids
                "action_ranges": [(start, end)],    # where the engine's outputs sit in ids
                "reward": 1.0, "scores": 1.0, "extra_logs": {"name": value},
                "prompt": prompt, "label": label, "rollout_log_probs": [...]})  # (read, not needed)

What rlhfkit passes, as OpenRLHF did: `execute` is called once per sample (prompt x n), all of
a rollout batch's calls concurrently on one event loop; `prompt` is the prompt text (chat
template applied), `sampling_params` a fresh `VLLMSamplingParams` (vLLM's field names; max_tokens
= --rollout.max_new_tokens, logprobs=1, skip_special_tokens=False). `llm_engine` is an
`EngineAdapter` (see engine_adapter.py: vLLM's `generate`, token ids in and out, logprobs),
`hf_tokenizer` the policy's tokenizer, `result_queue` a `ResultQueue` (`await put(result)`).
`max_steps` is --agent.max_turns; `max_length`, read inside `execute`, is that sample's prompt
length + the response budget (--agent.max_response_tokens), so `max_length - len(tokens)` is the
room left. `self.agent_instance_cls.remote()` makes an AgentInstance whose methods are awaited as
`await instance.step.remote(states)` (in this process: no Ray actor). `self.semaphore` bounds
concurrent episodes.

A result becomes a `Trajectory`: prompt_ids = observation_tokens before the first action range,
response_ids = the rest (cut at the response budget, then finish_reason "length"); loss_mask True
on action-range tokens, whose logprobs are the engine's own from its record of this sample's
calls (a range must hold tokens the engine generated right after exactly the tokens before it:
token-in, token-out, else a RewardError); every other token (feedback) is masked out with
logprob 0. `reward` is the episode reward, `scores` (default: reward) what dynamic filtering
sees, `extra_logs` are logged; `truncated: True` (optional) marks it cut short. Exactly one
result per `execute` call: put on the queue, or returned as a dict.

OpenRLHF's 2026 `AgentExecutorBase` is the same class built with no arguments: a subclass whose own
`execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)` returns the result
(as OpenRLHF's server-executor example, which serves an OpenAI-compatible API from its own thread
over `llm_engine.generate`) runs after its import lines name rlhfkit instead of openrlhf and vllm.

With a vision-language policy (`processor` set, as api.vision.attach_processor does), the 2026
form's `execute` gets what OpenRLHF gives it: `hf_tokenizer` stands for the processor
(`ProcessorTokenizer`) and `images` are the prompt's (opened); `llm_engine.generate` takes
`multi_modal_data={"image": [...]}` (engine_adapter.py). The trajectory's images are those of the
engine call of its last kept action (`_kept_images`). The mid-2025 form takes no images.

Departures from OpenRLHF: instances are plain objects (drop `ray.kill(instance)` from copied
code); engine calls are batched across episodes through a synchronous engine; each sample's
calls are seeded from its own seed, so its tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlhfkit.agents.base import AgentInstanceBase, gather_or_cancel, new_instance, to_float
from rlhfkit.agents.engine_adapter import EngineAdapter, EpisodeRecord, Generation, vllm_params
from rlhfkit.agents.episode import agent_episode
from rlhfkit.agents.executor import Prompt, TokenBudget, episode_seeds
from rlhfkit.agents.images import ImageEncoder
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.errors import RewardError, first_line
from rlhfkit.rollout.base import GenerationEngine, SamplingParams

MAX_CONCURRENT_EPISODES = 128  # OpenRLHF's default bound on concurrent agent tasks per engine


class AgentExecutorBase:
    """Base class of a mid-2025 OpenRLHF `AgentExecutor` (see the module docstring)."""

    def __init__(self, agent_instance_cls: type | None = None, max_steps: int | None = None,
                 max_length: int | None = None, llm_engine: Any = None, hf_tokenizer: Any = None,
                 result_queue: Any = None):
        if agent_instance_cls is None and max_steps is None:  # OpenRLHF 2026: no arguments, execute() does it all
            self.agent_instance_cls, self.max_steps, self.max_length = None, None, None
            self.llm_engine, self.hf_tokenizer, self.result_queue = llm_engine, hf_tokenizer, result_queue
            self.semaphore = asyncio.Semaphore(MAX_CONCURRENT_EPISODES)
            return
        if not (inspect.isclass(agent_instance_cls) and issubclass(agent_instance_cls, AgentInstanceBase)):
            raise RewardError(f"AgentExecutorBase.__init__ takes an AgentInstanceBase subclass first, got "
                              f"{agent_instance_cls!r:.60}; call super().__init__(AgentInstance, max_steps, "
                              "max_length, llm_engine, hf_tokenizer, result_queue)")
        self.agent_instance_cls = LocalActorClass(agent_instance_cls)
        self.max_steps = max_steps
        self.max_length = max_length
        self.llm_engine = llm_engine
        self.hf_tokenizer = hf_tokenizer
        self.result_queue = result_queue
        self.semaphore = asyncio.Semaphore(MAX_CONCURRENT_EPISODES)

    @property
    def max_length(self) -> int:
        """Inside `execute`: this sample's prompt tokens + the response budget."""
        adapter = getattr(self, "llm_engine", None)
        record = adapter.episode.get(None) if isinstance(adapter, EngineAdapter) else None
        return self._max_length if record is None else record.max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max_length = value

    @property
    def source(self) -> str:
        return getattr(self.llm_engine, "source", type(self).__qualname__)

    async def generate(self, prompt_ids: list[int], sampling_params: Any, multi_modal_data: Any = None):
        """One engine call on token ids (and images, as vLLM takes them); the final RequestOutput."""
        final = None
        images = {} if multi_modal_data is None else {"multi_modal_data": multi_modal_data}
        async for out in self.llm_engine.generate({"prompt_token_ids": prompt_ids}, sampling_params, **images):
            final = out
        return final

    async def execute(self, prompt: str, label: Any, sampling_params: Any) -> None:
        """One episode of `AgentInstance` (episode.py: reset, then up to `max_steps` of generate ->
        step, each action's tokens followed by the feedback's); puts the result on `result_queue`."""
        async with self.semaphore:
            result = await agent_episode(self.agent_instance_cls.cls, prompt, label, sampling_params, self.max_steps,
                                         self.max_length, self.hf_tokenizer, self.generate, self.source)
            await self.result_queue.put(result)


class ProcessorTokenizer:
    """A vision-language policy's processor as the `hf_tokenizer` OpenRLHF hands an `execute` (its
    AutoProcessor, which agent files detect by `image_processor`): a call with `images`, the chat
    template and the processor's own attributes are the processor's; a call without images and every
    other attribute (encode, decode, eos_token_id, ...) the tokenizer's, so text code runs as before."""

    def __init__(self, processor: Any):
        self.processor, self.tokenizer = processor, processor.tokenizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.processor if kwargs.get("images") is not None else self.tokenizer)(*args, **kwargs)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.processor.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("processor", "tokenizer"):
            raise AttributeError(name)
        try:
            return getattr(self.processor, name)
        except AttributeError:
            return getattr(self.tokenizer, name)


class ResultQueue:
    """`result_queue`: what an `execute` call puts here is that sample's result."""

    def __init__(self, adapter: EngineAdapter):
        self._adapter = adapter

    async def put(self, item: Any) -> None:
        self.put_nowait(item)

    def put_nowait(self, item: Any) -> None:
        self._adapter.current("result_queue.put").results.append(item)


class LocalActorClass:
    """Stands in for `ray.remote(AgentInstance)`: `.remote()` makes an instance in this process
    whose methods are called as `await instance.method.remote(...)`; calling it makes a plain one."""

    def __init__(self, cls: type):
        self.cls = cls

    def remote(self, *args: Any, **kwargs: Any) -> LocalActor:
        return LocalActor(self.cls, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls(*args, **kwargs)


class LocalActor:
    def __init__(self, cls: type, args: tuple, kwargs: dict):
        self._cls, self._args, self._kwargs = cls, args, kwargs
        self._made: asyncio.Future | None = None

    async def _instance(self) -> Any:
        if self._made is None:  # made once, on the first method call (its __init__ may be async)
            self._made = asyncio.ensure_future(new_instance(self._cls, *self._args, **self._kwargs))
        return await self._made

    def __getattr__(self, name: str) -> _RemoteMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _RemoteMethod(self, name)


class _RemoteMethod:
    def __init__(self, actor: LocalActor, name: str):
        self._actor, self._name = actor, name

    def remote(self, *args: Any, **kwargs: Any):
        return self._call(args, kwargs)

    async def _call(self, args: tuple, kwargs: dict) -> Any:
        out = getattr(await self._actor._instance(), self._name)(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out


class ExecuteRunner:
    """Runs a file's `AgentExecutor` whose `execute` rlhfkit calls, as an rlhfkit executor.

    Args:
      executor_cls: an `AgentExecutorBase` subclass (mid-2025 contract), built on the first batch
        as `executor_cls(max_steps, max_length, llm_engine, hf_tokenizer, result_queue)`.
      source: the agent file, for error messages.
      instance: instead, an executor already built with no arguments whose `execute(prompt, label,
        sampling_params, max_length, hf_tokenizer, llm_engine)` returns the result (OpenRLHF's 2026
        signature); `max_length` is then passed as this sample's prompt + response budget.
    """

    provides_rewards = True

    def __init__(self, executor_cls: type, source: str, instance: Any = None):
        self.executor_cls, self.source, self.instance = executor_cls, source, instance
        self.executor: Any = None
        self.adapter: EngineAdapter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.processor = None  # a vision-language policy's: execute gets it as hf_tokenizer, with the prompt's images
        self.max_images: int | None = None  # most images one engine call may carry (None: any)

    def run(self, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt], params: SamplingParams,
            budget: TokenBudget | None = None, generator: torch.Generator | None = None,
            seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """len(prompts) * params.n trajectories, sample s of prompt i at i*n + s (group_id i).

        Sample s of prompt i draws its engine calls' seeds from `episode_seeds(seeds[i], n, 1)[s][0]`
        (without `seeds`, one per prompt is drawn from `generator`). The episodes run on an event
        loop this runner keeps across batches (so what the executor holds stays usable): call it
        from synchronous code.
        """
        budget = budget or TokenBudget(params.max_new_tokens, params.max_new_tokens, 1)
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator).tolist()
        executor = self.instance if self.instance is not None else self._executor(tokenizer, budget, prompts)
        if self.adapter is None or self.adapter.tokenizer is not tokenizer:
            self.adapter = EngineAdapter(tokenizer, budget.per_turn, self.source)
        self.adapter.engine, self.adapter.per_turn, self.adapter.engine_error = engine, budget.per_turn, None
        self.adapter.images = None if self.processor is None else ImageEncoder(self.processor, self.source,
                                                                               self.max_images)
        records, jobs = [], []
        for i, p in enumerate(prompts):
            for (seed,) in episode_seeds(seeds[i], params.n, 1):
                records.append(EpisodeRecord(i, seed, len(p.ids) + budget.total, budget.max_turns))
                jobs.append(p)
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            weakref.finalize(self, self._loop.close)
        self.adapter.home = self._loop
        self.adapter.foreign = EpisodeRecord(-1, records[0].seed, max(r.max_length for r in records), budget.max_turns)
        results = self._loop.run_until_complete(self._episodes(executor, jobs, records, params))
        shared, placeholders = self.adapter.foreign.generations, self.adapter.placeholders()
        return [result_to_trajectory(r, rec, budget.total, engine.version, self.source, shared, placeholders)
                for r, rec in zip(results, records)]

    def _executor(self, tokenizer, budget: TokenBudget, prompts: Sequence[Prompt]) -> Any:
        if self.executor is not None and self.adapter.tokenizer is tokenizer:
            return self.executor
        self.adapter = EngineAdapter(tokenizer, budget.per_turn, self.source)
        kwargs = {"max_steps": budget.max_turns, "max_length": max(len(p.ids) for p in prompts) + budget.total,
                  "llm_engine": self.adapter, "hf_tokenizer": tokenizer, "result_queue": ResultQueue(self.adapter)}
        try:
            self.executor = self.executor_cls(**kwargs)
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(f"agent file {self.source}: AgentExecutor(max_steps, max_length, llm_engine, "
                              f"hf_tokenizer, result_queue) raised {type(exc).__name__}: {first_line(exc)}") from exc
        return self.executor

    async def _episodes(self, executor, prompts: list[Prompt], records: list[EpisodeRecord],
                        params: SamplingParams) -> list[Mapping]:
        try:
            return await gather_or_cancel(self._one(executor, p, rec, vllm_params(params))
                                          for p, rec in zip(prompts, records))
        except BaseException:
            self.adapter.cancel_pending()
            raise

    async def _one(self, executor, prompt: Prompt, record: EpisodeRecord, sampling_params) -> Mapping:
        self.adapter.episode.set(record)  # this task's context: engine calls and puts are this sample's
        images = getattr(prompt, "images", None)
        try:
            if self.instance is None:
                returned = await executor.execute(prompt.text, prompt.label, sampling_params)
            else:  # OpenRLHF 2026: a VLM's processor as hf_tokenizer, the prompt's images (as it passes them)
                hf_tokenizer = self.adapter.tokenizer if self.processor is None else ProcessorTokenizer(self.processor)
                returned = await executor.execute(prompt.text, prompt.label, sampling_params, record.max_length,
                                                  hf_tokenizer, self.adapter, **({"images": list(images)} if images
                                                                                 else {}))
        except RewardError:
            raise
        except Exception as exc:  # the user's code: any exception, in one line
            if exc is self.adapter.engine_error:
                raise
            raise RewardError(f"agent {self.source}: execute() raised {type(exc).__name__}: {first_line(exc)}; "
                              "fix the agent file (--debug shows the traceback)") from exc
        if len(record.results) > 1:
            raise RewardError(f"agent {self.source}: execute() put {len(record.results)} results on result_queue "
                              "for one call; put exactly one")
        result = record.results[0] if record.results else returned
        if not isinstance(result, Mapping):
            raise RewardError(f"agent {self.source}: execute() put no result on result_queue and returned "
                              f"{type(result).__name__}; put (or return) one dict with observation_tokens, "
                              "action_ranges and reward")
        return result


def result_to_trajectory(result: Mapping, record: EpisodeRecord, total: int, version: int,
                         source: str, shared: Sequence[Generation] = (),
                         placeholders: Sequence[int] = ()) -> Trajectory:
    """The Trajectory of one `execute` result (see the module docstring); `total` = response budget;
    `placeholders`: the engine's image token ids (a vision-language policy's)."""
    missing = [k for k in ("observation_tokens", "action_ranges", "reward") if k not in result]
    if missing:
        raise RewardError(f"agent {source}: the execute() result lacks {missing} (keys: {sorted(result)})")
    obs = _token_list(result["observation_tokens"], source)
    ranges = _action_ranges(result["action_ranges"], len(obs), source)
    start = ranges[0][0]
    mask, logprobs = [False] * (len(obs) - start), [0.0] * (len(obs) - start)
    gens = [_generation([*record.generations, *shared], obs, s, e, source) for s, e in ranges]
    for (s, e), g in zip(ranges, gens):
        mask[s - start:e - start] = [True] * (e - s)
        logprobs[s - start:e - start] = g.logprobs[:e - s]
    cut = len(mask) > total
    end, vision = _kept_images(obs, start + total, ranges, gens, placeholders, source)
    origin = "execute() result has"
    reward = to_float(result["reward"], source, "reward", origin)
    score = result.get("scores")
    logs = result.get("extra_logs") or {}
    info = {"agent_reward": reward,
            "agent_score": reward if score is None else to_float(score, source, "scores", origin),
            "extra_logs": {str(k): to_float(v, source, f"extra_logs[{k!r}]", origin) for k, v in logs.items()},
            "turns": len(ranges)}
    if vision is not None:
        info["vision"] = vision  # the trainer's forward takes the images from here
    return Trajectory(
        prompt_ids=torch.tensor(obs[:start], dtype=torch.long),
        response_ids=torch.tensor(obs[start:end], dtype=torch.long),
        loss_mask=torch.tensor(mask[:end - start], dtype=torch.bool),
        logprobs=torch.tensor(logprobs[:end - start], dtype=torch.float32),
        finish_reason=FINISH_LENGTH if cut or result.get("truncated") else FINISH_STOP,
        version=version,
        group_id=record.group_id,
        info=info,
    )


def _kept_images(obs: list[int], end: int, ranges: list[tuple[int, int]], gens: list[Generation],
                 placeholders: Sequence[int], source: str) -> tuple[int, Any]:
    """(where the trajectory's tokens end, the images of its trainer's forward): the images of the
    engine call of its last action kept under `end` (each earlier call's images come first in it, else
    RewardError). Feedback after that action holding image tokens no call saw is left out (it is
    masked and follows every trained token, so nothing trained changes)."""
    end = min(end, len(obs))
    used = [(r, g) for r, g in zip(ranges, gens) if r[0] < end]
    (_, last_end), last = used[-1]
    for (s, _), g in used:
        if g.image_keys != last.image_keys[:len(g.image_keys)]:
            raise RewardError(f"agent {source}: the action at token {s} was generated with other images than the "
                              "last action; a trajectory's calls must show its images in order, adding new ones "
                              "at the end")
    banned = set(placeholders)
    if banned and any(t in banned for t in obs[last_end:end]):
        end = last_end
    return end, last.vision


def _token_list(value: Any, source: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if not (isinstance(value, Sequence) and all(isinstance(t, int) for t in value)):
        raise RewardError(f"agent {source}: observation_tokens must be a list of token ids, got "
                          f"{type(value).__name__}")
    return list(value)


def _action_ranges(value: Any, length: int, source: str) -> list[tuple[int, int]]:
    """The non-empty (start, end) ranges, checked: inside the tokens, in order, not overlapping."""
    ranges, last = [], 0
    for item in value:
        s, e = (int(x) for x in item)
        if not (last <= s <= e <= length):
            raise RewardError(f"agent {source}: action_ranges {list(value)} are not in order inside the "
                              f"{length} observation_tokens; give (start, end) pairs, end exclusive")
        if e > s:
            ranges.append((s, e))
        last = e
    if not ranges:
        raise RewardError(f"agent {source}: the execute() result has no action tokens (action_ranges "
                          f"{list(value)}); an episode needs at least one generated token")
    return ranges


def _generation(generations: Sequence[Generation], obs: list[int], s: int, e: int, source: str) -> Generation:
    """The engine call that generated obs[s:e] (after obs[:s]): one of this sample's, or of the batch's
    calls from other threads; its logprobs are the tokens' rollout logprobs."""
    for g in generations:
        if not g.used and g.tokens[:e - s] == obs[s:e] and len(g.tokens) >= e - s and g.context == obs[:s]:
            g.used = True
            return g
    raise RewardError(f"agent {source}: action range ({s}, {e}) holds tokens the engine did not generate right "
                      f"after observation_tokens[:{s}] in this execute() call; put the engine's token_ids (never "
                      "re-tokenized text) after exactly the tokens they were generated from")

