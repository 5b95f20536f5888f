"""`rlhfkit serve-training --model NAME_OR_PATH [--lora.rank R | --full]`: Tinker's training API
for the official `tinker` SDK (`TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-...`)."""

from __future__ import annotations

import contextlib
import functools
import secrets
from pathlib import Path

from rlhfkit.config.parse import parse_config
from rlhfkit.config.serve_training import ServeTrainingConfig, validate_serve_training
from rlhfkit.models.loading import load_policy, resolve_model
from rlhfkit.models.memory import GiB, count_params, memory_estimate
from rlhfkit.models.precision import DTYPES, resolve_device
from rlhfkit.models.vision import (
    is_vision_config,
    is_vision_model,
    load_processor,
    vision_sizes,
)
from rlhfkit.serving.tinker.app import make_app
from rlhfkit.serving.tinker.host import ModelHost


def memory_lines(config: dict, dtype: str, full: bool) -> list[str]:
    """The plan-style estimate for one training client (a micro-batch of one 2048-token datum); a
    vision-language model's language model with the tower's and projector's parameters (its images'
    tokens count towards the datum's 2048, the tower's activations are left out)."""
    params = None
    if is_vision_config(config):
        sizes = vision_sizes(config)
        config, params = sizes["text"], sizes["total"]
    est = memory_estimate(config, param_dtype=dtype, compute_dtype=dtype, micro_batch_size=1, decode_batch=8,
                          prompt_len=1024, max_new_tokens=1024, with_ref=False, with_critic=False, params=params)
    if not full:  # LoRA: gradients and Adam moments of the adapters only (a few MB), not of the base
        est["peak"] -= est["gradients"] + est["optimizer"]
        est["gradients"] = est["optimizer"] = 0
    kind = "full" if full else "LoRA"
    total = params or count_params(config)
    lines = [f"parameters {total / 1e6:.1f}M ({dtype}); per {kind} client, one 2048-token datum:"]
    return lines + [f"  {k:<12} {est[k] / GiB:8.3f} GiB" for k in ("weights", "gradients", "optimizer",
                                                                       "activations", "kv_cache", "peak")]


def build_host(cfg: ServeTrainingConfig) -> ModelHost:
    """Load the base model and print its memory estimate (in a Ray host actor: on the actor's node)."""
    device = resolve_device(cfg.device, "--device")
    path, _ = resolve_model(cfg.model)
    model, tokenizer = load_policy(cfg.model, cfg.dtype)
    processor = load_processor(path) if is_vision_model(model) else None  # images in ModelInputs
    print("\n".join(memory_lines(model.config.to_dict(), cfg.dtype, cfg.full)), flush=True)
    return ModelHost(model.to(DTYPES[cfg.dtype]), tokenizer, cfg.model, cfg.output_dir, device, full=cfg.full,
                     default_rank=cfg.lora.rank, tokenizer_id=path, batch_tokens=cfg.max_batch_tokens,
                     processor=processor)


def run(argv: list[str]) -> int:
    cfg = parse_config(ServeTrainingConfig, argv)
    validate_serve_training(cfg)
    import uvicorn

    with model_host(cfg) as host:
        key = cfg.api_key or f"tml-{secrets.token_hex(16)}"
        kind = "full fine-tuning" if cfg.full else "LoRA"
        where = f"{host.device}, in a Ray actor" if cfg.distributed.backend == "ray" else str(host.device)
        print(f"serving {cfg.model} ({kind}, {where}) at http://{cfg.host}:{cfg.port}")
        print(f"clients: export TINKER_BASE_URL=http://{cfg.host}:{cfg.port} TINKER_API_KEY={key}", flush=True)
        uvicorn.run(make_app(host, key, cfg.max_request_bytes), host=cfg.host, port=cfg.port, log_level="warning")
    return 0


@contextlib.contextmanager
def model_host(cfg: ServeTrainingConfig):
    """The models' host: in this process, or (--distributed.backend ray) in a Ray actor, which this
    process's Ray (a local cluster it starts, or the one at --distributed.address) places."""
    if cfg.distributed.backend == "local":
        yield build_host(cfg)
        return
    import ray  # the ray extra, needed only here

    from rlhfkit.distributed.launch import check_gpu_asks, cluster_gpus, start_ray
    from rlhfkit.serving.tinker.remote import RemoteHost

    d = cfg.distributed
    started = start_ray(d.address, d.num_cpus or 1, Path(cfg.output_dir) / "ray")
    try:
        gpus = d.num_gpus if d.num_gpus is not None else (1.0 if cfg.device != "cpu" and cluster_gpus(d.address)
                                                          else 0.0)
        if d.address is None:  # this machine's GPUs: an ask beyond them would leave the host pending forever
            check_gpu_asks([(1, gpus, "model host (--distributed.num_gpus)")], cluster_gpus(None))
        host = RemoteHost(functools.partial(build_host, cfg), num_gpus=gpus, num_threads=d.num_threads)
        try:
            yield host
        finally:
            host.close()
    finally:
        if started:
            ray.shutdown()
