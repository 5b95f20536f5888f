"""`rlhfkit.RLTrainer`: the RL trainer as a library object.

    cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", path, ...])   # the CLI's flags
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=my_reward, train_dataset=rows)
    metrics = trainer.train()      # the run folder as `rlhfkit train rl` writes it; final metrics
    trainer.save("out/final")      # an HF folder

`from_config` maps the config to the loop's stages (rlhfkit.api.builder); explicit arguments
win over config paths (`reward_fn` over --reward.*, `train_dataset` over --data.prompt_dataset,
`eval_dataset` over --eval.dataset). With --distributed.backend ray the whole run happens in a
trainer actor of a Ray cluster (started here when no --distributed.address is given).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlhfkit.agents import ExecuteRunner, MultiTurnExecutor, SingleTurnExecutor
from rlhfkit.api import builder, engines, run_folder
from rlhfkit.api import vision as V
from rlhfkit.config import RLConfig
from rlhfkit.config.opd import OPDConfig, validate_opd
from rlhfkit.config.plan import plan_run
from rlhfkit.config.rl import BatchPlan, validate
from rlhfkit.data.prompts import load_prompts, tokenize_prompts
from rlhfkit.data.truncate import TRUNCATION_SIDES
from rlhfkit.distributed import fsdp
from rlhfkit.errors import ConfigError, one_line
from rlhfkit.models.host import apply_host_settings
from rlhfkit.rewards.resolve import resolve_reward
from rlhfkit.rollout.vllm import require_vllm
from rlhfkit.tracking.progress import set_log_level
from rlhfkit.trainers.rl.loop import RLLoop


def load_examples_fn(cfg: RLConfig, dataset, eval: bool = False) -> Callable:
    """tokenizer -> PromptExamples of `dataset`: a path (a .jsonl/.json/.parquet file, a datasets folder),
    a hub dataset name, a list of dicts, a datasets.Dataset, or already a function of the tokenizer
    returning PromptExamples; read with the --data.* options (with `eval`, --eval.*'s split and size)."""
    if callable(dataset):
        return dataset

    def load(tokenizer):
        return load_prompts(dataset, tokenizer=tokenizer, **builder.prompt_options(cfg, eval))

    return load


def _check_inputs(cfg: RLConfig, train_dataset, eval_dataset, vision_folder, executor=None) -> tuple[Any, Any]:
    """The datasets to read (explicit arguments over the config's paths, then the prompts of an executor
    with its own dataset: a verifiers environment's), checked before any model loads, with the settings
    that must fail fast (threads, vLLM present)."""
    if train_dataset is None and cfg.data.prompt_dataset is None and hasattr(executor, "own_dataset"):
        train_dataset = executor.own_dataset(cfg.data.input_key)
    train_dataset = builder.prompt_source(cfg, train_dataset)  # several datasets: one Blend of them
    if train_dataset is None:
        raise ConfigError("no prompts: pass train_dataset= or --data.prompt_dataset (a .jsonl/.json/.parquet "
                          "file or a datasets folder)")
    eval_dataset = eval_dataset if eval_dataset is not None else cfg.eval.dataset
    for data, is_eval in ((train_dataset, False), (eval_dataset, True)):
        if data is not None and not callable(data):
            V.check_data(cfg, data, vision_folder is not None, eval=is_eval)
    _check_truncation(cfg, executor)
    apply_host_settings(cfg.train.num_threads, cfg.train.keep_freed_memory)
    if cfg.rollout.engine == "vllm":  # fail fast, before models load
        require_vllm()
    return train_dataset, eval_dataset


def _check_truncation(cfg: RLConfig, executor) -> None:
    """--data.truncation left|right|middle cuts the tokenized prompt (`PromptItem.text` / `ids`); executors that
    render each prompt again from its record's value (tool-calling, text-environment and agent-function
    episodes read `PromptItem.raw`, left whole) would run it uncut: refused with them."""
    if cfg.data.truncation in TRUNCATION_SIDES and executor is not None and not isinstance(
            executor, (SingleTurnExecutor, MultiTurnExecutor, ExecuteRunner)):
        raise ConfigError(f"--data.truncation {cfg.data.truncation}: {type(executor).__name__} renders each prompt "
                          "again from its record, uncut; use --data.truncation skip or error with it")


def _reward_of(cfg: RLConfig, executor, reward_fn, reward_weights, device):
    """The run's reward function: the one given (resolved), else the config's (--reward.*) unless the
    environment scores its own episodes alone; an agent function's executor takes it as its fallback."""
    # an environment's own rewards (an agent function's executor takes the reward function as its fallback)
    own = executor.provides_rewards and not hasattr(executor, "fallback_reward_fn")
    both = own and (reward_fn is not None or cfg.reward.remote_url is not None
                    or cfg.reward.model_name_or_path is not None)
    if both and cfg.agent.env_reward_weight is None:
        raise ConfigError("the environment gives rewards and a reward function is set too (--reward.* or "
                          "reward_fn=): set --agent.env_reward_weight W (reward = W x the environment's + the "
                          "function's; 0: the function's alone), or drop the reward function")
    if reward_fn is not None:
        reward_fn = resolve_reward(reward_fn, reward_weights, timeout=cfg.reward.timeout,
                                   remote_options=builder.remote_options(cfg.reward))
    elif not executor.provides_rewards or builder.agent_takes_reward_fn(executor, cfg) or both:
        reward_fn = builder.load_reward(cfg.reward, cfg.train.micro_batch_size, device)
    if reward_fn is not None and hasattr(executor, "fallback_reward_fn"):
        executor.fallback_reward_fn = reward_fn  # scores the episodes whose agent function returns None
    return reward_fn


def _engine_of(cfg: RLConfig, policy, tokenizer, processor, make_engine, pool, state_fn):
    """The rollout engine: the caller's `make_engine`, a Ray trainer actor's pool, the vision engine for a
    vision-language policy, else the one --rollout.engine names."""
    if make_engine is not None:
        return make_engine(policy, tokenizer)
    if pool is not None:  # a vision-language policy's vLLM engines get its image settings
        vllm_images = processor is not None and cfg.rollout.engine == "vllm"
        return pool(policy, tokenizer, V.vllm_image_settings(cfg, processor, policy.config) if vllm_images else None)
    if processor is not None:
        return V.build_engine(policy, tokenizer, cfg, processor, state_fn)
    return engines.build_engine(policy, tokenizer, cfg, state_fn=state_fn)


def _prompt_items(cfg: RLConfig, dataset, tokenizer, processor, eval: bool = False) -> tuple[list, int]:
    """The tokenized prompts of `dataset` (with their images for a vision-language policy) and how many
    were skipped as longer than --data.prompt_max_len."""
    if processor is not None:
        return V.prompts(cfg, dataset, processor, eval=eval)
    examples = load_examples_fn(cfg, dataset, eval=eval)(tokenizer)
    return tokenize_prompts(examples, tokenizer, cfg.data.prompt_max_len, cfg.data.input_key, cfg.data.truncation,
                            cfg.data.input_template)


class RLTrainer:
    """An RL run: the loop, its run folder, loggers, checkpoints and evaluation. Build it with
    `from_config`; `train()` runs it, `save(path)` writes the policy as an HF folder."""

    validate = staticmethod(validate)  # the config's checks, run once by from_config; its batch plan

    def __init__(self, cfg: RLConfig, loop: RLLoop, run_dir: Path, tracker, evaluator, checkpointer,
                 resume: tuple[Path, int] | None = None, skipped: int = 0, dp: tuple[int, int] = (0, 1),
                 reward_fn=None, processor=None):
        self.cfg, self.loop, self.run_dir, self.tracker = cfg, loop, run_dir, tracker
        self.evaluator, self.checkpointer, self.resume = evaluator, checkpointer, resume
        self.skipped, self.dp = skipped, dp
        self.reward_fn = reward_fn
        self.processor = processor  # a vision-language policy's processor (saved beside its weights), else None

    # the pieces a notebook looks at
    @property
    def policy(self) -> torch.nn.Module:
        return self.loop.policy

    @property
    def tokenizer(self):
        return self.loop.tokenizer

    @property
    def engine(self):
        return self.loop.engine

    @property
    def step(self) -> int:
        return self.loop.step

    @classmethod
    def from_config(cls, cfg: RLConfig, reward_fn: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                    *, reward_weights: Sequence[float] | None = None, callbacks: Sequence[Callable] = (),
                    make_engine: Callable | None = None, tools: Sequence[Callable] | None = None,
                    environment_factory: Callable | None = None, agent: Any = None) -> RLTrainer | RayRLTrainer:
        """Build the run of `cfg`.

        reward_fn: a Python callable (OpenRLHF's `reward_func(queries, prompts, labels, **kwargs)` or
          TRL's `reward(completions, **kwargs)`), a reward file, builtin:math, a reward server URL, or a
          list of them (summed with `reward_weights`); None: --reward.remote_url / --reward.model_name_or_path.
        train_dataset: a list of dicts, a datasets.Dataset, a path or hub name (None: --data.prompt_dataset), with
          --data.input_key / --data.label_key; prompts are strings or message lists.
        eval_dataset: likewise (None: --eval.dataset if set).
        callbacks: `cb(loop, step, metrics)` after each step (besides evaluation and checkpoints).
        make_engine: `(policy, tokenizer) -> engine` instead of the one the config builds (tests).
        tools: Python functions (sync or async, with type hints and a docstring) the model may call
          in multi-turn episodes, as TRL's GRPOTrainer(tools=...); None: --agent.tools.
        environment_factory: a class (TRL's contract): one instance per episode, its public methods
          are tools, `reset(**row)` starts it, `get_reward()` (optional) gives the episode's reward.
        agent: an agent function `async def agent(client, prompt, label, **row)` whose `client` is an
          `openai.AsyncOpenAI` pointed at the policy's OpenAI-compatible endpoint (docs/agents.md), or
          an executor object; None: --agent.func_path."""
        plan = cls.validate(cfg)
        if cfg.distributed.backend == "ray":
            if make_engine is not None or callbacks:
                raise ConfigError("--distributed.backend ray builds its engines and callbacks in the trainer actor; "
                                  "drop make_engine / callbacks")
            agents = dict(tools=tools, environment_factory=environment_factory, agent=agent)
            _check_sendable({k: v for k, v in dict(reward_fn=reward_fn, **agents).items() if v is not None})
            return RayRLTrainer(cfg, plan, dict(reward_fn=reward_fn, train_dataset=train_dataset,
                                                eval_dataset=eval_dataset, reward_weights=reward_weights, **agents))
        return cls.build(cfg, plan, reward_fn, train_dataset, eval_dataset, reward_weights=reward_weights,
                         callbacks=callbacks, make_engine=make_engine, tools=tools,
                         environment_factory=environment_factory, agent=agent)

    @classmethod
    def build(cls, cfg: RLConfig, plan: BatchPlan, reward_fn=None, train_dataset=None, eval_dataset=None, *,
              reward_weights=None, callbacks: Sequence[Callable] = (), make_engine: Callable | None = None,
              pool=None, tools: Sequence[Callable] | None = None, environment_factory: Callable | None = None,
              agent: Any = None) -> RLTrainer:
        """`from_config` in this process (in a Ray trainer actor, `pool(policy, tokenizer, images)` makes its
        RayEnginePool), for a config already validated into `plan`: inputs checked, the executor and rewards,
        the models and engine, the prompts, then the run folder's pieces and the loop."""
        # --actor.autocast auto: probe the device once, here
        cfg = builder.resolve_fsdp_dtype(builder.resolve_autocast(cfg))
        set_log_level(cfg.logger.log_level)
        vision_folder = V.policy_folder(cfg)  # a vision-language policy: its data is checked before it loads
        executor = builder.build_executor(cfg, tools, environment_factory, agent)
        train_dataset, eval_dataset = _check_inputs(cfg, train_dataset, eval_dataset, vision_folder, executor)
        device = builder.run_device(cfg)  # a CUDA device that is not there fails here, before models load
        rank, world = fsdp.init_from_torchrun() if cfg.fsdp.enable else (0, 1)
        run_dir = run_folder.prepare_run_dir(cfg, rank)
        processor = V.processor_of(vision_folder) if vision_folder else None
        if vision_folder is not None:
            V.check_executor(cfg, executor, vision_folder)
            V.check_engine(cfg, vision_folder, processor)
        reward_fn = _reward_of(cfg, executor, reward_fn, reward_weights, device)
        policy, tokenizer, ref, critic = builder.build_models(cfg, device)
        if processor is not None:
            V.prepare_policy(cfg, policy, ref, critic)
        teacher = builder.build_teacher(cfg, tokenizer, device)
        state_fn = builder.shard_for_fsdp(cfg, policy, ref, critic, world) if cfg.fsdp.enable else None
        engine = _engine_of(cfg, policy, tokenizer, processor, make_engine, pool, state_fn)
        cfg = builder.fit_to_positions(cfg, policy, "prompt_max_len")
        prompts, skipped = _prompt_items(cfg, train_dataset, tokenizer, processor)
        data = builder.prompt_stream(cfg, prompts)
        counts = plan_run(cfg, plan, len(prompts))  # the run's step counts, once
        eval_items = [] if eval_dataset is None else \
            _prompt_items(cfg, eval_dataset, tokenizer, processor, eval=True)[0]
        if cfg.ckpt.keep_best and not eval_items:
            raise ConfigError(f"--ckpt.keep_best {cfg.ckpt.keep_best} judges evaluations: give --eval.dataset")
        # held-out episodes run on an executor of their own (its tool counters are not the rollout's)
        eval_executor = builder.build_executor(cfg, tools, environment_factory, agent) if eval_items else None
        if processor is not None:
            V.attach_processor(processor, cfg.data.max_images_per_prompt, executor, eval_executor)
        evaluator = run_folder.make_evaluator(cfg, eval_items, reward_fn, executor=eval_executor)
        checkpointer, resume = run_folder.setup_checkpoints(cfg, run_dir, (rank, world) if cfg.fsdp.enable else None)
        tracker = run_folder.run_tracker(cfg, run_dir, counts.total_rollouts, resume[1] if resume else None)
        loop = builder.build_loop(cfg, counts, policy, tokenizer, engine, reward_fn, data, executor, ref=ref,
                                  critic=critic, teacher=teacher, tracker=tracker,
                                  callbacks=[evaluator.periodic, checkpointer.periodic, *callbacks],
                                  dp=(rank, world))
        return cls(cfg, loop, run_dir, tracker, evaluator, checkpointer, resume, skipped, (rank, world), reward_fn,
                   processor)

    def train(self) -> dict[str, float]:
        """Resume (with --ckpt.load_enable), evaluate, train, evaluate, save `final/` (and `ema/`), close the
        loggers. Returns the last step's metrics merged with the final evaluation's."""
        t0, loop = time.perf_counter(), self.loop
        if self.resume:
            self.checkpointer.load(loop, self.resume[0])
            print(f"resumed from {self.resume[0]} (step {loop.step} of {loop.total_steps})")
        if self.skipped:
            print(f"skipped {self.skipped} prompts longer than --data.prompt_max_len {self.cfg.data.prompt_max_len} "
                  "tokens")
        if loop.step == 0:
            self.checkpointer.consider_best(loop, self.evaluator(loop, 0))
        history = loop.train()
        final_eval = self.evaluator(loop, loop.step)
        self.checkpointer.consider_best(loop, final_eval)
        if self.cfg.fsdp.enable:  # gathered on rank 0, written to <output_dir>/final
            final = fsdp.save_full(loop.policy, loop.tokenizer, Path(self.cfg.ckpt.output_dir) / "final", self.dp[0])
            ema = fsdp.save_full_ema(loop.policy, loop.update.learner, loop.tokenizer,
                                     Path(self.cfg.ckpt.output_dir) / "ema", self.dp[0])
            for folder in (final, ema):
                V.save_processor(self.processor, folder, self.dp[0])
        else:
            final = self.save(self.run_dir / "final")
            ema = loop.save_ema(self.run_dir / "ema")
            if ema is not None:
                print(f"EMA of the policy (--actor.ema_beta {self.cfg.actor.ema_beta}) saved to {ema}")
        self.tracker.close()
        if self.cfg.fsdp.enable:
            fsdp.finish()
        print(f"done in {time.perf_counter() - t0:.0f}s: {loop.step} steps; model saved to {final}")
        return {**(history[-1] if history else {}), **final_eval}

    def save(self, path: str | Path) -> Path:
        """The policy as an HF folder (safetensors + tokenizer, and a VLM's processor) at `path`."""
        folder = self.loop.save(path)
        V.save_processor(self.processor, folder)
        return folder


def _train_in_actor(cfg: RLConfig, plan: BatchPlan, kwargs: dict, rank: int = 0, world: int = 1,
                    address: tuple[str, int] | None = None) -> dict[str, float]:
    """A Ray trainer actor's whole run: rollout workers, build, train (the final model in <output_dir>/final).
    Under FSDP (--fsdp.num_ranks actors), rank `rank` of `world` joins the process group at rank 0's
    `address` first; rank 0 drives the rollout workers, the others follow (distributed.fsdp_ray)."""
    cfg = builder.resolve_autocast(cfg)  # before the rollout workers are made from it
    if not cfg.fsdp.enable:
        def pool(policy, tokenizer, images):  # `images`: a vision-language policy's vLLM image settings, or None
            return engines.build_pool(cfg, policy, tokenizer, images=images)

        return RLTrainer.build(cfg, plan, **kwargs, pool=pool).train()
    from rlhfkit.distributed import fsdp_ray

    fsdp_ray.init_group(rank, world, address or fsdp_ray.free_address())

    def engine(policy, tokenizer, images):  # the sharded policy's: rank 0 sends its gathered state to the workers
        if rank > 0:
            return fsdp_ray.FollowerEngine(policy)
        return engines.build_pool(cfg, policy, tokenizer, images=images, gathered=fsdp_ray.GatheredState(policy))

    trainer = RLTrainer.build(cfg, plan, **kwargs, pool=engine)
    trainer.evaluator.evaluate = fsdp_ray.on_rank0(trainer.evaluator.evaluate, rank)  # samples on the workers
    return trainer.train()


def _check_sendable(objects: dict) -> None:
    """A ConfigError naming the first of `objects` (reward_fn, tools, environment_factory, agent; a list item by
    item) that Ray cannot send to the trainer actor (it pickles them by value with cloudpickle: functions and
    classes of a script travel, what they hold or close over too; open clients, sockets and locks do not)."""
    if not objects:
        return
    from ray import cloudpickle

    flags = {"reward_fn": "--reward.remote_url FILE.py:NAME", "tools": "--agent.tools FILE:fn1,fn2",
             "environment_factory": "--agent.env FILE:Class", "agent": "--agent.func_path FILE"}
    for name, value in objects.items():
        for obj in value if isinstance(value, (list, tuple)) else [value]:
            try:
                cloudpickle.dumps(obj)
            except Exception as exc:  # noqa: BLE001 - whatever the object's pickling raises
                what = getattr(obj, "__qualname__", type(obj).__name__)
                raise ConfigError(f"--distributed.backend ray: {name}={what} cannot be sent to the trainer actor "
                                  f"({one_line(exc)}); give it as {flags[name]} (the actor loads it there)") from exc


class RayRLTrainer:
    """`RLTrainer.from_config` with --distributed.backend ray: `train()` runs the whole run in a trainer
    actor (rollout workers beside it) and returns its final metrics; `save(path)` copies `final/`."""

    def __init__(self, cfg: RLConfig, plan: BatchPlan, kwargs: dict):
        self.cfg, self.plan, self.kwargs, self.final = cfg, plan, kwargs, None

    def train(self) -> dict[str, float]:
        from rlhfkit.distributed.launch import (
            check_gpu_asks,
            cluster_gpus,
            gpu_shares,
            run_in_trainer_actors,
            start_ray,
        )

        # a bad output dir fails before Ray starts
        d, run_dir = self.cfg.distributed, run_folder.prepare_run_dir(self.cfg)
        ranks = self.cfg.fsdp.num_ranks if self.cfg.fsdp.enable else 1  # trainer actors
        started = start_ray(d.address, d.num_cpus or self.cfg.rollout.num_workers + ranks, run_dir / "ray")
        try:
            trainer_gpus, worker_gpus = gpu_shares(d.num_gpus_trainer, d.num_gpus_per_worker,
                                                   self.cfg.rollout.num_workers, cluster_gpus(d.address),
                                                   engines.worker_gpu_multiple(self.cfg), trainers=ranks)
            if d.address is None:  # this machine's GPUs: asks beyond them would leave the actors pending forever
                check_gpu_asks([(ranks, trainer_gpus, "trainer actor(s) (--distributed.num_gpus_trainer)"),
                                (self.cfg.rollout.num_workers, worker_gpus,
                                 "rollout worker(s) (--distributed.num_gpus_per_worker)")], cluster_gpus(None))
            cfg = dataclasses.replace(self.cfg, distributed=dataclasses.replace(
                d, num_gpus_trainer=trainer_gpus, num_gpus_per_worker=worker_gpus))  # the workers start in the actor
            metrics = run_in_trainer_actors(_train_in_actor, (cfg, self.plan, self.kwargs),
                                            self.cfg.train.num_threads, trainer_gpus, ranks,
                                            keep_freed=self.cfg.train.keep_freed_memory)
        finally:
            if started:
                import ray

                ray.shutdown()
        self.final = run_dir / "final"
        return metrics

    def save(self, path: str | Path) -> Path:
        if self.final is None:
            raise ConfigError("save() after train(): the Ray run writes its model in the trainer actor")
        shutil.copytree(self.final, path, dirs_exist_ok=True)
        return Path(path)


def no_task_reward(queries, prompts, labels, **kwargs) -> torch.Tensor:
    """The task reward of pure on-policy distillation: 0 for every sample (the teacher gives the rest)."""
    return torch.zeros(len(queries))


class OPDTrainer(RLTrainer):
    """On-policy distillation (`rlhfkit train opd`): an RLTrainer whose score stage adds the teacher's
    per-token reward (trainers.rl.opd.TeacherScorer) to the task reward; without a reward function or
    --reward.* the task reward is 0."""

    validate = staticmethod(validate_opd)  # train rl's checks and a teacher

    @classmethod
    def from_config(cls, cfg, reward_fn: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                    **kwargs) -> RLTrainer | RayRLTrainer:
        """`RLTrainer.from_config` for an OPDConfig (validated as one: a teacher is required)."""
        if not isinstance(cfg, OPDConfig):
            raise ConfigError(f"OPDTrainer.from_config needs an OPDConfig (OPDConfig.from_args(flags)), got "
                              f"{type(cfg).__name__}")
        if reward_fn is None and cfg.reward.remote_url is None and cfg.reward.model_name_or_path is None:
            reward_fn = no_task_reward
        return super().from_config(cfg, reward_fn, train_dataset, eval_dataset, **kwargs)
