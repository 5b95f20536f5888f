"""The run folder of a training run and what lives in it: the folder itself with config.json, the
trackers (metrics.jsonl, TensorBoard, wandb), the checkpoints to save and resume from, and the
evaluator of the --eval.* settings. Used by the RL, supervised and workflow trainers and `rlhfkit eval`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlhfkit.api.builder import load_reward, token_budget
from rlhfkit.config import RLConfig, to_dict
from rlhfkit.distributed.fsdp_checkpoint import ShardedCheckpointer
from rlhfkit.errors import ConfigError, one_line, os_error_fix
from rlhfkit.tracking.metrics import drop_steps_after
from rlhfkit.tracking.run import RunTracker
from rlhfkit.tracking.wandb_writer import WandbWriter
from rlhfkit.trainers.checkpoint import Checkpointer, latest_good, list_checkpoints
from rlhfkit.trainers.evaluate import Evaluator, reward_score_fn, reward_verifier

log = logging.getLogger("rlhfkit")
STEP_LOGS = ("metrics.jsonl", "samples.jsonl")


def prepare_run_dir(cfg: RLConfig, rank: int = 0) -> Path:
    """The run folder; under torchrun, ranks other than 0 log their own metrics in <output_dir>/rankN."""
    run_dir = Path(cfg.ckpt.output_dir) if rank == 0 else Path(cfg.ckpt.output_dir) / f"rank{rank}"
    return create_run_dir(run_dir, cfg.logger.tensorboard_dir, to_dict(cfg))


def create_run_dir(run_dir: Path, tensorboard_dir: str | None, config: dict | None) -> Path:
    """Create the run folder (--ckpt.output_dir) and --logger.tensorboard_dir, and write `config` as
    config.json (unless None), before any model loads: a file in the way or a place that cannot be
    written is a ConfigError naming the flag."""
    for flag, folder in (("--ckpt.output_dir", run_dir), ("--logger.tensorboard_dir", tensorboard_dir)):
        if folder is None:
            continue
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{flag} {folder} is a file, not a folder; choose a folder path (it is created "
                              "when missing)")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if flag == "--ckpt.output_dir" and config is not None:
                (folder / "config.json").write_text(json.dumps(config, indent=2))
        except OSError as exc:
            raise ConfigError(f"{flag} {folder}: cannot create the folder or write in it ({one_line(exc)}); "
                              f"{os_error_fix(exc)}") from exc
    return run_dir


def extra_writers(cfg: RLConfig, run_dir: Path) -> tuple:
    """A WandbWriter when --logger.wandb.project is given (and the mode is not disabled)."""
    w = cfg.logger.wandb
    if not w.project or w.mode == "disabled":
        return ()
    return (WandbWriter(w.project, run_dir, name=w.name, mode=w.mode, group=w.group, config=to_dict(cfg)),)


def run_tracker(cfg: RLConfig, run_dir: Path, total_steps: int, resume_step: int | None) -> RunTracker:
    return RunTracker(run_dir, cfg.logger.tensorboard_dir, total_steps, cfg.logger.progress_bar,
                      purge_step=None if resume_step is None else resume_step + 1, writers=extra_writers(cfg, run_dir))


def setup_checkpoints(cfg: RLConfig, run_dir: Path,
                      dp: tuple[int, int] | None = None) -> tuple[Checkpointer, tuple[Path, int] | None]:
    """The run's Checkpointer and (folder, step) of the checkpoint to resume from (None: start fresh).
    On resume the step-indexed logs (metrics.jsonl, samples.jsonl) are cut back to the checkpoint's
    step, so the steps that are trained again are not logged twice. With `dp` (rank, world size) of
    an FSDP run, a ShardedCheckpointer of <output_dir>/checkpoints, shared by the ranks (each rank's
    logs are in its own `run_dir`)."""
    if dp is None:
        root = run_dir / "checkpoints"
        ckpt = Checkpointer(root, cfg.ckpt.save_steps, cfg.ckpt.max_num, keep_best=cfg.ckpt.keep_best)
    else:
        root = Path(cfg.ckpt.output_dir) / "checkpoints"
        ckpt = ShardedCheckpointer(root, cfg.ckpt.save_steps, cfg.ckpt.max_num, *dp, keep_best=cfg.ckpt.keep_best)
    if not cfg.ckpt.load_enable:
        if cfg.ckpt.save_steps > 0 and list_checkpoints(root):
            raise ConfigError(
                f"{root} already holds checkpoints of an earlier run; pass --ckpt.load_enable true to resume "
                "it, or choose another --ckpt.output_dir"
            )
        return ckpt, None
    resume = latest_good(root)
    if resume is None:
        log.warning("--ckpt.load_enable: no checkpoint in %s yet; starting from scratch", root)
        return ckpt, None
    for name in STEP_LOGS:
        dropped = drop_steps_after(run_dir / name, resume[1])
        if dropped:
            log.warning("%s: dropped %d lines logged after step %d (they are trained again)", name, dropped, resume[1])
    return ckpt, resume


def make_evaluator(cfg: RLConfig, items=(), reward_fn=None, verifier=None, executor=None) -> Evaluator:
    """The --eval.* settings on `items` (PromptItems; none: evaluation does nothing). The training
    reward gives eval/reward and eval/accuracy; `verifier` (default: --eval.verifier loaded here, else
    the training reward) gives eval/pass@k and eval/maj@k. A multi-turn `executor` (an agent's or
    tool-calling episodes; its own instance, not the trainer's) makes each sample an episode within
    the agent's budgets (--agent.max_turns, --agent.max_response_tokens); an agent function's executor
    scores with `reward_fn` the episodes whose function returns None, as in training."""
    e = cfg.eval
    if verifier is None:
        verifier = load_reward(e.verifier) if e.verifier else reward_fn
    if getattr(executor, "fallback_reward_fn", False) is None:  # an agent function's: as in training
        executor.fallback_reward_fn = reward_fn
    multi = executor is not None and (executor.provides_rewards or getattr(executor, "multi_turn", False))
    return Evaluator(items, cfg.rollout.max_new_tokens, e.steps,
                     score_fn=reward_score_fn(reward_fn) if reward_fn is not None else None,
                     n_samples=e.n_samples, temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, ks=e.k,
                     verifier=reward_verifier(verifier) if verifier is not None else None, seed=cfg.train.seed,
                     executor=executor if multi else None, budget=token_budget(cfg, True) if multi else None)
