"""`ToolExecutor`: multi-turn episodes of native tool calling, token-in token-out.

Each episode starts from the prompt's messages (a message list, or a string made a user turn)
rendered with the tool schemas (`ToolTemplate`). Each turn, the unfinished episodes generate
together in one engine call; every action is parsed for tool calls. A turn with none (and no
malformed one) is the final answer: the episode is done. Otherwise the calls run in parallel
(`ToolRunner`, with its limits), their results are rendered as `role: "tool"` messages and
only the tokens the template puts after the turn are appended (loss_mask False, logprob 0);
the next turn samples after them (an engine that keeps an episode's KV cache across turns, the HF
engine, prefills only those new tokens). Every turn the conversation, rendered afresh from its
messages, is checked against the episode's tokens (`ToolTemplate.prefix_check`) and the
mismatches are counted (`tools/rerender`, `tools/retokenized`). What a re-render does is
`on_rerender`:

- "keep": the episode keeps the tokens it sampled (what the policy saw): one trajectory;
- "segment": the episode's tokens so far (up to its last sampled token) become a finished
  segment, and the next turn samples from the freshly rendered conversation, whose tokens are
  the prompt of a new segment (as an inference server would serve the next turn). Each
  segment trains only the tokens sampled in it. All segments carry the episode's info (its
  reward, its whole conversation) and `info["episode"]`, as the OpenAI-compatible endpoint's
  segments do: the group baseline counts the episode once, a reward function scores it once
  (on its last segment) and an evaluation counts it as one sample. `tools/segments` counts the
  segments beyond each episode's first. A "retokenized" turn keeps its tokens in both modes:
  its text is the one rendered, only its tokenization differs.

With an `environment_factory` (TRL's contract, environment.py) each episode gets its own
instance, whose methods are tools; one with `get_reward` gives the episode's reward. With a
text environment (`rlhfkit.agents.textenv`: gymnasium-style classes, GEM, TextArena, SkyRL-Gym) each
episode gets its own too: its first observation joins the prompt (a list of messages from `reset` is
the prompt), and every turn without a tool call is its action; the observation `step` returns comes
back as a user turn, or as its messages when it is a list (rendered by the chat template, only the
new tokens appended), its rewards are summed and `done` ends the episode. Each text environment is closed
when its episode ends, and every one made so far when the rollout stops early (an error, a cancellation: a
close() that raises then is logged, the error that stopped the rollout goes on).
Otherwise rewards come from the trainer's reward function (`provides_rewards` False): it sees the
whole episode (actions, calls and results) as the response; each trajectory's
`info["messages"]` holds the conversation (assistant turns with their parsed `tool_calls`,
the tool results) and `info["completion_messages"]` its part after the prompt, which reward
functions of TRL's contract get as their `completions`.

With `overlap` each episode runs on its own and a `TurnBatcher` (overlap.py) batches the turns
that are waiting: a slow tool call no longer holds the other episodes' generation back (the
samples are the same: every turn is sampled with its own seed). `tools/busy_s`, `tools/overlap_s`
and `tools/generate_during_tools` measure the overlap reached.

Images (a vision-language policy, `processor` set): a prompt with images is rendered with the
tools by the processor's chat template (its image parts as the model's placeholders) and encoded
by the processor with the prompt's images, so its image tokens are the processor's; the episode
keeps the prompt's image tensors, which every turn's engine call gets with the episode's context
(in both schedules) and its trajectories (every segment: each one's prompt holds the prompt's
images) keep in `info["vision"]` for the trainer's forward. Tool results and observations are
text: their tokens are appended as for a text policy (image placeholder tokens dropped from them:
no image would fill them), and the turn check encodes through the processor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.agents.base import EnvErrors, gather_or_cancel
from rlhfkit.agents.executor import Prompt, TokenBudget, episode_seeds, episode_trajectory
from rlhfkit.agents.textenv import TextEnvFactory, close_quietly
from rlhfkit.agents.tools.environment import (
    environment_reward,
    environment_tools,
    reset_environment,
    with_observation,
)
from rlhfkit.agents.tools.overlap import OverlapClock, QuietStdout, TurnBatcher
from rlhfkit.agents.tools.render import PROMPT_OK, RERENDER, ToolTemplate
from rlhfkit.agents.tools.run import ToolLimits, ToolRunner, ToolStats
from rlhfkit.agents.tools.schema import ToolSet
from rlhfkit.core.moe import merge_recorded
from rlhfkit.data.images import encode, image_messages
from rlhfkit.data.types import FINISH_STOP, Trajectory
from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rollout.base import GenerationEngine, SamplingParams, end_episodes, image_kwargs, turn_kwargs

ON_RERENDER = ("keep", "segment")


@dataclass
class _Segment:
    """A finished segment of an episode (what `episode_trajectory` reads)."""

    prompt_ids: list[int]
    response: list[int]
    mask: list[bool]
    logprobs: list[float]
    versions: list[int]
    group_id: int
    truncated: bool = False
    experts: torch.Tensor | None = None


@dataclass
class _Episode:
    group_id: int
    messages: list[dict]  # as rendered (assistant turns as the text the model wrote)
    conversation: list[dict]  # for rewards and logs (assistant turns with parsed tool_calls)
    prompt_ids: list[int]
    prompt_messages: int  # how many of `conversation` are the prompt's
    seeds: list[int] | None = None
    response: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    experts: torch.Tensor | None = None  # the engine's recorded experts of prompt + response (routing replay)
    turns: int = 0
    calls: int = 0
    done: bool = False
    truncated: bool = False
    env: Any = None  # the episode's environment (environment_factory), None without one
    text_env: Any = None  # the episode's text environment (a TextEnv), None without one
    reward: float = 0.0  # its get_reward(), or the sum of its text environment's rewards
    segments: list[_Segment] = field(default_factory=list)  # finished before the current one (on_rerender)
    spent: int = 0  # response tokens of the finished segments (the budget is the episode's)
    vision: Any = None  # the prompt's image tensors (VisionInputs), None without images
    images: list | None = None  # the prompt's opened images (the turn check encodes with them)

    @property
    def finished(self) -> bool:
        return self.done or self.truncated


def prompt_messages(prompt: Prompt) -> list[dict]:
    """The prompt as messages: its raw message list, else its text as one user turn; a prompt with
    images gets one `{"type": "image"}` part per image (`data.images.image_messages`)."""
    raw = getattr(prompt, "raw", None)
    vision = getattr(prompt, "vision", None)
    if vision is not None:
        return image_messages(prompt.text if raw is None else raw, vision.num_images, "tool-calling prompt")
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(m, dict) for m in raw):
        return [dict(m) for m in raw]
    return [{"role": "user", "content": raw if isinstance(raw, str) else prompt.text}]


class ToolExecutor:
    """Runs tool-calling episodes of `tools` (a ToolSet or a list of functions).

    Args:
      tools: the episode's tools.
      limits: calls per episode, seconds per call, tokens per result.
      parser: the tool-call parser (`TOOL_PARSERS` name or response template); None: detected.
      on_rerender: "keep" or "segment": what a re-rendered history does (see the module docstring).
      overlap: run each episode on its own, its turns batched with the others' waiting (TurnBatcher),
        so tool latency overlaps the generation of other episodes; False: turn by turn.
      template_kwargs: extra chat-template variables (e.g. enable_thinking=False).
    """

    multi_turn = True

    def __init__(self, tools: ToolSet | Sequence = (), limits: ToolLimits | None = None,
                 parser: str | dict | None = None, environment_factory: Callable[[], Any] | None = None,
                 on_rerender: str = "keep", overlap: bool = False, **template_kwargs: Any):
        if on_rerender not in ON_RERENDER:
            raise ConfigError(f"--agent.on_rerender: unknown value {on_rerender!r}; valid: {', '.join(ON_RERENDER)}")
        self.on_rerender = on_rerender
        self.episodes = 0  # episodes run so far: their info["episode"] ids in segment mode
        self.plain = dict(tools.functions) if isinstance(tools, ToolSet) else {f.__name__: f for f in tools}
        # a text environment (textenv.py) steps on the model's turns; TRL's contract offers methods as tools
        self.text_env = environment_factory if isinstance(environment_factory, TextEnvFactory) else None
        self.factory = None if self.text_env is not None else environment_factory
        # the schemas (the same for every episode): plain tools and a first environment's methods
        env_tools = environment_tools(self.factory()) if self.factory is not None else {}
        self.tools = ToolSet({**self.plain, **env_tools})
        if not self.tools and self.text_env is None:
            raise ConfigError("tool-calling episodes need tools (functions), an environment_factory or a text "
                              "environment")
        self.limits, self.parser, self.template_kwargs = limits or ToolLimits(), parser, template_kwargs
        self.overlap = overlap
        self.stats, self.clock = ToolStats(), OverlapClock()
        self.checks = {"rerender": 0, "retokenized": 0, "segments": 0, "turns": 0, "valid_calls": 0, "invalid_calls": 0}
        self._template: ToolTemplate | None = None
        self.processor = None  # a vision-language policy's processor: it renders and encodes prompts with images
        self._placeholders: set[int] = set()  # the engine's image placeholder ids (dropped from text deltas)
        # episodes whose text environment's step() raised: reward 0, counted
        self.env_errors = EnvErrors(self.text_env.name if self.text_env is not None else "tools")

    @property
    def provides_rewards(self) -> bool:
        """A text environment, or an environment with `get_reward`, gives the episodes' rewards; else
        the reward function."""
        return self.text_env is not None or (self.factory is not None
                                             and callable(getattr(self.factory, "get_reward", None)))

    def template(self, tokenizer) -> ToolTemplate:
        """The tools' ToolTemplate over `tokenizer` (rendered by the processor when one is set)."""
        renderer = self.processor if self.processor is not None else tokenizer
        t = self._template
        if t is None or t.tokenizer is not tokenizer or t.renderer is not renderer:
            self._template = ToolTemplate(tokenizer, self.tools.schemas, self.parser, renderer=self.processor,
                                          **self.template_kwargs)
        return self._template

    def pop_metrics(self) -> dict[str, float]:
        """Tool and template counters since the last call."""
        c = self.checks
        calls = c["valid_calls"] + c["invalid_calls"]
        out = {**self.stats.metrics(), **self.clock.metrics(), "tools/calls": float(calls),
               "tools/rerender": float(c["rerender"]), "tools/retokenized": float(c["retokenized"]),
               "tools/segments": float(c["segments"]),
               "tools/valid_call_rate": c["valid_calls"] / calls if calls else 0.0, **self.env_errors.pop_metrics()}
        self.stats, self.clock = ToolStats(), OverlapClock()
        self.checks = dict.fromkeys(c, 0)
        return out

    def run(self, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt], params: SamplingParams,
            budget: TokenBudget | None = None, generator: torch.Generator | None = None,
            seeds: Sequence[int] | None = None) -> list[Trajectory]:
        """Episodes for each prompt x params.n samples, in the SingleTurnExecutor's order (the
        seeds as in MultiTurnExecutor.run). Runs its own event loop: call it from synchronous code."""
        budget = budget or TokenBudget(params.max_new_tokens, params.max_new_tokens * 4, 4)
        banned = getattr(engine, "banned_ids", None)  # a VisionEngine's image placeholders
        self._placeholders = set() if banned is None else set(banned.tolist())
        return asyncio.run(self._run(engine, tokenizer, prompts, params, budget, generator, seeds))

    async def _run(self, engine, tokenizer, prompts, params, budget, generator, seeds) -> list[Trajectory]:
        tt = self.template(tokenizer)
        runner = ToolRunner(self.tools, self.limits, tokenizer, self.stats)
        turn_params = dataclasses.replace(params, n=1)
        self.env_errors.start()
        made: dict[int, Any] = {}  # text environments made and not closed yet: closed however the rollout ends
        try:
            episodes = await self._start(tt, prompts, params, budget, seeds, made)
            try:
                if self.overlap:  # the kept caches are freed once all are done (generate runs in a thread)
                    batcher, quiet = TurnBatcher(engine, self.clock, generator), QuietStdout()
                    await gather_or_cancel(self._episode(e, batcher, quiet, tt, runner, turn_params, budget)
                                           for e in episodes)
                for _ in range(0 if self.overlap else budget.max_turns):
                    active = [e for e in episodes if not e.finished]
                    if not active:
                        break
                    await self._turn(active, engine, tt, runner, turn_params, budget, generator)
                    end_episodes(engine, [id(e) for e in active if e.finished])
            finally:  # nothing an engine kept for these episodes outlives the rollout
                end_episodes(engine, [id(e) for e in episodes])
            await self._finish(episodes, made)
        except BaseException:  # an environment, the engine or a cancellation stopped the rollout
            await close_quietly(made.values())
            raise
        self.env_errors.check(len(episodes))
        return [t for e in episodes for t in self._trajectories(e, engine.version)]

    async def _start(self, tt: ToolTemplate, prompts, params, budget, seeds, made: dict[int, Any]) -> list[_Episode]:
        """Each prompt's params.n episodes, their environments made and reset; each text environment is
        put in `made` before its reset, so one whose reset raises is closed too."""
        episodes, rendered = [], {}  # rendered: (prompt, text) -> ids, the same for a prompt's samples
        for i, p in enumerate(prompts):
            per = None if seeds is None else episode_seeds(seeds[i], params.n, budget.max_turns)
            for s in range(params.n):
                msgs, env, text_env = prompt_messages(p), None, None
                if self.factory is not None:
                    env = self.factory()
                    msgs = with_observation(msgs, await reset_environment(env, getattr(p, "record", None)))
                if self.text_env is not None:
                    text_env = self.text_env()
                    made[id(text_env)] = text_env
                    first = await text_env.reset(getattr(p, "record", None), msgs)
                    msgs = first if isinstance(first, list) else with_observation(msgs, first)
                text = tt.render(msgs)  # the same for a prompt's samples unless reset() differs
                if (i, text) not in rendered:
                    rendered[i, text] = self._prompt_ids(tt, text, p)
                episodes.append(_Episode(i, [dict(m) for m in msgs], [dict(m) for m in msgs], rendered[i, text],
                                         len(msgs), None if per is None else per[s], env=env, text_env=text_env,
                                         vision=getattr(p, "vision", None), images=getattr(p, "images", None)))
        return episodes

    async def _finish(self, episodes: list[_Episode], made: dict[int, Any]) -> None:
        """The episodes' ends: each text environment closed (taken out of `made` first: closed once), the
        environments' rewards read."""
        for e in episodes:
            e.truncated = e.truncated or not e.done
            if e.text_env is not None:  # its resources (a connection, a SkyRL environment's close) go
                made.pop(id(e.text_env), None)
                try:
                    await e.text_env.close()
                except RewardError as exc:  # as a step() that raises: this episode ends with reward 0
                    self.env_errors.end(e, exc)
            if e.env is not None and self.provides_rewards:
                e.reward = await environment_reward(e.env)

    def _prompt_ids(self, tt: ToolTemplate, text: str, prompt: Prompt) -> list[int]:
        """The token ids of a rendered prompt: the processor's with the prompt's images (each image's
        tokens expanded) for a prompt with images, else the tokenizer's."""
        if getattr(prompt, "vision", None) is None:
            return tt.encode(text)
        if self.processor is None or not getattr(prompt, "images", None):
            raise ConfigError("a tool-calling prompt with images needs the policy's processor and the prompt's "
                              "images (PromptItem.images, as data.images.tokenize_vision_prompts makes them)")
        return encode(self.processor, text, prompt.images)[0]

    async def _turn(self, active, engine, tt: ToolTemplate, runner: ToolRunner, params, budget, generator) -> None:
        """One turn of every episode in `active`: their actions in one engine call per sampling params,
        then all of their calls at once."""
        batches: dict[SamplingParams, list[_Episode]] = {}
        for e in active:
            batches.setdefault(_turn_params(e, params, budget), []).append(e)
        outs: dict[int, Trajectory] = {}
        for p, group in batches.items():
            ids = [e.prompt_ids + e.response for e in group]
            images = image_kwargs(group)  # a VisionEngine takes each episode's prompt images
            self.clock.enter("generate")
            turns = turn_kwargs(engine, [id(e) for e in group])  # the HF engine keeps their KV caches
            if group[0].seeds is not None:
                got = engine.generate(ids, p, seeds=[e.seeds[e.turns] for e in group], **images, **turns)
            else:
                got = engine.generate(ids, p, generator=generator, **images, **turns)
            self.clock.leave("generate")
            outs.update({id(e): t for e, t in zip(group, got)})
        parsed = [_take_action(e, outs[id(e)], tt) for e in active]
        # one capture of what the tools print around all of the turn's calls: the runners' own
        # captures interleave across episodes, and only the outermost restores sys.stdout for sure
        with contextlib.redirect_stdout(io.StringIO()):
            replies = await gather_or_cancel(self._timed_reply(e, calls, errors, runner, action, stopped)
                                             for e, action, stopped, _, calls, errors in parsed)
        for (e, action, stopped, content, calls, errors), tool_msgs in zip(parsed, replies):
            self._append(e, tt, action, stopped, content, calls, tool_msgs, budget)

    async def _episode(self, e: _Episode, batcher: TurnBatcher, quiet: QuietStdout, tt: ToolTemplate,
                       runner: ToolRunner, params, budget) -> None:
        """One episode on its own (overlap): each turn asks `batcher` for its action, then runs its calls."""
        for _ in range(budget.max_turns):
            if e.finished:
                return
            seed = None if e.seeds is None else e.seeds[e.turns]
            t = await batcher.generate(e.prompt_ids + e.response, _turn_params(e, params, budget), seed, e.vision,
                                       id(e))
            _, action, stopped, content, calls, errors = _take_action(e, t, tt)
            with quiet:
                tool_msgs = await batcher.tool(self._reply(e, calls, errors, runner, action, stopped))
            self._append(e, tt, action, stopped, content, calls, tool_msgs, budget)

    async def _timed_reply(self, e: _Episode, calls, errors, runner: ToolRunner, action, stopped) -> list[dict]:
        self.clock.enter("tool")
        try:
            return await self._reply(e, calls, errors, runner, action, stopped)
        finally:
            self.clock.leave("tool")

    async def _reply(self, e: _Episode, calls, errors, runner: ToolRunner, action, stopped) -> list[dict]:
        """The messages answering a turn: its tool results; for a turn without calls, the text
        environment's next observation as a user turn (none: the episode is done)."""
        self.checks["valid_calls"] += len(calls)
        self.checks["invalid_calls"] += len(errors)
        if not calls and not errors:
            if e.text_env is None:
                return []
            written = action[:-1] if stopped and action else action
            try:
                obs, reward, done = await e.text_env.step(runner.tokenizer.decode(written, skip_special_tokens=True))
            except RewardError as exc:  # this action broke the environment: the episode ends with reward 0
                self.env_errors.end(e, exc)
                return []
            e.reward += reward
            return [] if done else obs if isinstance(obs, list) else [{"role": "user", "content": obs}]
        if e.env is not None:  # this episode's environment: its bound methods
            tools = ToolSet({**self.plain, **environment_tools(e.env)})
            runner = ToolRunner(tools, runner.limits, runner.tokenizer, runner.stats, runner.slots)
        msgs = await runner.run(calls, errors, used=e.calls)
        e.calls = min(e.calls + len(calls), self.limits.calls_per_episode)  # the calls that ran
        return msgs

    def _append(self, e: _Episode, tt: ToolTemplate, action, stopped, content, calls, tool_msgs, budget) -> None:
        """Record the turn in the messages; append the tool results' tokens (or end the episode)."""
        written = action[:-1] if stopped and action else action
        e.messages.append({"role": "assistant", "content": tt.tokenizer.decode(written, skip_special_tokens=False)})
        turn = {"role": "assistant", "content": content}
        if calls:
            turn["tool_calls"] = [c.as_message_entry() for c in calls]
        e.conversation.append(turn)
        if not tool_msgs:
            e.done = True
            # a final answer cut at the token budget did not stop (a text environment's `done` ends it as it is)
            e.truncated = e.truncated or (not stopped and e.text_env is None)
            return
        e.messages += tool_msgs
        e.conversation += tool_msgs
        delta = [t for t in tt.delta(action, stopped, tool_msgs) if t not in self._placeholders]
        room = budget.total - e.spent - len(e.response)
        if len(delta) >= room:
            e.truncated = True
        delta = delta[:max(room, 0)]
        e.response += delta
        e.mask += [False] * len(delta)
        e.logprobs += [0.0] * len(delta)
        e.versions += e.versions[-1:] * len(delta)
        if not e.truncated:
            encoder = None if e.images is None else lambda text: encode(self.processor, text, e.images)[0]
            status, rendered = tt.rendered_check(e.messages, e.prompt_ids + e.response, encoder)
            self.checks["turns"] += 1
            if status != PROMPT_OK:
                self.checks[status] += 1
            if status == RERENDER and self.on_rerender == "segment":
                self._split(e, rendered, len(delta))

    def _split(self, e: _Episode, rendered: list[int], feedback: int) -> None:
        """Finish the episode's current segment at its last sampled token (the `feedback` tokens just
        appended are left out: the next segment's prompt holds them as rendered) and start the next
        one from `rendered`, the conversation's tokens as the template renders them now."""
        cut = len(e.response) - feedback
        experts = None if e.experts is None else e.experts[: len(e.prompt_ids) + cut]
        e.segments.append(_Segment(e.prompt_ids, e.response[:cut], e.mask[:cut], e.logprobs[:cut],
                                   e.versions[:cut], e.group_id, experts=experts))
        e.spent += len(e.response)
        e.prompt_ids, e.response, e.mask, e.logprobs, e.versions = list(rendered), [], [], [], []
        e.experts = None

    def _trajectories(self, e: _Episode, version: int) -> list[Trajectory]:
        """The episode's trajectory; in segment mode its segments, each with the episode's info and id."""
        info = {"turns": e.turns, "tool_calls": e.calls, "messages": e.conversation,
                "completion_messages": e.conversation[e.prompt_messages:], "prompt_messages": e.prompt_messages,
                "agent_reward": e.reward, "agent_score": e.reward, "extra_logs": {}}
        if e.vision is not None:
            info["vision"] = e.vision  # the trainer's forward takes the prompt's images from here
        if self.on_rerender == "keep":
            return [episode_trajectory(e, version, info)]
        self.episodes += 1
        info["episode"] = f"tools-{self.episodes}"
        # a split just before the turns ran out leaves an empty last segment: nothing to train
        parts = [*e.segments, e] if e.response or not e.segments else list(e.segments)
        for part in parts:  # the episode's truncation is every segment's (the stop-properly penalty's)
            part.truncated = e.truncated
        self.checks["segments"] += len(parts) - 1
        return [episode_trajectory(part, version, dict(info)) for part in parts]


def _turn_params(e: _Episode, params: SamplingParams, budget: TokenBudget) -> SamplingParams:
    """`params` with the new-token budget of `e`'s next action (what the turn and the episode allow)."""
    room = min(params.max_new_tokens, budget.per_turn, budget.total - e.spent - len(e.response))
    return dataclasses.replace(params, max_new_tokens=max(room, 1))


def _take_action(e: _Episode, t: Trajectory, tt: ToolTemplate) -> tuple:
    """Append the action `t` sampled to `e`: (e, action ids, stopped, content, calls, parse errors)."""
    action = t.response_ids.tolist()
    e.response += action
    e.mask += [True] * len(action)
    e.logprobs += t.logprobs.tolist()
    e.versions += [t.version] * len(action)
    if t.experts is not None:  # the turn's call covered the episode so far and its action
        e.experts = merge_recorded(e.experts, t.experts, t.experts.shape[0], t.experts.dtype)
    e.turns += 1
    return (e, action, t.finish_reason == FINISH_STOP, *tt.parse(action))
