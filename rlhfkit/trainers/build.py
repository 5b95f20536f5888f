"""Turn a validated RLConfig into the components of an RLTrainer (models, engine, reward, data)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from rlhfkit.models.precision import DTYPES

from rlhfkit.agents import MultiTurnExecutor, SingleTurnExecutor, load_agent_file
from rlhfkit.config.rl import RewardConfig, RLConfig
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models import Critic, load_causal_lm, load_tokenizer, materialize_smollm2
from rlhfkit.rewards.guard import TimeLimitedReward
from rlhfkit.models.reward import is_reward_model_folder
from rlhfkit.rewards.loader import load_reward_file
from rlhfkit.rewards.remote import RemoteRewardFn, is_url
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.trainers.reward_model import RewardModelFn
from rlhfkit.trainers.rl import PromptItem

_PKG = Path(__file__).resolve().parents[1]
BUILTIN_REWARDS = {"builtin:math": _PKG / "rewards" / "builtin_math_reward.py"}
BUILTIN_AGENTS = {"builtin:calculator": _PKG / "agents" / "envs" / "calculator.py",
                  "builtin:guess": _PKG / "agents" / "envs" / "guess.py"}


def resolve_model(name_or_path: str) -> tuple[str, str | None]:
    """`smollm2` -> the cached HF folder (converted once); `x/y.gguf` -> (folder, file)."""
    if name_or_path == "smollm2":
        return str(materialize_smollm2()), None
    p = Path(name_or_path)
    if p.suffix == ".gguf":
        return str(p.parent), p.name
    return name_or_path, None


def load_policy(name_or_path: str, dtype: str):
    path, gguf = resolve_model(name_or_path)
    tokenizer = load_tokenizer(path, gguf_file=gguf)
    model = load_causal_lm(path, dtype=DTYPES[dtype], gguf_file=gguf)
    return model, tokenizer


def load_reward(reward: RewardConfig | str | None, micro_batch_size: int = 8):
    """A reward file, builtin:NAME, http(s) reward server URL(s), or a reward-model folder
    (--reward.model_name_or_path) -> a RewardFn. A local function must return within
    --reward.timeout seconds; a server request within --reward.request_timeout."""
    r = reward if isinstance(reward, RewardConfig) else RewardConfig(remote_url=reward)
    url, model_path = r.remote_url, r.model_name_or_path
    if url is not None and model_path is not None:
        raise ConfigError("--reward.remote_url and --reward.model_name_or_path are both set; choose one")
    if model_path is not None:
        return RewardModelFn(model_path, micro_batch_size=micro_batch_size)
    if url is None:
        raise ConfigError("no reward: pass --reward.remote_url FILE.py (a reward_func), builtin:math, "
                          "http://HOST:PORT/get_reward, --reward.model_name_or_path RM_FOLDER, "
                          "or an agent with --agent.func_path")
    if is_url(url):
        return RemoteRewardFn(url.split(","), timeout=r.request_timeout, max_retries=r.max_retries,
                              batch_size=r.request_batch_size, token=r.auth_token)
    return TimeLimitedReward(load_reward_file(BUILTIN_REWARDS.get(url, url)), r.timeout, url)


def build_executor(cfg: RLConfig) -> SingleTurnExecutor | MultiTurnExecutor:
    """The agent of --agent.func_path (a file or builtin:NAME), else single-turn generation."""
    path = cfg.agent.func_path
    if path is None:
        return SingleTurnExecutor()
    return load_agent_file(BUILTIN_AGENTS.get(path, path))


def tokenize_prompts(examples, tokenizer, max_len: int) -> tuple[list[PromptItem], int]:
    """Tokenize prompt texts once; prompts longer than `max_len` tokens are skipped and counted."""
    items, skipped = [], 0
    for ex in examples:
        ids = tokenizer(ex.text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_len:
            skipped += 1
            continue
        items.append(PromptItem(ex.text, ids, ex.label))
    if not items:
        raise DataError(f"every prompt is longer than --data.prompt_max_len {max_len} tokens; raise it")
    return items, skipped


def build_models(cfg: RLConfig):
    """Policy, tokenizer, frozen reference (only if the KL coefficient > 0) and critic (gae only)."""
    torch.manual_seed(cfg.train.seed)
    policy, tokenizer = load_policy(cfg.actor.model_name_or_path, cfg.actor.dtype)
    ref = None
    if cfg.algo.kl.init_coef > 0:
        if cfg.ref.model_name_or_path:
            ref, _ = load_policy(cfg.ref.model_name_or_path, cfg.actor.dtype)
        else:
            ref = copy.deepcopy(policy)
        ref.eval().requires_grad_(False)
    critic = None
    if cfg.algo.advantage.estimator == "gae":
        path, _ = resolve_model(cfg.critic.model_name_or_path or cfg.actor.model_name_or_path)
        critic = Critic.from_reward_model(path) if is_reward_model_folder(path) else Critic.from_causal_lm(path)
    return policy, tokenizer, ref, critic


def build_engine(policy, tokenizer, cfg: RLConfig, state_fn=None):
    """--rollout.engine hf: an HFEngine sharing the policy module (weight sync is a version bump,
    no copy). vllm: a VLLMEngine on the actor's HF folder that pulls `state_fn()` (default: the
    policy's state dict) at every weight sync."""
    if cfg.rollout.engine == "vllm":
        return build_vllm_engine(policy, tokenizer, cfg, state_fn or policy.state_dict)
    amp = DTYPES[cfg.actor.autocast] if cfg.actor.autocast else None
    return HFEngine(policy, tokenizer, max_batch_size=cfg.rollout.max_batch_size, autocast_dtype=amp,
                    inference_mode=not cfg.fsdp.enable)


def build_vllm_engine(policy, tokenizer, cfg: RLConfig, state_fn):
    from rlhfkit.rollout.hf import _eos_ids  # noqa: PLC0415
    from rlhfkit.rollout.vllm import VLLMEngine, require_vllm  # noqa: PLC0415

    require_vllm()
    path, gguf = resolve_model(cfg.actor.model_name_or_path)
    if gguf is not None:
        raise ConfigError(f"--rollout.engine vllm needs an HF model folder, not the GGUF file {gguf}; convert it "
                          "once (e.g. --actor.model_name_or_path smollm2 does) or use --rollout.engine hf")
    v = cfg.vllm
    return VLLMEngine(path, _eos_ids(policy, tokenizer), dtype=cfg.actor.autocast or cfg.actor.dtype,
                      seed=cfg.train.seed, gpu_memory_utilization=v.gpu_memory_utilization,
                      enable_sleep=v.enable_sleep, tensor_parallel_size=v.tensor_parallel_size,
                      state_fn=state_fn, auto_sleep=v.enable_sleep)

