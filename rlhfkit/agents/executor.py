"""Executors: drive a `GenerationEngine` through single-turn or multi-turn episodes, token-in token-out.

`SingleTurnExecutor` is one `engine.generate` call (today's RL rollout). `MultiTurnExecutor`
runs one `AgentInstance` per sample; each turn, the unfinished episodes are generated together
in one engine call on their own token context (prompt ids + every action and feedback token so
far), then their `step()` coroutines run concurrently. The episodes are named to an engine that
keeps an episode's KV cache across its turns (rollout.base.turn_kwargs; the HF engine), which then
prefills only each turn's new tokens; it frees them as episodes finish and when the rollout ends. The feedback text is
tokenized once and appended with loss_mask False (logprob 0); the trajectory is never re-tokenized from text.

Budgets: an action has at most `budget.per_turn` new tokens (and what the total allows); a
response (actions + feedback) has at most `budget.total` tokens; an episode has at most
`budget.max_turns` actions. An episode that runs out before its agent says done is flagged
truncated (finish_reason "length"); feedback that does not fit is cut at the budget.

Images (a vision-language policy, `processor` set): the prompt's images and those each `step()`
returns as `environment_images` (agents/images.py) are the episode's `vision`; every turn's
engine call gets them with the episode's context, and the trajectory keeps them in
`info["vision"]`, so the trainer's forward computes the logprobs over the same images. The
feedback's image tokens are masked from the loss like the rest of the feedback.

Departure from OpenRLHF's MultiTurnAgentExecutor: it generates each episode alone through an
async vLLM engine; here the episodes of a turn are batched into one call of a synchronous engine
(the HF engine on CPU gains a lot from batching). Sampling is seeded by the trainer's generator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rlhfkit.agents.base import EnvErrors, check_step_result, new_instance
from rlhfkit.agents.engine_adapter import EngineAdapter
from rlhfkit.agents.episode import agent_episode
from rlhfkit.agents.images import EpisodeImages, feedback_tokens, fit_feedback
from rlhfkit.core.moe import merge_recorded
from rlhfkit.data.types import FINISH_LENGTH, FINISH_STOP, Trajectory
from rlhfkit.errors import ConfigError, RewardError, first_line
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.base import GenerationEngine, SamplingParams, end_episodes, image_kwargs, turn_kwargs
from rlhfkit.rollout.vision import merge_vision

log = logging.getLogger("rlhfkit")


class Prompt(Protocol):
    """What an executor needs of a prompt: its text, its token ids and its label."""

    text: str
    ids: list[int]
    label: Any


@dataclass(frozen=True)
class TokenBudget:
    """Token budgets of one episode (see the module docstring)."""

    per_turn: int
    total: int
    max_turns: int = 1

    def __post_init__(self) -> None:
        if min(self.per_turn, self.total, self.max_turns) < 1:
            raise ConfigError(f"agent token budget needs per_turn, total and max_turns >= 1, got {self}")


class SingleTurnExecutor:
    """One generation per sample; rewards come from the trainer's reward function."""

    provides_rewards = False

    def run(self, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt], params: SamplingParams,
            budget: TokenBudget | None = None, generator: torch.Generator | None = None,
            seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """len(prompts) * params.n trajectories, sample s of prompt i at i*n + s (group_id i).
        `seeds`: one per prompt (see GenerationEngine.generate), else `generator` seeds the call."""
        kwargs = image_kwargs(prompts)  # a VisionEngine takes the prompts' images
        if seeds is not None:
            return engine.generate([p.ids for p in prompts], params, seeds=seeds, **kwargs)
        return engine.generate([p.ids for p in prompts], params, generator=generator, **kwargs)


@dataclass
class _Episode:
    group_id: int
    prompt_ids: list[int]
    label: Any
    instance: Any
    text: str  # observation text so far (what step() sees as observation_text)
    params: SamplingParams
    response: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version of each response token
    reward: float = 0.0
    score: float | None = None
    extra_logs: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    seeds: list[int] | None = None  # one sampling seed per turn (None: the call's generator)
    done: bool = False
    truncated: bool = False
    vision: Any = None  # the images of the episode so far (VisionInputs), None without images
    experts: torch.Tensor | None = None  # the engine's recorded experts of prompt + response so far (routing replay)

    @property
    def finished(self) -> bool:
        return self.done or self.truncated


class MultiTurnExecutor:
    """Runs `agent_instance_cls` episodes (OpenRLHF's `MultiTurnAgentExecutor` contract).

    A user's agent file subclasses it as `class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self): super().__init__(AgentInstance)`. Rewards come from `step()`.
    """

    provides_rewards = True

    def __init__(self, agent_instance_cls: type, source: str | None = None):
        self.agent_instance_cls = agent_instance_cls
        self.source = source or getattr(agent_instance_cls, "__qualname__", str(agent_instance_cls))
        self.processor = None  # a vision-language policy's processor: it encodes the environment_images
        self.max_images: int | None = None  # most images an episode may hold, the prompt's counted (None: any)
        self._warned_images = False
        self._placeholders: list[int] = []  # the engine's image placeholder ids (never in text feedback)
        self.env_errors = EnvErrors(self.source)  # episodes whose step() raised: reward 0, counted

    def pop_metrics(self) -> dict[str, float]:
        """`agent/env_errors` since the last call (when any)."""
        return self.env_errors.pop_metrics()

    def run(self, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt], params: SamplingParams,
            budget: TokenBudget | None = None, generator: torch.Generator | None = None,
            seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """Episodes for each prompt x params.n samples, in the SingleTurnExecutor's order.

        With `seeds` (one per prompt), episode s of prompt i samples turn k with seed
        `episode_seeds(seeds[i], n, max_turns)[s][k]`: its episodes do not depend on the other
        prompts of the call. Runs its own event loop (asyncio.run): call it from synchronous code.
        """
        budget = budget or TokenBudget(params.max_new_tokens, params.max_new_tokens, 1)
        banned = getattr(engine, "banned_ids", None)  # a VisionEngine's image placeholders
        self._placeholders = [] if banned is None else banned.tolist()
        return asyncio.run(self._run(engine, tokenizer, prompts, params, budget, generator, seeds))

    async def _run(self, engine, tokenizer, prompts, params, budget, generator, seeds) -> list[Trajectory]:
        turn_params = dataclasses.replace(params, n=1)
        self.env_errors.start()
        episodes = []
        for i, p in enumerate(prompts):
            per_episode = None if seeds is None else episode_seeds(seeds[i], params.n, budget.max_turns)
            for s in range(params.n):
                e = await self._reset(i, p, tokenizer, turn_params)
                e.seeds = None if per_episode is None else per_episode[s]
                episodes.append(e)
        try:
            for _ in range(budget.max_turns):
                active = [e for e in episodes if not e.finished]
                if not active:
                    break
                await self._turn(active, engine, tokenizer, budget, generator)
                end_episodes(engine, [id(e) for e in active if e.finished])
        finally:  # nothing an engine kept for these episodes outlives the rollout
            end_episodes(engine, [id(e) for e in episodes])
        for e in episodes:
            e.truncated = e.truncated or not e.done  # out of turns before the agent said done
        self.env_errors.check(len(episodes))
        return [self._trajectory(e, engine.version) for e in episodes]

    async def _reset(self, group_id: int, prompt: Prompt, tokenizer, params: SamplingParams) -> _Episode:
        instance = await self._guard("__init__", new_instance(self.agent_instance_cls))
        out = await self._guard("reset", instance.reset(
            {"observation": prompt.text, "prompt": prompt.text, "label": prompt.label}))
        text = out.get("observation", prompt.text) if isinstance(out, dict) else prompt.text
        if not isinstance(text, str):
            raise RewardError(f"agent {self.source}: reset() returned observation of type {type(text).__name__}")
        vision = getattr(prompt, "vision", None)
        if text != prompt.text and vision is not None:
            raise RewardError(f"agent {self.source}: reset() changed the observation of a prompt with images; "
                              "return it as it is (feedback may add text and images)")
        ids = list(prompt.ids) if text == prompt.text else tokenizer(text, add_special_tokens=False)["input_ids"]
        return _Episode(group_id, ids, prompt.label, instance, text, params, vision=vision)

    async def _turn(self, active: list[_Episode], engine, tokenizer, budget: TokenBudget, generator) -> None:
        """Generate one action for every active episode (batched by sampling params), then step all."""
        batches: dict[SamplingParams, list[_Episode]] = {}
        for e in active:
            room = min(e.params.max_new_tokens, budget.per_turn, budget.total - len(e.response))
            batches.setdefault(dataclasses.replace(e.params, max_new_tokens=room), []).append(e)
        actions: dict[int, Trajectory] = {}
        for p, group in batches.items():
            ids = [e.prompt_ids + e.response for e in group]
            images = image_kwargs(group)  # a VisionEngine takes each episode's images so far
            images.update(turn_kwargs(engine, [id(e) for e in group]))  # the HF engine keeps their KV caches
            if group[0].seeds is not None:  # turn k of an episode: its own seed
                outs = engine.generate(ids, p, seeds=[e.seeds[e.turns] for e in group], **images)
            else:
                outs = engine.generate(ids, p, generator=generator, **images)
            actions.update({id(e): t for e, t in zip(group, outs)})
        states = []
        for e in active:
            t = actions[id(e)]
            e.response += t.response_ids.tolist()
            e.mask += [True] * t.response_length
            e.logprobs += t.logprobs.tolist()
            e.versions += [t.version] * t.response_length
            if t.experts is not None:  # this turn's call covered the episode so far and its action
                e.experts = merge_recorded(e.experts, t.experts, t.experts.shape[0], t.experts.dtype)
            e.turns += 1
            action_text = tokenizer.decode(t.response_ids.tolist(), skip_special_tokens=True)
            states.append({"observation_text": e.text, "action_text": action_text, "label": e.label,
                           "sampling_params": e.params})
            e.text = e.text + action_text
        results = await asyncio.gather(*(self._guard("step", e.instance.step(s)) for e, s in zip(active, states)),
                                       return_exceptions=True)
        for e, raw in zip(active, results):
            try:
                if isinstance(raw, BaseException):
                    raise raw
                step = check_step_result(raw, self.source, e.params)
            except RewardError as exc:  # this action broke the environment: the episode ends with reward 0
                self.env_errors.end(e, exc)
                continue
            self._apply(e, step, tokenizer, budget)

    async def _guard(self, method: str, coro):
        """Await the agent's `method`; an exception in the environment becomes a RewardError naming it."""
        try:
            return await coro
        except RewardError:
            raise
        except Exception as exc:  # the user's environment: any exception, reported in one line
            first = first_line(exc)
            raise RewardError(f"agent {self.source}: {method}() raised {type(exc).__name__}: {first}; fix the "
                              "environment (--debug shows the traceback)") from exc

    def _apply(self, e: _Episode, r, tokenizer, budget: TokenBudget) -> None:
        e.reward += r.reward
        e.score = r.score
        e.extra_logs = r.extra_logs
        e.done = r.done
        e.params = r.sampling_params or e.params
        if r.feedback or r.images:
            fb, vision = feedback_tokens(self.processor, tokenizer, r.feedback, r.images, self._placeholders,
                                         self.source)
            room = budget.total - len(e.response)
            image_room = None if self.max_images is None else self.max_images - _images(e.vision)
            too_many = image_room is not None and _images(vision) > image_room
            if too_many and not self._warned_images:
                self._warned_images = True
                log.warning("agent %s: an episode's images would pass --data.max_images_per_prompt %d (the prompt's "
                            "counted): the feedback's images are dropped and the episode ends; raise the flag",
                            self.source, self.max_images)
            if not e.done and (len(fb) > room or too_many):
                e.truncated = True
            fb, vision = fit_feedback(fb, vision, room, self._placeholders, image_room)
            e.vision = merge_vision(e.vision, vision)
            e.response += fb
            e.mask += [False] * len(fb)
            e.logprobs += [0.0] * len(fb)
            e.versions += e.versions[-1:] * len(fb)
            e.text = e.text + r.feedback
        if not e.done and len(e.response) >= budget.total:
            e.truncated = True

    async def execute(self, prompt: str, label: Any, sampling_params: Any, max_length: int, hf_tokenizer,
                      llm_engine: Any, images: Any = None) -> dict:
        """OpenRLHF 2026's per-sample entry point, for a subclass whose own `execute` calls this one:
        one episode through `llm_engine.generate` (episode.py, at most --agent.max_turns actions);
        returns the result dict. Such a subclass runs through `ExecuteRunner` (see loader.py). With a
        vision-language policy `hf_tokenizer` holds its processor (execute.ProcessorTokenizer) and
        `images` are the prompt's: the episode's images go with every engine call."""
        adapter = llm_engine if isinstance(llm_engine, EngineAdapter) else None
        max_steps = adapter.current("execute").max_steps if adapter is not None else 2**31
        processor = getattr(hf_tokenizer, "processor", None)  # a VLM policy's
        side = None
        if processor is not None:
            most = adapter.images.max_images if adapter is not None and adapter.images is not None else None
            side = EpisodeImages(processor, adapter.placeholders() if adapter is not None else [], most)
        return await agent_episode(self.agent_instance_cls, prompt, label, sampling_params, max_steps, max_length,
                                   hf_tokenizer, llm_engine.generate, self.source, side, images)

    def _trajectory(self, e: _Episode, version: int) -> Trajectory:
        info = {"agent_reward": e.reward, "agent_score": e.reward if e.score is None else e.score,
                "extra_logs": dict(e.extra_logs), "turns": e.turns}
        if e.vision is not None:
            info["vision"] = e.vision  # the trainer's forward takes the episode's images from here
        return episode_trajectory(e, version, info)


def episode_seeds(seed: int, n: int, max_turns: int) -> list[list[int]]:
    """[n][max_turns] sampling seeds for the episodes of one prompt, drawn from `seed` alone."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, 2**62, (n, max_turns), generator=gen).tolist()


def agent_rewards(trajectories: Sequence[Trajectory]) -> RewardOutput:
    """The rewards [B], scores [B] and extra_logs {name: [B]} that agent episodes collected."""
    missing = [i for i, t in enumerate(trajectories) if "agent_reward" not in t.info]
    if missing:
        raise RewardError(f"trajectory {missing[0]} carries no agent reward; it did not come from an agent")
    names = sorted({k for t in trajectories for k in t.info["extra_logs"]})
    logs = {k: torch.tensor([t.info["extra_logs"].get(k, 0.0) for t in trajectories]) for k in names}
    logs["turns"] = torch.tensor([float(t.info["turns"]) for t in trajectories])
    return RewardOutput(
        rewards=torch.tensor([t.info["agent_reward"] for t in trajectories], dtype=torch.float32),
        scores=torch.tensor([t.info["agent_score"] for t in trajectories], dtype=torch.float32),
        extra_logs=logs,
    )


def episode_rows(trajectories: Sequence[Trajectory]) -> tuple[list[int], list[int]] | None:
    """Where some trajectories are segments of one episode (`info["episode"]`: the OpenAI-compatible
    endpoint's, tool episodes with --agent.on_rerender segment): (the row of each episode's last
    segment, in the order of the episodes' first rows; each row's episode, an index into the first
    list). Rows without an episode are their own. None when no row has one."""
    if not any("episode" in t.info for t in trajectories):
        return None
    last: list[int] = []
    inverse: list[int] = []
    seen: dict[object, int] = {}
    for i, t in enumerate(trajectories):
        key = ("episode", t.info["episode"]) if "episode" in t.info else ("row", i)
        if key not in seen:
            seen[key] = len(last)
            last.append(i)
        last[seen[key]] = i
        inverse.append(seen[key])
    return last, inverse


def drift_count(trajectories: Sequence[Trajectory], tokenizer) -> int:
    """How many conversations do not survive decode -> re-encode as the same token ids.

    Each would have trained on text it did not generate as tokens had the trainer re-tokenized
    text; rlhfkit never does (it trains on the ids), and this count shows how often it matters.
    """
    bad = 0
    for t in trajectories:
        ids = t.prompt_ids.tolist() + t.response_ids.tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False)
        bad += tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    return bad


def episode_trajectory(e: Any, version: int, info: dict) -> Trajectory:
    """A multi-turn episode's trajectory (`e`: prompt_ids, response, mask, logprobs, truncated, versions,
    group_id, and `experts` when the engine recorded them); `version` (the engine's) stamps it when it
    generated no token, else the oldest version among its turns (turns may straddle weight updates in
    async runs)."""
    experts = getattr(e, "experts", None)
    if experts is not None:  # the feedback after the last action was never run through the model: missing
        experts = merge_recorded(experts, None, len(e.prompt_ids) + len(e.response), experts.dtype)
    return Trajectory(
        prompt_ids=torch.tensor(e.prompt_ids, dtype=torch.long),
        response_ids=torch.tensor(e.response, dtype=torch.long),
        loss_mask=torch.tensor(e.mask, dtype=torch.bool),
        logprobs=torch.tensor(e.logprobs, dtype=torch.float32),
        finish_reason=FINISH_LENGTH if e.truncated else FINISH_STOP,
        version=min(e.versions, default=version),
        group_id=e.group_id,
        info=info,
        versions=torch.tensor(e.versions, dtype=torch.long),
        experts=experts,
    )


def _images(vision: Any) -> int:
    """How many images `vision` (VisionInputs or None) holds."""
    return 0 if vision is None else vision.num_images
