"""Config -> components: the one place that reads an `RLConfig` and builds what the RL loop's stages
take as plain arguments, top-down: rewards, agents, models, engines, then one function per stage and
`build_loop`, which assembles them. The generation engines (hf, vLLM, a Ray pool of workers) are built in
`api/engines.py`; the run folder, loggers, checkpoints and evaluator in `api/run_folder.py`."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from pathlib import Path

import torch

from rlhfkit.agents import SingleTurnExecutor, load_agent_file
from rlhfkit.agents.executor import TokenBudget
from rlhfkit.agents.textenv import load_text_env
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.agents.tools.loader import load_tools
from rlhfkit.agents.tools.run import ToolLimits
from rlhfkit.config import RLConfig
from rlhfkit.config.checks import compute_dtype, fsdp_param_dtype
from rlhfkit.config.plan import RunPlan
from rlhfkit.config.rl import RewardConfig, lora_targets
from rlhfkit.config.rl_checks import config_overrides
from rlhfkit.core.advantages import ESTIMATORS, Whiten
from rlhfkit.core.kl import AdaptiveKLController, FixedKLController
from rlhfkit.data.records import as_source
from rlhfkit.distributed import fsdp
from rlhfkit.errors import ConfigError
from rlhfkit.models import Critic
from rlhfkit.models.compile import CompiledLayers
from rlhfkit.models.loading import (
    load_policy,
    load_teacher,
    position_limit,
    resolve_model,
    resolve_model_path,
)
from rlhfkit.models.lora import add_lora
from rlhfkit.models.precision import (
    choose_autocast,
    disable_dropout,
    emulated_bf16_warning,
    enable_gradient_checkpointing,
    float32_residual,
    model_device,
    resolve_device,
    vectors_to_float32,
)
from rlhfkit.models.reward import is_reward_model_folder, prm_settings
from rlhfkit.models.vision import is_vision_model, language_lora_targets
from rlhfkit.models.vision_reward import is_vision_reward_folder
from rlhfkit.rewards.remote import RemoteRewardFn
from rlhfkit.rewards.resolve import BUILTIN_REWARDS, resolve_reward
from rlhfkit.rewards.reward_model import (
    ProcessRewardFn,
    RewardModelFn,
    VisionRewardModelFn,
    vocabulary_fingerprint,
)
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.trainers.learner import Learner, muon_settings
from rlhfkit.trainers.loss_scale import loss_scale_for
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.generate import Generate, RolloutSource
from rlhfkit.trainers.rl.loop import RLLoop
from rlhfkit.trainers.rl.opd import TeacherLossUpdate, TeacherScorer
from rlhfkit.trainers.rl.scoring import GroupFilter, Scorer
from rlhfkit.trainers.rl.stream import PromptStream
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate

_PKG = Path(__file__).resolve().parents[1]
BUILTIN_AGENTS = {"builtin:calculator": _PKG / "agents" / "envs" / "calculator.py",
                  "builtin:guess": _PKG / "agents" / "envs" / "guess.py"}

log = logging.getLogger("rlhfkit")


# ------------------------------------------------------------------ rewards, agents, models, engines
def load_reward(reward: RewardConfig | str | None, micro_batch_size: int = 8, device: torch.device | str = "cpu"):
    """A reward file, builtin:NAME, http(s) reward server URL(s), or a reward-model folder
    (--reward.model_name_or_path, scoring on `device`; with --reward.offload kept on the CPU between
    its passes; a reward model over images scores each sample with its prompt's images) -> a RewardFn.
    A local function must return within --reward.timeout seconds; a server request within
    --reward.request_timeout. A process reward model's folder gives a ProcessRewardFn (per-step token
    rewards where the run takes them, its weakest step's P(good) as one reward per sample elsewhere:
    trainers.rl.scoring.Scorer)."""
    r = reward if isinstance(reward, RewardConfig) else RewardConfig(remote_url=reward)
    url, model_path = r.remote_url, r.model_name_or_path
    if url is not None and model_path is not None:
        raise ConfigError("--reward.remote_url and --reward.model_name_or_path are both set; choose one")
    if model_path is not None and prm_settings(model_path) is not None:
        return ProcessRewardFn(model_path, micro_batch_size=micro_batch_size, device=device, offload=r.offload)
    if model_path is not None:
        over_images = is_vision_reward_folder(resolve_model_path(model_path))  # models/vision_reward.py
        fn = VisionRewardModelFn if over_images else RewardModelFn
        return fn(model_path, micro_batch_size=micro_batch_size, device=device, offload=r.offload)
    if url is None:
        raise ConfigError("no reward: pass --reward.remote_url FILE.py (a reward_func), builtin:math, "
                          "http://HOST:PORT/get_reward, --reward.model_name_or_path RM_FOLDER, "
                          "or an agent with --agent.func_path")
    return resolve_reward(url, timeout=r.timeout, remote_options=remote_options(r),
                          code_options=dataclasses.asdict(r.code),
                          reasoning_gym_options=dataclasses.asdict(r.reasoning_gym))


def remote_options(r: RewardConfig) -> dict:
    """RemoteRewardFn's settings from --reward.*."""
    return dict(timeout=r.request_timeout, max_retries=r.max_retries, batch_size=r.request_batch_size,
                token=r.auth_token)


def endpoint_options(cfg: RLConfig) -> dict:
    """EndpointExecutor's settings from --agent.*, --data.prompt_max_len and the response budget."""
    g = cfg.agent
    total = token_budget(cfg, multi_turn=True).total
    return dict(timeout=g.timeout, max_calls=g.max_calls, tool_parser=g.tool_parser,
                max_context=cfg.data.prompt_max_len + total)


def agent_takes_reward_fn(executor, cfg: RLConfig) -> bool:
    """Whether an agent-function executor gets the run's reward function (--reward.* is set): it scores
    the episodes whose function returns None."""
    r = cfg.reward
    return hasattr(executor, "fallback_reward_fn") and (r.remote_url is not None or r.model_name_or_path is not None)


def build_executor(cfg: RLConfig, tools=None, environment_factory=None, agent=None):
    """The agent of --agent.func_path (a file, builtin:NAME or verifiers:ENV_ID) or `agent` (an agent function
    for the OpenAI-compatible endpoint, a verifiers Environment, or an executor object with `run`); tool-calling
    episodes with `tools` (functions), --agent.tools or an `environment_factory` class; else single-turn generation."""
    g = cfg.agent
    path = g.func_path
    tool_episodes = tools is not None or g.tools is not None or environment_factory is not None or g.env is not None
    if g.on_rerender != "keep" and (agent is not None or not tool_episodes):
        raise ConfigError(f"--agent.on_rerender {g.on_rerender} applies to tool-calling and text-environment episodes "
                          "(--agent.tools, --agent.env, tools=, environment_factory=); an agent file or function "
                          "drives its own turns: drop the flag")
    if agent is not None:
        if path is not None or tools is not None or g.tools is not None or environment_factory is not None \
                or g.env is not None:
            raise ConfigError("agent= and --agent.func_path / tools are both set; choose one")
        if callable(getattr(agent, "run", None)):
            return agent
        from rlhfkit.agents.endpoint import verifiers_env  # noqa: PLC0415 - the serve extra
        from rlhfkit.agents.endpoint.runner import EndpointExecutor  # noqa: PLC0415 - the serve extra

        if verifiers_env.is_verifiers_env(agent):
            return verifiers_env.VerifiersExecutor(agent, **endpoint_options(cfg))
        return EndpointExecutor(agent, source=getattr(agent, "__qualname__", "agent"), **endpoint_options(cfg))
    if tool_episodes:
        if path is not None:
            raise ConfigError("--agent.func_path and tools or an environment (--agent.tools, --agent.env, tools=, "
                              "environment_factory=) are both set; an agent file drives its own episodes: choose one")
        if g.env is not None and environment_factory is not None:
            raise ConfigError("--agent.env and environment_factory= are both set; choose one")
        limits = ToolLimits(g.tool_calls_per_episode, g.tool_timeout, g.tool_result_tokens)
        fns = list(tools) if tools is not None else load_tools(g.tools) if g.tools is not None else []
        env = load_text_env(g.env) if g.env is not None else environment_factory
        # async runs hide tool latency behind the other episodes' generation (agents.tools.overlap)
        return ToolExecutor(fns, limits, g.tool_parser, environment_factory=env, on_rerender=g.on_rerender,
                            overlap=cfg.train.async_enable)
    if path is None:
        return SingleTurnExecutor()
    if path.startswith("verifiers:"):
        from rlhfkit.agents.endpoint import verifiers_env  # noqa: PLC0415 - the serve and verifiers extras

        return verifiers_env.VerifiersExecutor(verifiers_env.load_verifiers_env(path), **endpoint_options(cfg))
    return load_agent_file(BUILTIN_AGENTS.get(path, path), endpoint=endpoint_options(cfg))


def run_device(cfg: RLConfig) -> torch.device:
    """--actor.device as a torch.device (auto: CUDA when available); a ConfigError for a CUDA device
    that is not there, raised before any model loads."""
    return resolve_device(cfg.actor.device, "--actor.device")


def resolve_autocast(cfg: RLConfig) -> RLConfig:
    """`cfg` with --actor.autocast auto replaced by the choice for --actor.device (a bf16 probe on the
    CPU; native bf16 on CUDA), printed in one line; any other value as it is. Computing in bf16 (the autocast
    or --actor.dtype) on a GPU that only emulates it is warned of in one line."""
    device = run_device(cfg)
    if cfg.actor.autocast == "auto":
        choice, line = choose_autocast(device, fsdp=cfg.fsdp.enable)
        print(line)
        cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, autocast=choice))
    if warning := emulated_bf16_warning(device, cfg.actor.dtype, cfg.actor.autocast):
        log.warning(warning)
    return cfg


def resolve_fsdp_dtype(cfg: RLConfig) -> RLConfig:
    """Under --fsdp.enable, --actor.dtype bfloat16 or float16 (16-bit parameters, float32 masters) becomes FSDP2's
    form of it: float32 sharded parameters (the masters) with --fsdp.mixed_precision (16-bit compute, float32
    gradient reduction); float16 computes under --actor.autocast float16, so its loss is scaled as in one process
    (trainers.loss_scale). Printed in one line (by rank 0); any other config as it is."""
    if not cfg.fsdp.enable or cfg.actor.dtype == "float32":
        return cfg
    fp16 = cfg.actor.dtype == "float16"
    if os.environ.get("RANK", "0") == "0":
        print(fsdp.FP16_PARAMS if fp16 else fsdp.BF16_PARAMS)
    actor = dataclasses.replace(cfg.actor, dtype="float32", autocast="float16" if fp16 else cfg.actor.autocast)
    return dataclasses.replace(cfg, actor=actor, fsdp=dataclasses.replace(cfg.fsdp, mixed_precision=True))


def build_models(cfg: RLConfig, device: torch.device | None = None):
    """Policy (with LoRA adapters when --ds.lora.rank > 0: a VLM's outside its vision tower with
    --actor.freeze_visual_encoder, models.vision.language_lora_targets), tokenizer, frozen reference (only if the KL
    coefficient > 0; with LoRA the policy itself, run with its adapters disabled) and critic (only for an
    estimator that needs one), on `device` (default: --actor.device); with --ref.offload the reference
    stays on the CPU (the experience stage moves it for its pass)."""
    device = run_device(cfg) if device is None else device
    torch.manual_seed(cfg.train.seed)
    overrides = config_overrides(cfg)
    policy, tokenizer = load_policy(cfg.actor.model_name_or_path, cfg.actor.dtype, cfg.ds.load_in_4bit, overrides)
    _bf16_matrices(policy, cfg)
    _no_dropout(policy, cfg)  # before LoRA: its adapters keep --ds.lora.dropout
    lora = cfg.ds.lora
    if lora.rank > 0:
        targets = lora_targets(lora)
        if is_vision_model(policy) and cfg.actor.freeze_visual_encoder:  # no adapters in the frozen tower
            targets = language_lora_targets(policy, targets)
        policy = add_lora(policy, lora.rank, lora.alpha, targets, lora.dropout)
    ref = None
    if cfg.algo.kl.init_coef > 0:
        if cfg.ref.model_name_or_path:
            ref, _ = load_policy(cfg.ref.model_name_or_path, cfg.actor.dtype, config_overrides=overrides)
            _bf16_matrices(ref, cfg)
        elif lora.rank > 0:
            ref = policy  # the base weights: the experience stage disables the adapters for its pass
        else:
            ref = copy.deepcopy(policy)
        if ref is not policy:
            ref.eval().requires_grad_(False)
    critic = None
    if ESTIMATORS[cfg.algo.advantage.estimator].needs_critic:
        path, _ = resolve_model(cfg.critic.model_name_or_path or cfg.actor.model_name_or_path)
        critic = Critic.from_reward_model(path) if is_reward_model_folder(path) else Critic.from_causal_lm(path)
        _no_dropout(critic, cfg)
    policy.to(device)
    if critic is not None:
        critic.to(device)
    if ref is not None and ref is not policy and not cfg.ref.offload:
        ref.to(device)
    if cfg.actor.gradient_checkpointing_enable:
        enable_gradient_checkpointing(policy)
    return policy, tokenizer, ref, critic


def _bf16_matrices(model: torch.nn.Module, cfg: RLConfig) -> None:
    """bf16 (or fp16) parameters under autocast of their dtype: the norms and biases back in float32 (they
    learn as under autocast over float32 parameters; models.precision.vectors_to_float32), the matrices stay
    16-bit, the residual stream float32 (models.precision.float32_residual)."""
    if cfg.actor.dtype in ("bfloat16", "float16") and cfg.actor.autocast == cfg.actor.dtype:
        vectors_to_float32(model)
        float32_residual(model)


def fit_to_positions(cfg, model: torch.nn.Module, field: str):
    """`cfg` with --data.FIELD (prompt_max_len: a prompt leaves room for one response token; max_len: a
    whole sample) lowered to what `model`'s learned position table holds (models.loading.position_limit:
    GPT-2, OPT), said in one line; `cfg` itself when it fits or the model has no such table."""
    limit = position_limit(model)
    if limit is None:
        return cfg
    fits, what = (limit - 1, "a prompt and at least one response token") if field == "prompt_max_len" else (
        limit, "a sample")
    if getattr(cfg.data, field) <= fits:
        return cfg
    print(f"--data.{field} {getattr(cfg.data, field)} lowered to {fits}: {type(model).__name__} has {limit} "
          f"learned positions for {what}")
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **{field: fits}))


def _no_dropout(model: torch.nn.Module, cfg: RLConfig) -> None:
    """--actor.disable_dropout: the model's dropout rates to 0 (models.precision.disable_dropout), said once."""
    if cfg.actor.disable_dropout and (n := disable_dropout(model)):
        print(f"{type(model).__name__}: {n} dropout rates set to 0 for training (--actor.disable_dropout false "
              "keeps them)")


def build_teacher(cfg: RLConfig, tokenizer, device: torch.device):
    """The frozen teacher of --algo.teacher_model_name_or_path (None without one), on `device`, or on
    the CPU with --algo.teacher_offload; refused when its tokenizer is not the policy's."""
    a = cfg.algo
    if a.teacher_model_name_or_path is None:
        return None
    teacher = load_teacher(a.teacher_model_name_or_path, cfg.actor.dtype, tokenizer)
    return teacher if a.teacher_offload else teacher.to(device)


def shard_for_fsdp(cfg: RLConfig, policy, ref, critic, world: int):
    """FSDP2-shard the policy, reference and critic across `world` torchrun processes; returns the vLLM
    engine's weight source (the full state, gathered part by part on every rank's GPU)."""
    fsdp.check_fsdp_settings(world, cfg.train.batch_size)
    precision = fsdp_param_dtype(cfg.fsdp.mixed_precision, cfg.actor.dtype, cfg.actor.autocast) or False
    for model in (policy, ref if ref is not policy else None):  # with LoRA the reference is the policy
        if model is not None:
            fsdp.shard_model(model, world, precision)
    if critic is not None:
        fsdp.shard_critic(critic, world, precision)
    return lambda: fsdp.StreamedState(policy)


# ------------------------------------------------------------------ the stages and the loop
def token_budget(cfg: RLConfig, multi_turn: bool) -> TokenBudget:
    r, g = cfg.rollout, cfg.agent
    if not multi_turn:
        return TokenBudget(r.max_new_tokens, r.max_new_tokens, 1)
    return TokenBudget(r.max_new_tokens, g.max_response_tokens or r.max_new_tokens * g.max_turns, g.max_turns)


def executor_budget(cfg: RLConfig, executor) -> TokenBudget:
    """The token budget of `executor`'s samples: an episode's (--agent.*) for agents, tools and
    environments (multi-turn, or giving their own rewards), else one response's."""
    return token_budget(cfg, executor.provides_rewards or getattr(executor, "multi_turn", False))


def sampling_params(cfg: RLConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          n=r.n_samples_per_prompt, stop_token_ids=tuple(r.stop_token_ids),
                          repetition_penalty=r.repetition_penalty)


def prompt_options(cfg: RLConfig, eval: bool = False) -> dict:
    """The keyword arguments of `load_prompts` / `check_prompts` besides the source and tokenizer:
    the --data.* keys and rendering, the split / config / data dir and max_samples of the training
    prompts (--data.*) or, with `eval`, of the eval prompts (--eval.*); shuffled with --train.seed."""
    d, e = cfg.data, cfg.eval
    where = (dict(split=e.split, config=e.dataset_config, data_dir=e.data_dir, max_samples=e.max_samples) if eval
             else dict(split=d.prompt_split, config=d.prompt_dataset_config, data_dir=d.prompt_data_dir,
                       max_samples=d.max_samples))
    return dict(input_key=d.input_key, label_key=d.label_key, apply_chat_template=d.apply_chat_template,
                input_template=d.input_template, shuffle_seed=cfg.train.seed, **where)


def label_reward(cfg: RLConfig, eval: bool = False) -> str | None:
    """The flag and value of the prompts' reward when it is a builtin that scores each response against its
    prompt's label (builtin:math, builtin:code), "--reward.remote_url builtin:math"; with `eval`, the eval
    prompts' (--eval.verifier, else the training reward). None for any other reward."""
    flag, reward = (("--eval.verifier", cfg.eval.verifier) if eval and cfg.eval.verifier
                    else ("--reward.remote_url", cfg.reward.remote_url))
    return f"{flag} {reward}" if reward in BUILTIN_REWARDS else None


def prompt_source(cfg: RLConfig, dataset=None):
    """The training prompts' source: `dataset` (None: --data.prompt_dataset), as a `Blend` when it is a
    comma-separated list of datasets (concatenated) or --data.prompt_probs is set (mixed with those
    probabilities, seeded by --train.seed; each dataset cut to --data.max_samples first), as OpenRLHF's
    blending_datasets reads --prompt_data with --prompt_data_probs. A bad --data.prompt_probs is a
    ConfigError here, before any model loads. A function of the tokenizer is returned as it is."""
    d = cfg.data
    dataset = d.prompt_dataset if dataset is None else dataset
    if dataset is None or callable(dataset):
        if d.prompt_probs is not None and dataset is not None:
            raise ConfigError("--data.prompt_probs mixes the datasets of --data.prompt_dataset (or a train_dataset "
                              "path); a prompt function cannot be mixed: drop --data.prompt_probs")
        return dataset
    return as_source(dataset, d.prompt_probs, cfg.train.seed, d.max_samples, "--data.prompt_probs")


def prompt_stream(cfg: RLConfig, prompts) -> PromptStream:
    """The prompts in training order, with the run's seeded shuffle and sampling generators."""
    t = cfg.train
    return PromptStream(prompts, cfg.rollout.batch_size, t.num_episodes, torch.Generator().manual_seed(t.seed + 1),
                        torch.Generator().manual_seed(t.seed))


def build_learners(cfg: RLConfig, policy, critic, counts: RunPlan) -> tuple[Learner, Learner | None]:
    """The policy's Learner (and the critic's, None without one) over the run's optimizer steps."""
    actor = cfg.actor
    schedule = dict(total_steps=counts.total_optimizer_steps, warmup_steps=counts.warmup_steps,
                    scheduler=actor.lr_scheduler, min_lr_ratio=actor.min_lr_ratio,
                    max_consecutive_skips=cfg.train.max_skipped_steps)
    scaling = cfg.train.loss_scale
    learner = Learner(policy, actor.adam.lr, actor.adam.betas, actor.adam.eps, actor.adam.weight_decay,
                      max_norm=actor.max_norm, ema_beta=actor.ema_beta, muon=muon_settings(actor.optim, actor.muon),
                      loss_scale=loss_scale_for(compute_dtype(actor.dtype, actor.autocast), scaling), **schedule)
    if critic is None:
        return learner, None
    c = cfg.critic.adam
    # the critic's parameters are float32, computing under --actor.autocast
    return learner, Learner(critic, c.lr, c.betas, c.eps, c.weight_decay, max_norm=cfg.critic.max_norm, name="critic",
                            muon=muon_settings(cfg.critic.optim, cfg.critic.muon),
                            loss_scale=loss_scale_for(compute_dtype("float32", actor.autocast), scaling), **schedule)


def build_batcher(cfg: RLConfig, tokenizer) -> MicroBatcher:
    train = cfg.train
    return MicroBatcher(tokenizer.pad_token_id, train.micro_batch_size,
                        train.max_tokens_per_micro_batch if train.dynamic_batch_enable else None,
                        train.shared_prefix_enable)


def decoupled_update(cfg: RLConfig) -> bool:
    """Decoupled PPO's proximal policy: asked for, or async (which always separates behaviour and proximal)."""
    return cfg.algo.advantage.decoupled_enable or cfg.train.async_enable


def build_experience(cfg: RLConfig, counts: RunPlan, policy, ref, critic, batcher: MicroBatcher) -> ExperienceMaker:
    adv, kl = cfg.algo.advantage, cfg.algo.kl
    return ExperienceMaker(
        policy, ref, critic, batcher, estimator=adv.estimator, gamma=adv.gamma, lam=adv.lambd,
        whiten=Whiten(adv.whiten), reward_clip=cfg.reward.clip_range, kl_estimator=kl.estimator,
        kl_in_reward=not kl.use_loss, multi_step=counts.optimizer_steps_per_rollout > 1,
        temperature=cfg.rollout.temperature or 1.0, autocast=cfg.actor.autocast, proximal=decoupled_update(cfg),
        ref_device=model_device(policy) if cfg.ref.offload else None,
        mask_truncated=cfg.actor.mask_truncated_completions, routing_replay=cfg.actor.routing_replay)


def loss_settings(cfg: RLConfig, max_len: int) -> LossSettings:
    """The policy and value losses' settings; `max_len`: the response token budget."""
    actor, adv, kl = cfg.actor, cfg.algo.advantage, cfg.algo.kl
    eps_low, eps_high = actor.eps_clip_low_high
    is_low, is_high = adv.is_correction_threshold
    return LossSettings(policy_loss=actor.policy_loss_type, eps_low=eps_low, eps_high=eps_high,
                        dual_clip=actor.dual_clip, sapo_temperatures=actor.sapo_temperatures,
                        clip_cov_ratio=actor.clip_cov_ratio, clip_cov_bounds=actor.clip_cov_bounds,
                        kl_cov_ratio=actor.kl_cov_ratio, kl_cov_coef=actor.kl_cov_coef, vespo_k=actor.vespo_k,
                        vespo_lambda=actor.vespo_lambda, agg=actor.loss_agg_mode,
                        entropy_coef=actor.entropy_coef, kl_loss=kl.use_loss, kl_estimator=kl.estimator,
                        value_clip=cfg.critic.value_clip, temperature=cfg.rollout.temperature or 1.0, max_len=max_len,
                        is_kind=adv.is_correction_type.replace("-", "_") if adv.is_correction_enable else None,
                        is_low=is_low, is_high=is_high, decoupled=decoupled_update(cfg),
                        aux_loss_coef=actor.aux_loss_coef)


def build_update(cfg: RLConfig, policy, learners: tuple[Learner, Learner | None], batcher: MicroBatcher,
                 losses: LossSettings, data: PromptStream, critic, teacher, dp: tuple[int, int]) -> PolicyUpdate:
    """The update stage; with a teacher and --algo.teacher_topk > 0, its top-k KL loss (TeacherLossUpdate)."""
    algo, train = cfg.algo, cfg.train
    common = dict(batch_size=train.batch_size, max_epochs=train.max_epochs, shuffle_gen=data.shuffle_gen,
                  autocast=cfg.actor.autocast, critic=critic, critic_learner=learners[1], dp=dp,
                  rank_max=fsdp.max_over_ranks if dp[1] > 1 else None,
                  compiled=CompiledLayers(policy) if train.compile_enable else None,
                  routing_replay=cfg.actor.routing_replay)
    if teacher is not None and algo.teacher_topk > 0:
        return TeacherLossUpdate(policy, learners[0], batcher, losses, teacher=teacher, teacher_coef=algo.teacher_coef,
                                 teacher_topk=algo.teacher_topk, teacher_offload=algo.teacher_offload, **common)
    return PolicyUpdate(policy, learners[0], batcher, losses, **common)


def build_scorer(cfg: RLConfig, reward_fn, tokenizer, max_len: int, teacher, policy,
                 env_weight: float | None = None) -> Scorer | TeacherScorer:
    """The score stage: `reward_fn` (None: the agent's rewards; with `env_weight`, plus that times the
    agent's), overlong shaping, the stop-properly penalty, normalisation; with a teacher, on-policy
    distillation's token rewards on top. A process reward model's per-step rewards (in-process or from a
    reward server) are token rewards where the advantage estimator takes them; an estimator with a group
    baseline takes one reward per sample: the weakest step's (the server's aggregate)."""
    reward, algo = cfg.reward, cfg.algo
    overlong = None if reward.overlong_buffer_len is None else (reward.overlong_buffer_len,
                                                                 reward.overlong_penalty_factor)
    # a process reward model (in-process, or over HTTP reading the policy's tokens) gives per-token rewards where
    # the estimator takes them
    step_rewards = not ESTIMATORS[algo.advantage.estimator].grouped
    if step_rewards and isinstance(reward_fn, RemoteRewardFn):
        reward_fn = reward_fn.with_vocab(vocabulary_fingerprint(tokenizer))
    if not step_rewards and isinstance(reward_fn, ProcessRewardFn):
        print(f"--reward.model_name_or_path: --algo.advantage.estimator {algo.advantage.estimator} takes one reward "
              "per sample: the process reward model's weakest step (its P(good)) is each sample's reward", flush=True)
    scorer = Scorer(reward_fn, tokenizer, max_len, overlong, reward.normalize, env_weight=env_weight,
                    stop_coef=reward.stop_properly_penalty_coef, step_rewards=step_rewards)
    if teacher is None:
        return scorer
    return TeacherScorer(scorer, teacher, coef=algo.teacher_coef, topk=algo.teacher_topk,
                         kl_estimator=algo.teacher_kl_estimator, temperature=cfg.rollout.temperature or 1.0,
                         micro_batch_size=cfg.train.micro_batch_size, pad_id=tokenizer.pad_token_id,
                         autocast=cfg.actor.autocast, device=model_device(policy), offload=algo.teacher_offload)


def kl_controller(cfg: RLConfig) -> AdaptiveKLController | FixedKLController:
    kl = cfg.algo.kl
    return AdaptiveKLController(kl.init_coef, kl.target, kl.horizon) if kl.target is not None else FixedKLController(
        kl.init_coef)


def build_source(cfg: RLConfig, executor, engine, tokenizer, budget: TokenBudget,
                 dp: tuple[int, int] = (0, 1)) -> RolloutSource:
    """The rollout source: the executor on the engine; with --train.async_enable, one batch ahead (Prefetch).
    FSDP on Ray (`dp`: rank, world size): rank 0's source broadcasts its trajectories to the other ranks,
    which generate nothing (distributed.fsdp_ray)."""
    shared = cfg.fsdp.enable and cfg.distributed.backend == "ray"
    if shared and dp[0] > 0:
        from rlhfkit.distributed.fsdp_ray import ReceivedRollouts

        return ReceivedRollouts()
    params = sampling_params(cfg)
    if cfg.train.async_enable:
        from rlhfkit.distributed.async_loop import Prefetch  # Ray: only for async runs

        source = Prefetch(executor, engine, tokenizer, params, budget, cfg.train.max_staleness)
    else:
        source = Generate(executor, engine, tokenizer, params, budget)
    if shared:
        from rlhfkit.distributed.fsdp_ray import BroadcastRollouts

        return BroadcastRollouts(source)
    return source


def build_loop(cfg: RLConfig, counts: RunPlan, policy, tokenizer, engine, reward_fn, data: PromptStream, executor,
               *, ref=None, critic=None, teacher=None, tracker=None, callbacks=(),
               dp: tuple[int, int] = (0, 1)) -> RLLoop:
    """The RL loop's stages from `cfg`, around already built models, engine, reward and prompt stream
    (the update's epochs shuffle with the stream's generator, as one seeded order of draws); `counts`:
    the run's step counts (`config.plan.plan_run` on the stream's prompts); `teacher`: on-policy
    distillation's (trainers.rl.opd), None without one."""
    budget = executor_budget(cfg, executor)
    learners = build_learners(cfg, policy, critic, counts)
    batcher = build_batcher(cfg, tokenizer)
    experience = build_experience(cfg, counts, policy, ref, critic, batcher)
    update = build_update(cfg, policy, learners, batcher, loss_settings(cfg, budget.total), data, critic, teacher, dp)
    own, weight = executor.provides_rewards, cfg.agent.env_reward_weight  # the environment's rewards (weighted)
    scorer = build_scorer(cfg, reward_fn if not own or weight is not None else None, tokenizer, budget.total, teacher,
                          policy, env_weight=weight if own else None)
    algo = cfg.algo
    group_filter = GroupFilter(algo.dynamic_filtering_enable, algo.dynamic_filtering_range,
                               algo.dynamic_filtering_max_rounds)
    source = build_source(cfg, executor, engine, tokenizer, budget, dp)
    return RLLoop(data, source, engine, scorer, group_filter, experience, update, kl_controller(cfg),
                  total_steps=counts.total_rollouts, max_staleness=cfg.train.max_staleness, tokenizer=tokenizer,
                  tracker=tracker, log_samples=cfg.logger.log_samples, callbacks=callbacks,
                  actor_freezing_steps=cfg.actor.freezing_steps)
