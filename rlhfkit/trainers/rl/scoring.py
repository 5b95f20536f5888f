"""The score stage: trajectories -> rewards (reward function or agent), DAPO overlong shaping,
ProRL's stop-properly penalty, running normalisation; and DAPO dynamic filtering of whole groups.

`BatchFill` keeps the score -> filter rounds of one rollout batch: with dynamic filtering, new
prompts replace dropped groups until the batch holds `want` groups (Yu et al. 2025,
arXiv:2503.14476, "dynamic sampling"); the loop generates and scores each round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlhfkit.agents.executor import agent_rewards, drift_count, episode_rows
from rlhfkit.core.filtering import keep_groups_in_range
from rlhfkit.core.shaping import overlong_penalty, stop_properly_penalty
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rewards.reward_model import ProcessRewardFn, prompt_images, step_token_rewards
from rlhfkit.trainers.rl.stream import PromptBatch


class RunningMoments:
    """Running mean and std of rewards (Welford/Chan merge), for --reward.normalize."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, x: torch.Tensor) -> None:
        n = x.numel()
        if n == 0:
            return
        mean, var = float(x.mean()), float(x.var(unbiased=False))
        delta, total = mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.m2 += var * n + delta**2 * self.count * n / total
        self.count = total

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = state["count"], state["mean"], state["m2"]

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 0 else 1.0


@dataclass
class Scored:
    """What the score stage gives the experience stage, for B trajectories.

    rewards         FloatTensor [B]     scalar reward after shaping and normalisation
    scores          FloatTensor [B]     what dynamic filtering and accuracy look at (before shaping)
    token_rewards   FloatTensor [B, R] or None   per-token rewards at response positions (process
                                        rewards); None: scalar rewards only
    metrics         dict                reward, reward_extra/<name>, overlong_penalty, stop_properly_penalised
    """

    rewards: torch.Tensor
    scores: torch.Tensor
    token_rewards: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class Scorer:
    """Rewards of trajectories: `reward_fn` (None: the agent's episodes carry their rewards),
    `overlong` = (buffer_len, penalty_factor) of DAPO's overlong shaping against `max_len`
    response tokens (None: off), `stop_coef`: ProRL's stop-properly penalty of the trajectories that
    did not stop (`Trajectory.truncated`: cut at the token budget; a multi-turn episode that ran out of
    tokens or turns before its environment said done), applied after the overlong penalty as OpenRLHF
    does (None: off), `normalize`: by the running mean and std of all rewards so far.
    With `step_rewards` on (the advantage estimator takes per-token rewards), a
    `rewards.reward_model.ProcessRewardFn` gives per-step token rewards (and scalar rewards 0), and so does
    a reward function whose output holds per-step scores with their ends in the policy's response tokens (a
    process reward model over HTTP, rewards/remote.py). With it off (a group baseline; `train rs` and
    `train iterative-dpo`, which rank samples) each sample gets one reward: the in-process PRM's weakest
    step, the server's aggregate (its --reward.prm_aggregate).
    `env_weight` (with a `reward_fn`): the rewards and scores are the function's plus `env_weight`
    times the episodes' own (an environment's; logged as reward_extra/env_reward)."""

    def __init__(self, reward_fn: Callable | None, tokenizer, max_len: int,
                 overlong: tuple[int, float] | None = None, normalize: bool = False,
                 env_weight: float | None = None, stop_coef: float | None = None, step_rewards: bool = False):
        self.step_rewards = step_rewards
        self.reward_fn, self.tokenizer, self.max_len, self.env_weight = reward_fn, tokenizer, max_len, env_weight
        self.overlong, self.normalize, self.stop_coef = overlong, normalize, stop_coef
        self.moments = RunningMoments()
        if isinstance(reward_fn, ProcessRewardFn):
            reward_fn.check_vocabulary(tokenizer)

    def __call__(self, prompts: list[PromptItem], trajs: list[Trajectory]) -> Scored:
        """`prompts[t.group_id]` is the prompt of trajectory t."""
        lengths = torch.tensor([t.response_length for t in trajs], dtype=torch.float32)
        token_rewards = None
        if isinstance(self.reward_fn, ProcessRewardFn):  # per-step rewards on the step ends, scalar 0; or the weakest
            token_rewards, out = self.reward_fn.score_trajectories(trajs)
            if not self.step_rewards:
                token_rewards, out = None, RewardOutput(out.scores.clone(), out.scores, out.extra_logs)
        else:
            out = agent_rewards(trajs) if self.reward_fn is None else self.score_episodes(prompts, trajs, lengths)
            if out.steps is not None and self.step_rewards:  # a PRM's steps, over HTTP: on the tokens where they end
                token_rewards, out = self.placed_steps(out, trajs)
        rewards, scores = out.rewards.float().clone(), out.scores.float()
        per_episode = _per_episode(trajs)  # the metrics count an episode in segments once
        # nanmean: a function of a list that returned None for a sample logs NaN there (TRL's "not applicable")
        metrics = {f"reward_extra/{k}": float(per_episode(v).float().nanmean()) for k, v in out.extra_logs.items()}
        if self.env_weight is not None and self.reward_fn is not None:  # the environment's rewards, weighted
            env = agent_rewards(trajs)
            rewards, scores = rewards + self.env_weight * env.rewards, scores + self.env_weight * env.scores
            metrics["reward_extra/env_reward"] = float(per_episode(env.rewards).mean())
        metrics["reward"] = float(per_episode(rewards).mean())
        if self.overlong is not None:
            penalty = overlong_penalty(lengths, self.max_len, *self.overlong)
            rewards = rewards + penalty
            metrics["overlong_penalty"] = float(penalty.mean())
        if self.stop_coef is not None:
            truncated = torch.tensor([t.truncated for t in trajs], dtype=torch.bool)
            rewards = stop_properly_penalty(rewards, truncated, self.stop_coef)
            metrics["stop_properly_penalised"] = float(truncated.sum())  # samples penalised (of this round)
        if self.normalize:
            self.moments.update(rewards)
            rewards = (rewards - self.moments.mean) / (self.moments.std + 1e-8)
        return Scored(rewards, scores, token_rewards, metrics)

    def placed_steps(self, out: RewardOutput, trajs: list[Trajectory]) -> tuple[torch.Tensor, RewardOutput]:
        """(token rewards [B, R]: each step's score on its last token in the response, R = the longest
        response; `out` with scalar rewards 0), as the in-process process reward model hands them."""
        if out.step_ends is None:
            raise RewardError("the reward server answered per-step rewards (a process reward model) without their "
                              "`step_ends`, so they cannot be placed on the policy's tokens")
        width = max((len(t.response_ids) for t in trajs), default=0)
        token = step_token_rewards(out.steps, out.step_ends, width)
        return token, RewardOutput(torch.zeros(len(trajs)), out.scores, out.extra_logs)

    def score_episodes(self, prompts: list[PromptItem], trajs: list[Trajectory], lengths: torch.Tensor):
        """The reward function's output for every row, an episode of several segments scored once, on
        its last segment (which holds its final turn; `completion_messages` the whole conversation),
        and its output given to each of its segments."""
        rows = episode_rows(trajs)
        if rows is None:
            return self.call_reward_fn(prompts, trajs, lengths)
        last, inverse = rows
        out = self.call_reward_fn(prompts, [trajs[i] for i in last], lengths[last])
        if out.steps is not None and self.step_rewards:
            raise RewardError("the reward server answered per-step rewards (a process reward model) for episodes "
                              "cut into segments, whose steps it cannot place on each segment's tokens; score them "
                              "with the process reward model in-process (--reward.model_name_or_path)")
        return out.select(inverse)

    def call_reward_fn(self, prompts: list[PromptItem], trajs: list[Trajectory], lengths: torch.Tensor):
        """queries as OpenRLHF builds them (prompt + response with special tokens); `responses` is the
        generated text alone, without special tokens; the dataset's raw prompts and rows ride along, and
        the prompts' opened images (`prompt_images`) where a prompt has any."""
        ids = [t.response_ids.tolist() for t in trajs]
        raw = self.tokenizer.batch_decode(ids, skip_special_tokens=False)
        responses = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        mine = [prompts[t.group_id] for t in trajs]
        texts = [p.text for p in mine]
        conversations = [t.info.get("completion_messages") for t in trajs]  # tool-calling episodes
        extra = {"completion_messages": conversations} if any(c is not None for c in conversations) else {}
        extra.update(prompt_images(mine))
        if self.step_rewards:  # a process reward model over HTTP reads the policy's tokens
            extra["prompt_ids"] = [t.prompt_ids.tolist() for t in trajs]
        return self.reward_fn(
            [p + r for p, r in zip(texts, raw)], texts, [p.label for p in mine], responses=responses,
            response_lengths=lengths, group_ids=torch.tensor([t.group_id for t in trajs]), completion_ids=ids,
            raw_prompts=[p.text if p.raw is None else p.raw for p in mine], records=[p.record for p in mine],
            **extra,
        )

    def state_dict(self) -> dict:
        return self.moments.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.moments.load_state_dict(state)


@dataclass(frozen=True)
class GroupFilter:
    """DAPO dynamic filtering: keep a group when low < its mean score < high (off: keep all)."""

    enabled: bool = False
    score_range: tuple[float, float] = (0.0, 1.0)
    max_rounds: int = 1

    def __call__(self, trajs: list[Trajectory], scored: Scored) -> tuple[list[Trajectory], Scored, int]:
        """(kept trajectories, their part of `scored`, number of groups dropped)."""
        if not self.enabled:
            return trajs, scored, 0
        keep, dropped = keep_groups_in_range(torch.tensor([t.group_id for t in trajs]), scored.scores,
                                             *self.score_range)
        idx = keep.nonzero().flatten()
        kept = Scored(scored.rewards[keep], scored.scores[keep],
                      None if scored.token_rewards is None else scored.token_rewards[keep], scored.metrics)
        return [trajs[i] for i in idx.tolist()], kept, dropped


@dataclass
class Collected:
    """One rollout batch after generate -> score -> filter: the prompts of every round
    (`prompts[t.group_id]` is trajectory t's), the kept trajectories and their scores."""

    prompts: list[PromptItem]
    trajs: list[Trajectory]
    scored: Scored
    generated_tokens: int


class BatchFill:
    """The rounds of one rollout batch, as the loop scores them: each round's trajectories go through
    `group_filter`; with dynamic filtering, new prompts replace dropped groups until the batch holds
    `want` groups (accepted groups are never discarded: when the prompts or the rounds run out, the
    batch trains as filled). Generation and scoring are the loop's (trainers.rl.loop.RLLoop.train_step);
    this keeps the count, renumbers each round's groups after the earlier rounds' prompts and merges."""

    def __init__(self, group_filter: GroupFilter, tokenizer, want: int):
        self.group_filter, self.tokenizer, self.want = group_filter, tokenizer, want
        self.prompts: list[PromptItem] = []
        self.kept: list[Trajectory] = []
        self.parts: list[Scored] = []
        self.all_scores: list[torch.Tensor] = []
        self.metrics: dict[str, float] = {}
        self.dropped, self.tokens, self.drift, self.rounds = 0, 0, 0, 0

    def add(self, batch: PromptBatch, trajs: list[Trajectory], scored: Scored) -> int:
        """Filter one round; returns how many prompts the next round should draw (0: the batch is done;
        never prompts a round will not use: they would be lost)."""
        self.rounds += 1
        if self.rounds == 1:
            self.metrics = dict(scored.metrics)  # the reward metrics are the first round's
        self.tokens += sum(t.response_length for t in trajs)
        self.drift += drift_count(trajs, self.tokenizer)
        self.all_scores.append(scored.scores)
        trajs, scored, dropped = self.group_filter(trajs, scored)
        self.dropped += dropped
        for t in trajs:
            t.group_id += len(self.prompts)
        self.prompts += batch.prompts
        self.kept += trajs
        self.parts.append(scored)
        need = self.want - len({t.group_id for t in self.kept})
        if not self.group_filter.enabled or need <= 0 or self.rounds >= self.group_filter.max_rounds:
            return 0
        return need

    def collected(self) -> Collected:
        scores = torch.cat(self.all_scores)
        metrics = dict(self.metrics)
        metrics.update(filtered_groups=float(self.dropped), dynamic_rounds=float(self.rounds),
                       score=float(scores.mean()), drift_frac=self.drift / max(scores.numel(), 1))
        merged = Scored(torch.cat([p.rewards for p in self.parts]), torch.cat([p.scores for p in self.parts]),
                        _cat_token_rewards(self.parts), metrics)
        return Collected(self.prompts, self.kept, merged, self.tokens)


def _cat_token_rewards(parts: list[Scored]) -> torch.Tensor | None:
    """The rounds' [b_i, R_i] token rewards as one [B, max R_i] (zeros for a round without any)."""
    if all(p.token_rewards is None for p in parts):
        return None
    width = max(p.token_rewards.shape[1] for p in parts if p.token_rewards is not None)
    rows = [torch.zeros(p.rewards.numel(), width) if p.token_rewards is None
            else torch.nn.functional.pad(p.token_rewards.float(), (0, width - p.token_rewards.shape[1]))
            for p in parts]
    return torch.cat(rows)


def _per_episode(trajs: list[Trajectory]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Per-row values -> one value per episode (its last segment's; every segment carries the episode's
    reward), or the rows themselves when no episode was split."""
    rows = episode_rows(trajs)
    if rows is None:
        return lambda v: v
    last = torch.tensor(rows[0], dtype=torch.long)
    return lambda v: v[last]
