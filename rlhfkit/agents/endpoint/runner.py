"""Agent functions as rlhfkit executors: any program written against the OpenAI API rolls out the policy.

    async def agent(client, prompt, label, **row) -> float | dict:
        reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])
        return float(reply.choices[0].message.content.strip() == label)

`client` is an `openai.AsyncOpenAI` already pointed at the episode's own base URL with its own
key; `prompt` is the dataset's prompt (a string, or the messages list), `label` its label, `row`
the row's other columns. The function returns the episode's reward (a number, or a dict with
"reward" and optionally "scores" and "extra_logs"), or None to leave the reward to the run's
reward function, which then scores the episode's last reply (`completion_messages` holds the
recorded conversation). What trains is what the endpoint recorded (segments.py), never text.

An episode is dropped from the batch, counted (`agent/dropped_*`) and logged in one line, and the
run goes on, when its function raises, runs past `timeout` seconds (it is cancelled; the time its
calls wait on the engine, queued or generating, does not count), returns
something that is not a reward, or never calls the endpoint. `group_id` of every segment is its
prompt's; `info["episode"]` tells the group baseline which segments are one episode.

With a vision-language policy (`processor` set, as `attach_processor` does), the agent's chat
messages may hold image_url parts with data: URLs (vision.py); each segment's trajectory carries
its images in `info["vision"]`. An episode may send at most `max_images` distinct images
(--data.max_images_per_prompt) and requests of at most VISION_REQUEST_BYTES.

The endpoint starts for each rollout batch and stops when its episodes are done (nothing is left
listening between batches); its episodes run concurrently on one event loop, at most
`max_concurrent` at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.agents.base import gather_or_cancel, to_float
from rlhfkit.agents.endpoint.episodes import VISION_REQUEST_BYTES, EndpointLimits, Episode
from rlhfkit.agents.endpoint.handlers import Settings
from rlhfkit.agents.endpoint.segments import stitch
from rlhfkit.agents.endpoint.server import EndpointServer
from rlhfkit.agents.executor import Prompt, TokenBudget, episode_seeds
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import RewardError, one_line
from rlhfkit.rollout.base import GenerationEngine, SamplingParams

log = logging.getLogger("rlhfkit")
RESERVED = ("client", "prompt", "label")


class _RanPastTimeout(Exception):
    """The episode ran past --agent.timeout (the runner's own clock; a TimeoutError the agent raises is its error)."""


class _EndedCancelled(Exception):
    """The agent's own code ended cancelled (it awaited a task that was cancelled); its CancelledError would
    otherwise cancel the whole batch."""


@dataclass
class Outcome:
    """One finished episode: its reward (None: the reward function's), scores, logs, or why it was dropped."""

    reward: float | None = None
    score: float | None = None
    extra_logs: dict | None = None
    dropped: str | None = None
    error: BaseException | None = None  # what the agent raised, when it did


def make_client(base_url: str, key: str, timeout: float):
    try:
        import openai  # noqa: PLC0415 - the agents extra
    except ImportError as exc:
        raise RewardError("agent functions get an openai.AsyncOpenAI client: pip install 'rlhfkit[agents]'") from exc
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)


class EndpointExecutor:
    """Runs `agent_fn` once per sample against the endpoint (see the module docstring).

    Args:
      agent_fn: `async def agent(client, prompt, label, **row)`.
      source: where it came from, for messages.
      timeout: seconds one episode may run (--agent.timeout).
      max_calls: most endpoint calls of one episode (--agent.max_calls).
      fallback_reward_fn: scores episodes whose function returns None (None: such an episode is dropped).
      tool_parser: how tool calls are read from replies to requests with `tools` (None: detected).
      honor_sampling: requests' own temperature / top_p / top_k win over the run's.
      max_context: most tokens of a call's prompt + its new tokens.
      make_client: `(base_url, key, timeout) -> client` (default: openai.AsyncOpenAI).
    """

    provides_rewards = True

    def __init__(self, agent_fn: Callable, source: str = "agent function", timeout: float = 300.0,
                 max_calls: int = 64, fallback_reward_fn: Callable | None = None, tool_parser: str | None = None,
                 honor_sampling: bool = False, max_concurrent: int = 128, max_context: int = 4096,
                 make_client: Callable = make_client):
        if not inspect.iscoroutinefunction(agent_fn):
            raise RewardError(f"{source}: the agent must be `async def agent(client, prompt, label, **row)`, got "
                              f"{agent_fn!r:.60}")
        self.agent_fn, self.source, self.timeout, self.max_calls = agent_fn, source, timeout, max_calls
        self.fallback_reward_fn, self.tool_parser = fallback_reward_fn, tool_parser
        self.honor_sampling = honor_sampling
        self.max_concurrent, self.max_context, self.make_client = max_concurrent, max_context, make_client
        self.metrics: dict[str, float] = {}
        self.processor = None  # a vision-language policy's processor: requests may then send images
        self.max_images: int | None = None  # most distinct images an episode may send (None: any)
        self.last_server: EndpointServer | None = None  # the server of the last batch (closed), for tests
        self.first_drop: tuple[str, BaseException | None] | None = None  # the last batch's first drop: why, what raised

    def pop_metrics(self) -> dict[str, float]:
        out, self.metrics = self.metrics, {}
        return out

    def run(self, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt], params: SamplingParams,
            budget: TokenBudget | None = None, generator: torch.Generator | None = None,
            seeds: Sequence[int] | None = None, allow_all_dropped: bool = False) -> list[Trajectory]:
        """The trajectories of len(prompts) * params.n episodes (fewer when some were dropped, more
        when some split into segments), episode s of prompt i seeded by episode_seeds(seeds[i], n, 1)[s][0].
        RewardError when every episode was dropped (nothing would train; evaluations `allow_all_dropped`)."""
        trajs = self._run(engine, tokenizer, prompts, params, budget, generator, seeds)
        if not trajs and self.first_drop is not None and not allow_all_dropped:
            raise RewardError(f"agent {self.source}: all {len(prompts) * params.n} episodes of the rollout batch "
                              f"were dropped, so nothing would train; the first: {self.first_drop[0]}. Fix the agent "
                              "(--debug shows where it raised)") from self.first_drop[1]
        return trajs

    def _run(self, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt], params: SamplingParams,
             budget: TokenBudget | None, generator: torch.Generator | None,
             seeds: Sequence[int] | None) -> list[Trajectory]:
        budget = budget or TokenBudget(params.max_new_tokens, params.max_new_tokens, 1)
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator).tolist()
        body = VISION_REQUEST_BYTES if self.processor is not None else EndpointLimits.max_request_bytes
        limits = EndpointLimits(per_call=budget.per_turn, total=budget.total, max_calls=self.max_calls,
                                max_request_bytes=body, context=self.max_context)
        settings = Settings(params, self.honor_sampling, self.tool_parser,
                            getattr(tokenizer, "name_or_path", None) or "policy", self.processor, self.max_images)
        with EndpointServer(tokenizer, settings) as server:
            server.engine = engine
            self.last_server = server
            jobs = [(i, p, seed) for i, p in enumerate(prompts) for (seed,) in episode_seeds(seeds[i], params.n, 1)]
            episodes = [server.open_episode(i, seed, limits) for i, p, seed in jobs]
            outcomes = asyncio.run(self._all(server, [p for _, p, _ in jobs], episodes))
            if server.engine_error is not None:
                raise server.engine_error
            return self._trajectories(server, [p for _, p, _ in jobs], episodes, outcomes, engine.version, tokenizer)

    async def _all(self, server: EndpointServer, prompts: list[Prompt], episodes: list[Episode]) -> list[Outcome]:
        gate = asyncio.Semaphore(self.max_concurrent)
        return await gather_or_cancel(self._one(server, p, e, gate) for p, e in zip(prompts, episodes))

    async def _one(self, server: EndpointServer, prompt: Prompt, e: Episode, gate: asyncio.Semaphore) -> Outcome:
        async with gate:
            client = self.make_client(server.url(e), e.key, None)  # the episode's own clock below bounds it
            raw = getattr(prompt, "raw", None)
            row = {k: v for k, v in (getattr(prompt, "record", None) or {}).items() if k not in RESERVED}
            try:
                returned = await self._within_timeout(
                    server, e, self.agent_fn(client, prompt.text if raw is None else raw, prompt.label, **row))
                return self._outcome(returned)
            except _RanPastTimeout:
                return Outcome(dropped=f"timeout: ran past --agent.timeout {self.timeout:g} s (not counting "
                                       "its waits on the engine)")
            except RewardError as exc:
                return Outcome(dropped=f"bad_reward: {one_line(exc)}")
            except _EndedCancelled:
                return Outcome(dropped="error: raised asyncio.CancelledError (its own code awaited a task that was "
                                       "cancelled)")
            except Exception as exc:  # noqa: BLE001 - the user's agent: any exception drops its episode
                text = one_line(exc)
                text = text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"
                return Outcome(dropped=f"error: raised {text}", error=exc)
            finally:
                server.close_episode(e.id)
                close = getattr(client, "close", None)
                if close is not None:
                    await close()

    async def _within_timeout(self, server: EndpointServer, e: Episode, run: Awaitable) -> Any:
        """`run`'s result, or _RanPastTimeout (run cancelled) once it has run `self.timeout`
        seconds besides the time its calls waited on the engine: a busy or slow engine (other
        episodes' turns, a long generation) never drops an episode; an agent that hangs does. An agent
        that ends cancelled (not by us) raises _EndedCancelled."""
        task = asyncio.ensure_future(run)
        start = time.monotonic()
        try:
            while True:
                left = self.timeout - (time.monotonic() - start - server.registry.engine_seconds(e))
                if left <= 0:
                    raise _RanPastTimeout
                done, _ = await asyncio.wait({task}, timeout=left)
                if done and task.cancelled():  # not by us: we were not cancelled, and cancel only below
                    raise _EndedCancelled
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def _outcome(self, returned: Any) -> Outcome:
        if returned is None:
            return Outcome()
        if isinstance(returned, Mapping):
            if "reward" not in returned:
                raise RewardError(f"agent {self.source} returned a dict without 'reward' (keys: {sorted(returned)})")
            reward = to_float(returned["reward"], self.source, "reward", "the agent returned")
            score = returned.get("scores", returned.get("score"))
            logs = {str(k): to_float(v, self.source, f"extra_logs[{k!r}]", "the agent returned")
                    for k, v in (returned.get("extra_logs") or {}).items()}
            return Outcome(reward, None if score is None else to_float(score, self.source, "scores",
                                                                       "the agent returned"), logs)
        return Outcome(to_float(returned, self.source, "reward", "the agent returned"))

    def _trajectories(self, server: EndpointServer, prompts: list[Prompt], episodes: list[Episode],
                      outcomes: list[Outcome], version: int, tokenizer) -> list[Trajectory]:
        self._score_missing(prompts, episodes, outcomes, tokenizer)
        counts: dict[str, float] = {"agent/episodes": float(len(episodes))}
        out: list[Trajectory] = []
        self.first_drop = None
        for index, (e, o) in enumerate(zip(episodes, outcomes)):
            if o.dropped is None and not e.calls:
                o.dropped = "no_calls: the agent never called the endpoint"
            if o.dropped is not None:
                kind = o.dropped.split(":")[0]
                counts[f"agent/dropped_{kind}"] = counts.get(f"agent/dropped_{kind}", 0.0) + 1
                where = f"episode {index} (prompt {e.group_id} of the batch, {_short(prompts[index])!r})"
                log.warning("agent %s: %s dropped: %s", self.source, where, o.dropped)
                self.first_drop = self.first_drop or (f"{where}: {o.dropped}", o.error)
                continue
            info = {"agent_reward": o.reward, "agent_score": o.reward if o.score is None else o.score,
                    "extra_logs": dict(o.extra_logs or {}), "turns": len(e.calls), "episode": e.id}
            stitched = stitch(e.calls, e.group_id, version, info)
            counts["endpoint/splits"] = counts.get("endpoint/splits", 0.0) + stitched.splits
            out += stitched.trajectories
        for e in episodes:
            server.registry.forget(e.id)
        counts.update(server.registry.pop_metrics())
        for k, v in counts.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v
        return out

    def _score_missing(self, prompts: list[Prompt], episodes: list[Episode], outcomes: list[Outcome],
                       tokenizer) -> None:
        """Episodes whose function returned None: the reward function scores their last call (queries:
        its prompt + reply as text, prompts: its prompt as text, as OpenRLHF builds them; dropped when
        there is no reward function)."""
        todo = [i for i, o in enumerate(outcomes) if o.dropped is None and o.reward is None and episodes[i].calls]
        if not todo:
            return
        if self.fallback_reward_fn is None:
            for i in todo:
                outcomes[i].dropped = ("no_reward: the agent returned None and the run has no reward function "
                                       "(--reward.remote_url)")
            return
        last = [episodes[i].calls[-1] for i in todo]
        texts = [tokenizer.decode(c.prompt_ids, skip_special_tokens=False) for c in last]
        queries = [t + tokenizer.decode(c.sampled_ids, skip_special_tokens=False) for t, c in zip(texts, last)]
        out = self.fallback_reward_fn(queries, texts, [prompts[i].label for i in todo],
                                      responses=[tokenizer.decode(c.sampled_ids, skip_special_tokens=True)
                                                 for c in last],
                                      records=[getattr(prompts[i], "record", {}) for i in todo])
        for j, i in enumerate(todo):
            outcomes[i].reward = float(out.rewards[j])
            outcomes[i].score = float(out.scores[j])
            outcomes[i].extra_logs = {k: float(v[j]) for k, v in out.extra_logs.items()}


def _short(prompt: Prompt) -> str:
    """The start of a prompt's text (its last message's, for a messages list), to name its row in a log line."""
    raw = getattr(prompt, "raw", None)
    if isinstance(raw, list) and raw and isinstance(raw[-1], Mapping):
        raw = raw[-1].get("content")
    text = raw if isinstance(raw, str) else prompt.text
    return text if len(text) <= 40 else text[:40] + "..."


def evaluate_agent(executor: EndpointExecutor, engine: GenerationEngine, tokenizer, prompts: Sequence[Prompt],
                   params: SamplingParams, budget: TokenBudget, seed: int = 0) -> tuple[dict[str, float], list[dict]]:
    """The agent's held-out reward: `params.n` episodes per prompt, a dropped episode counting 0.

    Returns ({"eval/reward": mean reward, "eval/dropped": share dropped, "eval/NAME": the mean of each
    extra_logs value the agent returned (a dropped episode, or one without it, counting 0)}, one row per
    finished episode: prompt (its text or messages), label, reward, the agent's extra_logs, and the recorded
    reply text of its first segment)."""
    seeds = torch.randint(0, 2**62, (len(prompts),), generator=torch.Generator().manual_seed(seed)).tolist()
    trajs = executor.run(engine, tokenizer, prompts, params, budget, seeds=seeds, allow_all_dropped=True)
    first: dict[str, Trajectory] = {}
    for t in trajs:
        first.setdefault(t.info["episode"], t)
    total = max(len(prompts) * params.n, 1)
    metrics = {"eval/reward": sum(float(t.info["agent_reward"]) for t in first.values()) / total,
               "eval/dropped": (len(prompts) * params.n - len(first)) / total}
    for name in sorted({k for t in first.values() for k in t.info["extra_logs"]} - {"reward", "dropped"}):
        metrics[f"eval/{name}"] = sum(t.info["extra_logs"].get(name, 0.0) for t in first.values()) / total
    rows = []
    for t in first.values():  # episode order: prompt-major
        p = prompts[t.group_id]
        rows.append({"prompt": p.text if getattr(p, "raw", None) is None else p.raw, "label": p.label,
                     "reward": float(t.info["agent_reward"]), "extra_logs": dict(t.info["extra_logs"]),
                     "response": tokenizer.decode(t.response_ids.tolist(), skip_special_tokens=False)})
    executor.pop_metrics()
    return metrics, rows
