"""The step arithmetic of a whole run (OpenRLHF's PPO loop), before any model loads.

Seed 002 counts, for OpenRLHF's loop

    for episode in num_episodes:
        for rollout batch of rollout_batch_size prompts (x n_samples_per_prompt samples):
            max_epochs passes; an optimizer step every train_batch_size samples,

    num_update_steps_per_episode = len(prompts) * n_samples_per_prompt // train_batch_size * max_epochs
    num_rollouts_per_episode     = len(prompts) // rollout_batch_size
    max_steps                    = ceil(num_episodes * num_update_steps_per_episode)

How we depart from it: our trainer (rlhfkit.trainers.rl.loop) only runs whole rollout batches, so a
remainder of `len(prompts) % rollout_batch_size` prompts is left out of each episode (shuffled
anew every episode) and the optimizer steps per episode are
`rollouts_per_episode * optimizer_steps_per_rollout`, which equals the textbook count when the
rollout batch size divides the dataset. `--train.max_steps` caps the number of rollouts (RL steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.config.checks import warmup_steps
from rlhfkit.config.rl import BatchPlan, RLConfig


@dataclass(frozen=True)
class RunPlan:
    """Every count of a run; built by `plan_run`."""

    num_prompts: int
    """Prompts in the dataset (before --data.prompt_max_len filtering, which needs the tokenizer)."""
    prompts_per_rollout: int
    samples_per_rollout: int
    micro_batches_per_step: int
    """Forward/backward passes per optimizer step (gradient accumulation)."""
    optimizer_steps_per_rollout: int
    rollouts_per_episode: int
    optimizer_steps_per_episode: int
    seed002_update_steps_per_episode: int
    """Seed 002's formula (counts a partial rollout batch); equals ours when nothing is dropped."""
    prompts_dropped_per_episode: int
    total_rollouts: int
    """RL steps of the run: rollouts_per_episode * num_episodes, capped by --train.max_steps."""
    total_optimizer_steps: int
    total_samples: int
    warmup_steps: int
    eval_points: tuple[int, ...]
    """RL steps after which the periodic evaluation runs (besides before and after training)."""


def plan_run(cfg: RLConfig, batch: BatchPlan, num_prompts: int) -> RunPlan:
    """The counts of `cfg` on a dataset of `num_prompts` prompts (`batch` from `validate(cfg)`)."""
    r, t = cfg.rollout, cfg.train
    per_episode = num_prompts // r.batch_size
    total = per_episode * t.num_episodes
    if t.max_steps is not None:
        total = min(total, t.max_steps)
    total_opt = total * batch.optimizer_steps_per_rollout
    every = cfg.eval.steps
    eval_points = tuple(range(every, total, every)) if every > 0 else ()
    return RunPlan(
        num_prompts=num_prompts,
        prompts_per_rollout=r.batch_size,
        samples_per_rollout=batch.samples_per_rollout,
        micro_batches_per_step=batch.micro_batches_per_step,
        optimizer_steps_per_rollout=batch.optimizer_steps_per_rollout,
        rollouts_per_episode=per_episode,
        optimizer_steps_per_episode=per_episode * batch.optimizer_steps_per_rollout,
        seed002_update_steps_per_episode=num_prompts * r.n_samples_per_prompt // t.batch_size * t.max_epochs,
        prompts_dropped_per_episode=num_prompts - per_episode * r.batch_size,
        total_rollouts=total,
        total_optimizer_steps=total_opt,
        total_samples=total * batch.samples_per_rollout,
        warmup_steps=warmup_steps(cfg.actor.lr_warmup_steps, cfg.actor.lr_warmup_ratio, total_opt),
        eval_points=eval_points,
    )


def response_tokens(cfg: RLConfig) -> tuple[int, str]:
    """The most tokens of one response (what the memory estimate decodes and trains on) and how they
    add up. Single-turn: --rollout.max_new_tokens. Multi-turn (--agent.func_path, --agent.env,
    --agent.tools): the episode's budget --agent.max_response_tokens (default max_new_tokens x
    max_turns), which actions and feedback share; with tools alone, at most the actions
    (max_turns x max_new_tokens) plus the tool results (--agent.tool_calls_per_episode x
    --agent.tool_result_tokens; the template's few tokens around each result not counted)."""
    r, g = cfg.rollout, cfg.agent
    if g.func_path is None and g.env is None and g.tools is None:
        return r.max_new_tokens, f"{r.max_new_tokens} new"
    total = g.max_response_tokens or r.max_new_tokens * g.max_turns
    if g.tools is None or g.env is not None:
        return total, f"{total} response (actions + feedback, --agent.max_response_tokens)"
    actions, results = g.max_turns * r.max_new_tokens, g.tool_calls_per_episode * g.tool_result_tokens
    n = min(total, actions + results)
    return n, (f"{n} response: {g.max_turns} turns x {r.max_new_tokens} + {g.tool_calls_per_episode} tool results x "
               f"{g.tool_result_tokens} tokens, at most --agent.max_response_tokens {total}")


def plan_warnings(cfg: RLConfig, plan: RunPlan) -> list[str]:
    """Settings that `validate` accepts but that probably do not do what was meant."""
    r, t, k = cfg.rollout, cfg.train, cfg.algo.kl
    out = []
    if plan.rollouts_per_episode == 0:
        out.append(f"the dataset has {plan.num_prompts} prompts, fewer than --rollout.batch_size "
                   f"{r.batch_size}: training cannot start; lower --rollout.batch_size or add prompts")
    elif plan.prompts_dropped_per_episode:
        out.append(f"{plan.prompts_dropped_per_episode} of {plan.num_prompts} prompts are left out of each "
                   f"episode ({plan.num_prompts} is not a multiple of --rollout.batch_size {r.batch_size})")
    full = plan.rollouts_per_episode * t.num_episodes
    if t.max_steps is not None and t.max_steps > full > 0:
        out.append(f"--train.max_steps {t.max_steps} is more than the {full} rollouts of "
                   f"{t.num_episodes} episode(s); the run stops after {full}: raise --train.num_episodes")
    if t.max_steps is not None and t.max_steps < plan.rollouts_per_episode and t.num_episodes > 1:
        out.append(f"--train.max_steps {t.max_steps} ends the run inside episode 1; "
                   f"--train.num_episodes {t.num_episodes} has no effect")
    if cfg.eval.steps > 0 and plan.total_rollouts and cfg.eval.steps >= plan.total_rollouts:
        out.append(f"--eval.steps {cfg.eval.steps} >= the {plan.total_rollouts} RL steps of the run: "
                   "only the evaluations before and after training run")
    if cfg.eval.steps > 0 and not cfg.eval.dataset:
        out.append("--eval.steps is set but --eval.dataset is not: nothing is evaluated")
    if cfg.ckpt.save_steps > 0 and cfg.ckpt.save_steps >= plan.total_rollouts > 0:
        out.append(f"--ckpt.save_steps {cfg.ckpt.save_steps} >= the {plan.total_rollouts} RL steps: "
                   "only the final model is saved")
    if cfg.actor.lr_warmup_steps > plan.total_optimizer_steps:
        out.append(f"--actor.lr_warmup_steps {cfg.actor.lr_warmup_steps} > the {plan.total_optimizer_steps} "
                   "optimizer steps of the run: the learning rate never reaches --actor.adam.lr")
    if k.init_coef == 0 and (k.use_loss or k.target is not None):
        out.append("--algo.kl.use_loss / --algo.kl.target have no effect with --algo.kl.init_coef 0 "
                   "(no reference model is loaded)")
    if cfg.algo.dynamic_filtering_enable and t.batch_size < plan.samples_per_rollout:
        out.append("--algo.dynamic_filtering_enable drops whole groups (and tops the batch up for at most "
                   f"--algo.dynamic_filtering_max_rounds {cfg.algo.dynamic_filtering_max_rounds} rounds), "
                   "so a rollout can have fewer samples "
                   f"than {plan.samples_per_rollout}: the last optimizer step of a rollout may see fewer "
                   f"than --train.batch_size {t.batch_size} samples and the optimizer-step counts above are maxima")
    rounds = cfg.algo.dynamic_filtering_max_rounds
    if cfg.algo.dynamic_filtering_enable and rounds > 1 and plan.total_rollouts > full // rounds:
        out.append(f"--algo.dynamic_filtering_max_rounds {rounds} tops each rollout up with prompts taken from the "
                   f"dataset (up to {rounds} x --rollout.batch_size {r.batch_size} per step): the {full} rollouts' "
                   f"prompts may run out after as few as {full // rounds} of the {plan.total_rollouts} planned steps "
                   "(the run then stops and says so); raise --train.num_episodes to be sure to reach them")
    if plan.optimizer_steps_per_rollout == 1 and cfg.actor.eps_clip_low_high != (0.2, 0.2):
        out.append("one optimizer step per rollout is fully on-policy: the ratio is 1 and "
                   "--actor.eps_clip_low_high never clips")
    if r.temperature == 0 and r.n_samples_per_prompt > 1:
        out.append("--rollout.temperature 0 is greedy: the n_samples_per_prompt samples of a prompt are "
                   "identical and group advantages are all zero")
    return out
