"""The sampling workflows of the public API: batch generation, rejection sampling (best-of-N) and
iterative DPO.

    cfg = GenerateConfig.from_args(["--actor.model_name_or_path", path, "--data.prompt_dataset", "p.jsonl"])
    path = generate(cfg)                      # <output_dir>/generations.jsonl

    cfg = RSConfig.from_args([... "--reward.remote_url", "reward.py", "--rs.sft_enable", "true"])
    rounds = RejectionSampling.from_config(cfg).run()      # <output_dir>/rs_dataset.jsonl, round_<k>/

    cfg = IterativeDPOConfig.from_args([... "--iterative.rounds", "2"])
    rounds = IterativeDPO.from_config(cfg).run()           # <output_dir>/round_<k>/final

Each samples with the rollout stage of `train rl` (api.engines.build_engine, trainers.rl.generate) on
prompts read as `train rl` reads them, with one sampling seed per prompt drawn from --train.seed: the
same flags give the same samples. The rounds of rejection sampling and iterative DPO follow OpenRLHF's
scripts (train_rejection_sampling_llama.sh, train_iterative_dpo.sh): each round takes the next
--rollout.batch_size prompts (their --iter slices), samples --rollout.n_samples_per_prompt responses
with the current policy, scores them, keeps the best (RS) or pairs the best with the worst (DPO), and
trains the next policy on them with `train sft` / `train dpo` (api.supervised); round k's run folder
is <output_dir>/round_<k>/ and its model round_<k>/final/ starts round k+1. Departure: OpenRLHF
overwrites one checkpoint folder; here every round's folder is kept.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlhfkit.agents.executor import episode_rows
from rlhfkit.api import builder, engines, run_folder
from rlhfkit.api.rl import load_examples_fn
from rlhfkit.api.supervised import DPOTrainer, SFTTrainer
from rlhfkit.config.generate import (
    GenerateConfig,
    IterativeDPOConfig,
    RSConfig,
    validate_generate,
    validate_iterative_dpo,
    validate_rs,
)
from rlhfkit.config.parse import to_dict
from rlhfkit.config.preference import DPOConfig, PolicyModelConfig, RefModelConfig
from rlhfkit.config.rl import BaseLoggerConfig
from rlhfkit.config.sft import (
    SFTConfig,
    SFTDataConfig,
    SFTModelConfig,
    SupervisedCkptConfig,
    SupervisedDataConfig,
)
from rlhfkit.data.prompts import tokenize_prompts
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models import load_tokenizer
from rlhfkit.models.host import apply_host_settings
from rlhfkit.models.loading import load_policy, resolve_model
from rlhfkit.rewards.resolve import resolve_reward
from rlhfkit.tracking.progress import set_log_level
from rlhfkit.trainers.evaluate import conversation_fields
from rlhfkit.trainers.rl.generate import Generate
from rlhfkit.trainers.rl.scoring import Scorer
from rlhfkit.trainers.rl.stream import PromptBatch, PromptStream

log = logging.getLogger("rlhfkit")
__all__ = ["IterativeDPO", "RejectionSampling", "above_threshold", "best_per_prompt", "best_worst_pairs", "generate"]


# ------------------------------------------------------------------ selection (pure)
def best_per_prompt(rewards: Sequence[float], group_ids: Sequence[int]) -> list[int]:
    """Indices of the highest-reward sample of each group (the first one on ties), in group order."""
    best: dict[int, int] = {}
    for i, (r, g) in enumerate(zip(rewards, group_ids)):
        if g not in best or r > rewards[best[g]]:
            best[g] = i
    return [best[g] for g in sorted(best)]


def above_threshold(rewards: Sequence[float], threshold: float) -> list[int]:
    """Indices of the samples whose reward is at least `threshold`."""
    return [i for i, r in enumerate(rewards) if r >= threshold]


def best_worst_pairs(rewards: Sequence[float], group_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(chosen, rejected) indices per group: its highest- and lowest-reward samples (the first ones on
    ties); a group whose samples all have the same reward gives no pair."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    pairs = []
    for g in sorted(members):
        idx = members[g]
        hi = max(idx, key=lambda i: (rewards[i], -i))
        lo = min(idx, key=lambda i: (rewards[i], i))
        if rewards[hi] > rewards[lo]:
            pairs.append((hi, lo))
    return pairs


# ------------------------------------------------------------------ sampling
def with_policy(cfg: GenerateConfig, path: str) -> GenerateConfig:
    """`cfg` with --actor.model_name_or_path `path` (the engine of a later round loads that folder)."""
    return dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, model_name_or_path=str(path)))


def load_prompt_items(cfg: GenerateConfig, tokenizer, dataset: Any = None) -> tuple[list[PromptItem], int]:
    """(PromptItems, prompts skipped as longer than --data.prompt_max_len) of `dataset` (None:
    --data.prompt_dataset), read as `train rl` reads its prompts."""
    source = builder.prompt_source(cfg, dataset)  # several datasets (--data.prompt_probs): one Blend
    if source is None:
        raise ConfigError("--data.prompt_dataset is required (a .jsonl/.json/.parquet file, a datasets folder or "
                          "a hub dataset name); from Python, pass train_dataset=")
    examples = load_examples_fn(cfg, source)(tokenizer)
    if cfg.csft.enable:  # conditional SFT: every prompt asks for the score (OpenRLHF's --enable_csft)
        examples = [dataclasses.replace(e, text=e.text + cfg.csft.prompt.strip() + " ") for e in examples]
    items, skipped = tokenize_prompts(examples, tokenizer, cfg.data.prompt_max_len, cfg.data.input_key)
    if skipped:
        log.warning("skipped %d prompts longer than --data.prompt_max_len %d tokens", skipped, cfg.data.prompt_max_len)
    return items, skipped


def prepare(cfg: GenerateConfig) -> tuple[torch.device, Path]:
    """Log level, threads, the device (a CUDA device that is not there fails here) and the run folder
    with config.json, before any model loads."""
    set_log_level(cfg.logger.log_level)
    apply_host_settings(cfg.train.num_threads, cfg.train.keep_freed_memory)
    device = builder.run_device(cfg)
    return device, run_folder.create_run_dir(Path(cfg.ckpt.output_dir), None, to_dict(cfg))


class Sampler:
    """The policy of --actor.model_name_or_path, its engine (--rollout.engine) and the generate stage of
    `train rl` with --rollout.* sampling settings. The hf engine generates with the policy on
    --actor.device; vllm loads the folder itself (the HF copy stays on the CPU)."""

    def __init__(self, cfg: GenerateConfig, device: torch.device):
        self.dtype = cfg.actor.dtype
        self.policy, self.tokenizer = load_policy(cfg.actor.model_name_or_path, self.dtype)
        self.policy.eval().requires_grad_(False)
        if cfg.rollout.engine == "hf":
            self.policy.to(device)
        self.engine = engines.build_engine(self.policy, self.tokenizer, cfg)
        executor = builder.build_executor(cfg)  # with --agent.*: tool or agent episodes (--agent.max_turns)
        self.agent_rewards = bool(getattr(executor, "provides_rewards", False))
        self.stage = Generate(executor, self.engine, self.tokenizer, builder.sampling_params(cfg),
                              builder.executor_budget(cfg, executor))

    def __call__(self, batch: PromptBatch) -> list[Trajectory]:
        """`batch.prompts[i]`'s samples carry group_id i, in prompt order."""
        return self.stage.generate(batch)

    def load_weights(self, path: str | Path, version: int) -> None:
        """Generate with the weights of the model folder `path` from now on (`version` stamps them)."""
        self.engine.update_weights(load_policy(str(path), self.dtype)[0].state_dict(), version)

    def close(self) -> None:
        """Free the model (between rounds)."""
        self.policy = self.engine = self.stage = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def sample_rows(tokenizer, prompts: Sequence[PromptItem], trajs: Sequence[Trajectory],
                agent_rewards: bool = False) -> list[dict]:
    """One generations.jsonl line per trajectory: prompt (the rendered prompt text), label, response
    (decoded without special tokens), response_ids, finish_reason, logprob_sum (the sum of the
    response tokens' log-probabilities under the policy at --rollout.temperature), group (the prompt's
    index in the batch); with --agent.tools / --agent.env / an agent also messages (the whole
    conversation: assistant turns with their tool_calls, the tool results, the environment's turns)
    and prompt_messages (how many of them are the prompt's); with `agent_rewards` (an agent or an
    environment that gives rewards) also reward and score. An episode in segments (an agent that
    rewrote its history, --agent.on_rerender segment) is one line: its last segment's, with
    `segments`, every segment's response in order."""
    texts = tokenizer.batch_decode([t.response_ids.tolist() for t in trajs], skip_special_tokens=True)
    rows = episode_rows(trajs)
    if rows is not None:
        parts: dict[int, list[str]] = collections.defaultdict(list)
        for text, k in zip(texts, rows[1]):
            parts[k].append(text)
        trajs, texts = [trajs[i] for i in rows[0]], [texts[i] for i in rows[0]]
    out = [{"prompt": prompts[t.group_id].text, "label": prompts[t.group_id].label, "response": text,
            "response_ids": t.response_ids.tolist(), "finish_reason": t.finish_reason,
            "logprob_sum": float(t.logprobs[t.loss_mask].double().sum()), "group": t.group_id,
            **conversation_fields(t.info), **(_agent_fields(t.info) if agent_rewards else {})}
           for t, text in zip(trajs, texts)]
    if rows is not None:
        for k, row in enumerate(out):
            if len(parts[k]) > 1:
                row["segments"] = parts[k]
    return out


def _agent_fields(info: dict) -> dict:
    """reward and score of an episode whose agent gave them; {} otherwise."""
    if "agent_reward" not in info:
        return {}
    return {"reward": float(info["agent_reward"]), "score": float(info["agent_score"])}


def write_jsonl(path: Path, rows: Sequence[dict], append: bool = False) -> Path:
    with path.open("a" if append else "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return path


def prompt_seeds(n: int, seed: int) -> list[int]:
    """One sampling seed per prompt, drawn from `seed`."""
    return torch.randint(0, 2**62, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def generate(cfg: GenerateConfig, train_dataset: Any = None) -> Path:
    """Sample --rollout.n_samples_per_prompt responses to every prompt of `train_dataset` (None:
    --data.prompt_dataset) and write them to <--ckpt.output_dir>/generations.jsonl (see `sample_rows`);
    returns that path. Prompts are generated --rollout.batch_size at a time."""
    cfg = builder.resolve_autocast(validate_generate(cfg))
    device, run_dir = prepare(cfg)
    sampler = Sampler(cfg, device)
    cfg = builder.fit_to_positions(cfg, sampler.policy, "prompt_max_len")
    prompts, _ = load_prompt_items(cfg, sampler.tokenizer, train_dataset)
    seeds = prompt_seeds(len(prompts), cfg.train.seed)
    out = write_jsonl(run_dir / "generations.jsonl", [])
    step = cfg.rollout.batch_size
    for start in range(0, len(prompts), step):
        batch = PromptBatch(prompts[start:start + step], seeds[start:start + step])
        rows = sample_rows(sampler.tokenizer, batch.prompts, sampler(batch), sampler.agent_rewards)
        for r in rows:
            r["group"] += start
        write_jsonl(out, rows, append=True)
    return out


# ------------------------------------------------------------------ rounds: sample, score, select, train
class SamplingRounds:
    """The loop shared by rejection sampling and iterative DPO: each round samples the next
    --rollout.batch_size prompts with the current policy, scores the samples, writes
    round_<k>/generations.jsonl (with a reward per line), `select`s training data from them and
    `train`s the next policy on it (None: the policy stays). `run()` returns one summary per round
    (also in <output_dir>/summary.json)."""

    def __init__(self, cfg: GenerateConfig, reward_fn, prompts: list[PromptItem], tokenizer, device: torch.device):
        self.cfg, self.reward_fn, self.tokenizer, self.device = cfg, reward_fn, tokenizer, device
        self.run_dir = Path(cfg.ckpt.output_dir)
        per_episode = max(len(prompts) // cfg.rollout.batch_size, 1)
        t = cfg.train
        self.stream = PromptStream(prompts, cfg.rollout.batch_size, math.ceil(self.rounds / per_episode),
                                   torch.Generator().manual_seed(t.seed + 1), torch.Generator().manual_seed(t.seed))
        self.scorer = Scorer(reward_fn, tokenizer, cfg.rollout.max_new_tokens)
        self.sampler: Sampler | None = None  # kept across rounds with the vllm engine

    @classmethod
    def from_config(cls, cfg, reward_fn: Any = None, train_dataset: Any = None):
        """Validate `cfg`, create the run folder, load the reward (`reward_fn`: a callable, a reward
        file, builtin:NAME or a URL, or a list of them; None: --reward.*) and the prompts
        (`train_dataset`, else --data.prompt_dataset). Models load round by round in `run`."""
        if not isinstance(cfg, cls.config_class):
            name = cls.config_class.__name__
            raise ConfigError(f"{cls.__name__}.from_config needs a {name} (e.g. {name}.from_args(flags)), "
                              f"got {type(cfg).__name__}")
        cfg = builder.resolve_autocast(cls.validate(cfg))
        device, _ = prepare(cfg)
        if reward_fn is not None:
            reward_fn = resolve_reward(reward_fn, timeout=cfg.reward.timeout,
                                       remote_options=builder.remote_options(cfg.reward))
        else:
            reward_fn = builder.load_reward(cfg.reward, cfg.train.micro_batch_size, device)
        path, gguf = resolve_model(cfg.actor.model_name_or_path)
        tokenizer = load_tokenizer(path, gguf_file=gguf)
        prompts, _ = load_prompt_items(cfg, tokenizer, train_dataset)
        return cls(cfg, reward_fn, prompts, tokenizer, device)

    def run(self) -> list[dict]:
        """Every round; one summary per round: samples, reward_mean, reward_best_mean, kept (samples or
        pairs), policy (the round's sampler) and model (the round's trained folder, None without training)."""
        policy, summaries = self.cfg.actor.model_name_or_path, []
        for k in range(1, self.rounds + 1):
            round_dir = self.run_dir / f"round_{k}"
            round_dir.mkdir(parents=True, exist_ok=True)
            rows = self.sample_and_score(k, policy, round_dir)
            data = self.select(rows, k)
            trained = self.train(k, round_dir, policy, data)
            summary = {"round": k, "policy": str(policy), **reward_stats(rows), "kept": len(data),
                       "model": None if trained is None else str(trained)}
            print(f"round {k}/{self.rounds}: {summary['samples']} samples, reward mean {summary['reward_mean']:.4g} "
                  f"(best per prompt {summary['reward_best_mean']:.4g}), {len(data)} kept"
                  + (f"; model saved to {trained}" if trained else ""))
            summaries.append(summary)
            (self.run_dir / "summary.json").write_text(json.dumps(summaries, indent=2))
            policy = trained or policy
        return summaries

    def sample_and_score(self, k: int, policy: str, round_dir: Path) -> list[dict]:
        """Generate round k's samples with `policy`, score them; round_<k>/generations.jsonl. The hf
        engine is built per round and freed before training; a vllm engine is built once and receives
        each round's weights (with --vllm.enable_sleep it frees its memory between rounds)."""
        batch = self.stream.take(self.cfg.rollout.batch_size)
        if self.sampler is None:
            self.sampler = Sampler(with_policy(self.cfg, policy), self.device)
        elif k > 1:
            self.sampler.load_weights(policy, version=k - 1)
        trajs = self.sampler(batch)
        if self.cfg.rollout.engine == "hf":
            self.sampler.close()
            self.sampler = None
        rewards = self.scorer(batch.prompts, trajs).rewards.tolist()
        rows = sample_rows(self.tokenizer, batch.prompts, trajs)
        for row, r in zip(rows, rewards):
            row["reward"] = r
        write_jsonl(round_dir / "generations.jsonl", rows)
        return rows

    @property
    def rounds(self) -> int:
        raise NotImplementedError

    def select(self, rows: list[dict], k: int) -> list[dict]:
        raise NotImplementedError

    def train(self, k: int, round_dir: Path, policy: str, data: list[dict]) -> Path | None:
        raise NotImplementedError

    def stage_model(self, policy: str) -> dict:
        """The --model.* of a training stage: the round's policy with the actor's dtypes and device."""
        a = self.cfg.actor
        return {"model_name_or_path": str(policy), "dtype": a.dtype, "autocast": a.autocast, "device": a.device}

    def stage_common(self, stage, round_dir: Path) -> dict:
        """The sections of `train sft|dpo` a stage's --sft.* / --dpo.* give, the round folder as run folder."""
        lg = self.cfg.logger
        return {"train": stage.train, "adam": stage.adam, "muon": stage.muon, "ds": stage.ds,
                "ckpt": SupervisedCkptConfig(output_dir=str(round_dir)),
                "logger": BaseLoggerConfig(progress_bar=lg.progress_bar, log_level=lg.log_level)}


def reward_stats(rows: Sequence[dict]) -> dict[str, float]:
    """samples, reward_mean (all samples), reward_best_mean (mean over prompts of the best sample)."""
    rewards = [r["reward"] for r in rows]
    best = [rewards[i] for i in best_per_prompt(rewards, [r["group"] for r in rows])]
    return {"samples": len(rows), "reward_mean": sum(rewards) / len(rewards), "reward_best_mean": sum(best) / len(best)}


class RejectionSampling(SamplingRounds):
    """Rejection sampling (Touvron et al. 2023, Llama 2 section 3.2.2; OpenRLHF's `rs` post-processor):
    keep the best sample of each prompt (or every sample with reward >= --rs.threshold), append them
    to <output_dir>/rs_dataset.jsonl (input, output, reward, round: `train sft`'s keys), and with
    --rs.sft_enable fine-tune the round's policy on them."""

    config_class, validate = RSConfig, staticmethod(validate_rs)

    @property
    def rounds(self) -> int:
        return self.cfg.rs.rounds

    def select(self, rows: list[dict], k: int) -> list[dict]:
        rewards, threshold = [r["reward"] for r in rows], self.cfg.rs.threshold
        idx = (best_per_prompt(rewards, [r["group"] for r in rows]) if threshold is None
               else above_threshold(rewards, threshold))
        kept = [{"input": rows[i]["prompt"], "output": rows[i]["response"], "reward": rows[i]["reward"], "round": k}
                for i in idx]
        write_jsonl(self.run_dir / "rs_dataset.jsonl", kept, append=k > 1)
        return kept

    def train(self, k: int, round_dir: Path, policy: str, data: list[dict]) -> Path | None:
        if not self.cfg.rs.sft_enable:
            return None
        if not data:
            raise DataError(f"round {k}: no sample has a reward >= --rs.threshold {self.cfg.rs.threshold}; "
                            "lower it (rewards are in round_<k>/generations.jsonl)")
        s = self.cfg.sft
        cfg = SFTConfig(model=SFTModelConfig(**self.stage_model(policy)),
                        data=SFTDataConfig(max_len=s.data.max_len), **self.stage_common(s, round_dir))
        trainer = SFTTrainer.from_config(cfg, train_dataset=data)
        trainer.train()
        return round_dir / "final"


class IterativeDPO(SamplingRounds):
    """Iterative (online) DPO (Xiong et al. 2024, arXiv:2312.11456; RLHFlow's Online-RLHF; OpenRLHF's
    `iter_dpo` post-processor): each round pairs the best (chosen) and the worst (rejected) sample of
    every prompt, skipping prompts whose samples tie, writes round_<k>/pairs.jsonl and runs DPO on
    them. The reference is the initial policy in every round (OpenRLHF's script), or with
    --iterative.ref round the round's starting policy."""

    config_class, validate = IterativeDPOConfig, staticmethod(validate_iterative_dpo)

    @property
    def rounds(self) -> int:
        return self.cfg.iterative.rounds

    def select(self, rows: list[dict], k: int) -> list[dict]:
        rewards = [r["reward"] for r in rows]
        pairs = [{"prompt": rows[c]["prompt"], "chosen": rows[c]["response"], "rejected": rows[r]["response"],
                  "chosen_reward": rewards[c], "rejected_reward": rewards[r]}
                 for c, r in best_worst_pairs(rewards, [r["group"] for r in rows])]
        write_jsonl(self.run_dir / f"round_{k}" / "pairs.jsonl", pairs)
        return pairs

    def train(self, k: int, round_dir: Path, policy: str, data: list[dict]) -> Path | None:
        if not data:
            raise DataError(f"round {k}: every prompt's samples have the same reward, so there is no preference "
                            "pair; raise --rollout.n_samples_per_prompt or --rollout.temperature")
        d, initial = self.cfg.dpo, self.cfg.actor.model_name_or_path
        ref = initial if self.cfg.iterative.ref == "initial" and str(policy) != str(initial) else None
        cfg = DPOConfig(model=PolicyModelConfig(**self.stage_model(policy), **dataclasses.asdict(d.model)),
                        ref=RefModelConfig(model_name_or_path=ref),
                        data=SupervisedDataConfig(max_len=d.data.max_len), **self.stage_common(d, round_dir))
        DPOTrainer.from_config(cfg, train_dataset=data).train()
        return round_dir / "final"

