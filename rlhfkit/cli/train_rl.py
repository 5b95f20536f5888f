"""`rlhfkit train rl`: parse and validate flags before any model loads, build, train, save."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from rlhfkit.cli.resume import setup_checkpoints
from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, to_dict, validate
from rlhfkit.data.prompts import load_prompts
from rlhfkit.distributed import fsdp
from rlhfkit.errors import ConfigError
from rlhfkit.rollout.vllm import require_vllm
from rlhfkit.tracking.run import RunTracker
from rlhfkit.tracking.wandb_writer import WandbWriter
from rlhfkit.trainers.build import (build_engine, build_executor, build_models, load_reward, resolve_model,
                                   tokenize_prompts)
from rlhfkit.trainers.evaluate import Evaluator, reward_score_fn, reward_verifier
from rlhfkit.trainers.rl import RLTrainer

def extra_writers(cfg: RLConfig, run_dir: Path) -> tuple:
    """A WandbWriter when --logger.wandb.project is given (and the mode is not disabled)."""
    w = cfg.logger.wandb
    if not w.project or w.mode == "disabled":
        return ()
    return (WandbWriter(w.project, run_dir, name=w.name, mode=w.mode, group=w.group, config=to_dict(cfg)),)


def parse_rl_args(argv: list[str]) -> RLConfig:
    cfg = parse_config(RLConfig, argv, aliases=RL_ALIASES)
    validate(cfg)
    return cfg


def prepare_run_dir(cfg: RLConfig, rank: int = 0) -> Path:
    """The run folder; under torchrun, ranks other than 0 log their own metrics in <output_dir>/rankN."""
    run_dir = Path(cfg.ckpt.output_dir) if rank == 0 else Path(cfg.ckpt.output_dir) / f"rank{rank}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    return run_dir


def build_trainer(
    cfg: RLConfig, load_examples, run_dir: Path, callbacks=(), reward_fn=None, resume_step: int | None = None,
    make_engine=None,
    dp: tuple[int, int] = (0, 1),
) -> tuple[RLTrainer, RunTracker, int]:
    """Models, engine, reward (`reward_fn` or --reward.remote_url), prompts (`load_examples(tokenizer)`)
    and tracker -> an RLTrainer. `resume_step`: the step of the checkpoint the run will resume from.
    `make_engine(policy, tokenizer)`: another engine than the one --distributed.backend builds (tests)."""
    plan = validate(cfg)
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    if cfg.rollout.engine == "vllm":  # fail fast, before models load
        require_vllm()
    executor = build_executor(cfg)
    if reward_fn is None and not executor.provides_rewards:  # an agent's step() gives the rewards
        reward_fn = load_reward(cfg.reward, cfg.train.micro_batch_size)
    policy, tokenizer, ref, critic = build_models(cfg)
    state_fn = None
    if cfg.fsdp.enable:  # shard before the optimizer is built on the parameters
        state_fn = shard_for_fsdp(cfg, policy, ref, critic, dp[1])
    if make_engine is not None:
        engine = make_engine(policy, tokenizer)
    elif cfg.distributed.backend == "ray":
        engine = build_pool(cfg, policy)
    else:
        engine = build_engine(policy, tokenizer, cfg, state_fn=state_fn)
    prompts, skipped = tokenize_prompts(load_examples(tokenizer), tokenizer, cfg.data.prompt_max_len)
    trainer = RLTrainer(cfg, plan, policy, tokenizer, engine, reward_fn, prompts, ref=ref, critic=critic,
                        callbacks=callbacks, executor=executor)
    tracker = RunTracker(run_dir, cfg.logger.tensorboard_dir, trainer.total_steps, cfg.logger.progress_bar,
                         purge_step=None if resume_step is None else resume_step + 1,
                         writers=extra_writers(cfg, run_dir))
    trainer.tracker = tracker
    trainer.dp = dp
    return trainer, tracker, skipped


def build_pool(cfg: RLConfig, policy, delays: dict[int, float] | None = None):
    """--rollout.num_workers RolloutWorker actors behind a RayEnginePool (Ray must be running).
    `delays`: test-only slow-worker hook (slot -> seconds each weight update is held back)."""
    from rlhfkit.distributed.launch import worker_factory
    from rlhfkit.distributed.pool import RayEnginePool

    path, gguf = resolve_model(cfg.actor.model_name_or_path)
    make = worker_factory(path, gguf, cfg.actor.dtype, cfg.actor.autocast, cfg.rollout.max_batch_size,
                          cfg.distributed.num_gpus_per_worker, delays)
    return RayEnginePool(policy, make, cfg.rollout.num_workers, wait_for_weights=not cfg.train.async_enable)


def shard_for_fsdp(cfg: RLConfig, policy, ref, critic, world: int):
    """FSDP2-shard the policy and reference across `world` torchrun processes; returns the vLLM
    engine's weight source (the gathered full state, on every rank)."""
    c = cfg.ckpt
    fsdp.check_fsdp_settings(world, cfg.train.batch_size, critic is not None, c.save_steps > 0 or c.load_enable,
                             cfg.algo.dynamic_filtering_enable, cfg.train.dynamic_batch_enable)
    for model in (policy, ref):
        if model is not None:
            fsdp.shard_model(model, world, cfg.fsdp.mixed_precision)
    return lambda: fsdp.full_state_dict(policy, rank0_only=False)


def make_evaluator(cfg: RLConfig) -> Evaluator:
    """The --eval.* settings as an Evaluator without prompts (set `.items` and the scorers later)."""
    e = cfg.eval
    return Evaluator([], cfg.rollout.max_new_tokens, e.steps, score_fn=None, n_samples=e.n_samples,
                     temperature=e.temperature, ks=e.k, seed=cfg.train.seed)


def attach_scorers(evaluator: Evaluator, cfg: RLConfig, reward_fn) -> None:
    """Training reward -> eval/reward, eval/accuracy; --eval.verifier (default: the training reward)
    -> eval/pass@k, eval/maj@k."""
    if reward_fn is not None:
        evaluator.score_fn = reward_score_fn(reward_fn)
    verifier = load_reward(cfg.eval.verifier) if cfg.eval.verifier else reward_fn
    evaluator.verifier = reward_verifier(verifier) if verifier is not None else None


def run(argv: list[str]) -> int:
    cfg = parse_rl_args(argv)
    if not cfg.data.prompt_dataset:
        raise ConfigError("--data.prompt_dataset is required (a .jsonl/.json/.parquet file or a datasets folder)")
    rank, world = fsdp.init_from_torchrun() if cfg.fsdp.enable else (0, 1)
    run_dir = prepare_run_dir(cfg, rank)
    t0 = time.perf_counter()
    d = cfg.data
    load_prompts(d.prompt_dataset, input_key=d.input_key, label_key=d.label_key,  # fail fast, before models
                 input_template=d.input_template, max_samples=d.max_samples)
    if cfg.eval.dataset and cfg.agent.func_path:
        raise ConfigError("--eval.dataset is single-turn greedy evaluation; it does not run agents yet "
                          "(drop --eval.dataset or --agent.func_path)")
    if cfg.eval.dataset:  # fail fast, before models, on a missing file or key
        load_prompts(cfg.eval.dataset, input_key=d.input_key, label_key=d.label_key,
                     input_template=d.input_template, max_samples=cfg.eval.max_samples)
    if cfg.eval.verifier:  # fail fast, before models
        load_reward(cfg.eval.verifier)
    if cfg.distributed.backend == "ray":
        return run_on_ray(cfg, run_dir, t0)
    return train(cfg, run_dir, t0, dp=(rank, world))


def run_on_ray(cfg: RLConfig, run_dir: Path, t0: float) -> int:
    """`train` in a trainer actor of a Ray cluster (joined or started here, shut down at the end)."""
    from rlhfkit.distributed.launch import run_in_trainer_actor, start_ray

    d = cfg.distributed
    started = start_ray(d.address, d.num_cpus or cfg.rollout.num_workers + 1, run_dir / "ray")
    try:
        return run_in_trainer_actor(train, (cfg, run_dir, t0), cfg.train.num_threads, d.num_gpus_trainer)
    finally:
        if started:
            import ray

            ray.shutdown()


def train(cfg: RLConfig, run_dir: Path, t0: float, dp: tuple[int, int] = (0, 1)) -> int:
    """Build, (resume,) train, evaluate and save: the same code in one process and in a trainer actor.
    `dp`: (rank, world size) under torchrun with --fsdp.enable."""
    d, rank = cfg.data, dp[0]

    def load_examples(tokenizer, path=d.prompt_dataset, max_samples=d.max_samples):
        return load_prompts(path, input_key=d.input_key, label_key=d.label_key, tokenizer=tokenizer,
                            apply_chat_template=d.apply_chat_template, input_template=d.input_template,
                            max_samples=max_samples, shuffle_seed=cfg.train.seed)

    evaluator = make_evaluator(cfg)
    ckpt, resume = setup_checkpoints(cfg, run_dir)
    trainer, tracker, skipped = build_trainer(cfg, load_examples, run_dir, callbacks=[evaluator.periodic, ckpt.periodic],
                                              resume_step=resume[1] if resume else None, dp=dp)
    if resume:
        ckpt.load(trainer, resume[0])
        print(f"resumed from {resume[0]} (step {trainer.step} of {trainer.total_steps})")
    if skipped:
        print(f"skipped {skipped} prompts longer than --data.prompt_max_len {d.prompt_max_len} tokens")
    if cfg.eval.dataset:
        examples = load_examples(trainer.tokenizer, cfg.eval.dataset, cfg.eval.max_samples)
        evaluator.items, _ = tokenize_prompts(examples, trainer.tokenizer, d.prompt_max_len)
        attach_scorers(evaluator, cfg, trainer.reward_fn)
    if trainer.step == 0:
        evaluator(trainer, 0)
    fit(trainer, cfg)
    evaluator(trainer, trainer.step)
    if cfg.fsdp.enable:  # gathered on rank 0, written to <output_dir>/final
        final = fsdp.save_full(trainer.policy, trainer.tokenizer, Path(cfg.ckpt.output_dir) / "final", rank)
    else:
        final = trainer.save(run_dir / "final")
        ema = trainer.save_ema(run_dir / "ema")
        if ema is not None:
            print(f"EMA of the policy (--actor.ema_beta {cfg.actor.ema_beta}) saved to {ema}")
    tracker.close()
    if cfg.fsdp.enable:
        fsdp.finish()
    print(f"done in {time.perf_counter() - t0:.0f}s: {trainer.step} steps; model saved to {final}")
    return 0


def fit(trainer: RLTrainer, cfg: RLConfig) -> list[dict]:
    """trainer.fit(), or with --train.async_enable the pipelined loop of rlhfkit.distributed."""
    if not cfg.train.async_enable:
        return trainer.fit()
    from rlhfkit.distributed.async_loop import fit_async

    return fit_async(trainer, cfg.rollout.batch_size, cfg.train.max_staleness)
