"""Config -> generation engines: the `--rollout.engine` of the trainer's process (an HF engine sharing the
policy, or a vLLM engine pulling its weights) and the Ray pool of rollout workers (`--rollout.num_workers`),
with the settings vLLM runs under (its dtype, folder and GPU memory share)."""

from __future__ import annotations

import torch

from rlhfkit.config import RLConfig
from rlhfkit.config.rl import lora_targets
from rlhfkit.config.rl_checks import config_overrides
from rlhfkit.distributed import fsdp
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import resolve_model
from rlhfkit.models.lora import engine_state_fn, is_4bit
from rlhfkit.models.precision import DTYPES
from rlhfkit.rollout.hf import HFEngine, eos_ids


def build_engine(policy, tokenizer, cfg: RLConfig, state_fn=None, images: dict | None = None):
    """--rollout.engine hf: an HFEngine sharing the policy module (weight sync is a version bump,
    no copy). vllm: a VLLMEngine on the actor's HF folder that pulls `state_fn()` (default: the
    policy's state dict) at every weight sync; with LoRA the adapters merged into their layers under
    the base model's names (the first sync in full, later ones the adapted layers only), with QLoRA
    merged into the dequantized 4-bit base (models.lora.engine_state_fn), which is sent before the first
    rollout too (vLLM loads the folder's float weights, which a 4-bit base is not); `images`: a
    vision-language policy's VLLMEngine settings (api/vision.py)."""
    if cfg.rollout.engine == "vllm":
        engine = build_vllm_engine(policy, tokenizer, cfg, engine_state_fn(policy, state_fn), **(images or {}))
        if is_4bit(policy):
            engine.update_weights({}, engine.version)
        return engine
    amp = DTYPES[cfg.actor.autocast] if cfg.actor.autocast else None
    return HFEngine(policy, tokenizer, max_batch_size=cfg.rollout.max_batch_size, autocast_dtype=amp,
                    inference_mode=not cfg.fsdp.enable, compile_decode=cfg.rollout.compile_decode,
                    gather=fsdp.unsharded if cfg.fsdp.enable else None,
                    keep_turns=cfg.rollout.keep_kv_across_turns, record_experts=cfg.actor.routing_replay)


def build_vllm_engine(policy, tokenizer, cfg: RLConfig, state_fn, **images):
    from rlhfkit.rollout.vllm import VLLMEngine, colocated_memory, free_gpu_share, require_vllm

    require_vllm()
    v = cfg.vllm
    share, sleep = colocated_memory(v.gpu_memory_utilization, v.enable_sleep, torch.cuda.is_available(),
                                    free_gpu_share())
    return VLLMEngine(vllm_folder(cfg), eos_ids(policy, tokenizer), dtype=vllm_dtype(cfg),
                      seed=cfg.train.seed, gpu_memory_utilization=share,
                      enable_sleep=sleep, tensor_parallel_size=v.tensor_parallel_size,
                      state_fn=state_fn, auto_sleep=sleep, hf_overrides=config_overrides(cfg), **images)


def vllm_dtype(cfg: RLConfig) -> str:
    """The dtype vLLM samples in: the one the trainer's forward computes in, --actor.autocast, else bfloat16
    under FSDP's mixed precision (what --actor.dtype bfloat16 becomes under FSDP: float32 shards computing in
    bf16, `resolve_fsdp_dtype`), else --actor.dtype."""
    if cfg.actor.autocast:
        return cfg.actor.autocast
    return "bfloat16" if cfg.fsdp.enable and cfg.fsdp.mixed_precision else cfg.actor.dtype


def vllm_folder(cfg: RLConfig) -> str:
    """The actor's HF folder, which vLLM loads; a GGUF file is refused in one line."""
    path, gguf = resolve_model(cfg.actor.model_name_or_path)
    if gguf is not None:
        raise ConfigError(f"--rollout.engine vllm needs an HF model folder, not the GGUF file {gguf}; convert it "
                          "once (e.g. --actor.model_name_or_path smollm2 does) or use --rollout.engine hf")
    return path


def vllm_worker_settings(cfg: RLConfig, policy, tokenizer, gpus: float) -> dict:
    """The VLLMEngine keyword arguments of a Ray rollout worker holding `gpus` GPUs: unset
    --vllm.gpu_memory_utilization is vLLM's own default (0.9) where the engine has whole GPUs to itself,
    else the colocated share; sleep mode only when asked for (the engine's GPUs are not the trainer's)."""
    from rlhfkit.rollout.vllm import COLOCATED_MEMORY_SHARE, OWN_GPU_MEMORY_SHARE

    v = cfg.vllm
    own = OWN_GPU_MEMORY_SHARE if gpus >= 1 else COLOCATED_MEMORY_SHARE
    sleep = bool(v.enable_sleep)
    return {"eos_ids": eos_ids(policy, tokenizer), "dtype": vllm_dtype(cfg),
            "seed": cfg.train.seed, "enable_sleep": sleep, "auto_sleep": sleep,
            "gpu_memory_utilization": own if v.gpu_memory_utilization is None else v.gpu_memory_utilization,
            "tensor_parallel_size": v.tensor_parallel_size, "hf_overrides": config_overrides(cfg)}


def worker_gpu_multiple(cfg: RLConfig) -> int:
    """GPUs a rollout worker runs on, in units of one actor's share: a vLLM engine's tensor parallelism."""
    return cfg.vllm.tensor_parallel_size if cfg.rollout.engine == "vllm" else 1


def build_pool(cfg: RLConfig, policy, tokenizer=None, delays: dict[int, float] | None = None,
               images: dict | None = None, gathered=None):
    """--rollout.num_workers RolloutWorker actors behind a RayEnginePool (Ray must be running), each an
    HF engine over a policy copy or (--rollout.engine vllm, `tokenizer` needed) a vLLM engine sent the
    weights vLLM loads (`distributed.pool.engine_state`) and, with `images` (a vision-language policy's
    VLLMEngine settings, api/vision.py), the prompts' decoded images.
    `delays`: test-only slow-worker hook (slot -> seconds each weight update is held back).
    `gathered`: `full -> the policy's full state dict` where the policy is FSDP-sharded (rank 0 of the
    trainer actors: distributed.fsdp_ray.GatheredState); None: the policy's own state dict."""
    from rlhfkit.distributed.launch import cluster_gpus, gpu_shares, worker_factory
    from rlhfkit.distributed.pool import RayEnginePool, engine_state, policy_state

    path, gguf = resolve_model(cfg.actor.model_name_or_path)
    t, d = cfg.train, cfg.distributed
    worker_gpus = gpu_shares(d.num_gpus_trainer, d.num_gpus_per_worker, cfg.rollout.num_workers,
                             0 if d.num_gpus_per_worker is not None else cluster_gpus(d.address),
                             worker_gpu_multiple(cfg))[1]
    vllm = cfg.rollout.engine == "vllm"
    lora = cfg.ds.lora
    make = worker_factory(vllm_folder(cfg) if vllm else path, gguf, cfg.actor.dtype, cfg.actor.autocast,
                          cfg.rollout.max_batch_size, worker_gpus, delays,
                          t.partial_rollout_tokens if t.partial_rollout_enable else 0,
                          (lora.rank, lora.alpha, lora_targets(lora), lora.dropout) if lora.rank > 0 else None,
                          record_experts=cfg.actor.routing_replay, frozen_tower=cfg.actor.freeze_visual_encoder,
                          load_in_4bit=cfg.ds.load_in_4bit,
                          vllm={**vllm_worker_settings(cfg, policy, tokenizer, worker_gpus), **(images or {})}
                          if vllm else None, keep_freed=t.keep_freed_memory)

    def state_fn(full: bool):
        state = gathered(full) if gathered is not None else None
        return engine_state(policy, full, state) if vllm else policy_state(policy, state)

    return RayEnginePool(policy, make, cfg.rollout.num_workers, wait_for_weights=not t.async_enable,
                         state_fn=state_fn, decoded_images=vllm)
