"""`rlhfkit serve MODEL`: a plain OpenAI-compatible server of a model, to try a trained policy with any
OpenAI client (`openai`, an agent framework, curl).

  rlhfkit serve runs/agent/final --port 8000
  # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=THE_PRINTED_KEY)

Serves POST /v1/chat/completions (tools too), POST /v1/completions, GET /v1/models and GET /health
with the same engine and wire format as the training endpoint; requests' own temperature, top_p
and top_k are used. Safe by default: it binds 127.0.0.1 and needs the bearer key (random unless
--api_key is given); nothing is recorded. Ctrl-C stops it.

A vision-language model (a folder whose config has a vision_config) is served with its processor on
the vision engine: chat messages may hold image_url parts with data: URLs (at most --max_images
distinct images a request; http(s) URLs are refused, as the training endpoint refuses them), in
bodies of up to 16 MiB unless --max_request_bytes says otherwise.
"""

from __future__ import annotations

import secrets
import threading

from rlhfkit.config.parse import parse_config
from rlhfkit.config.serve_model import ServeModelConfig, validate_serve_model
from rlhfkit.models.loading import load_policy, resolve_model
from rlhfkit.models.precision import resolve_device
from rlhfkit.models.vision import is_vision_folder, load_processor
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.rollout.vision import VisionEngine


def run(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-"):
        argv = ["--model", argv[0], *argv[1:]]
    cfg = parse_config(ServeModelConfig, argv)
    validate_serve_model(cfg)
    device = resolve_device(cfg.device, "--device")
    policy, tokenizer = load_policy(cfg.model, cfg.dtype)
    policy.to(device)
    key = cfg.api_key or "sk-rlhfkit-" + secrets.token_urlsafe(24)
    with build_server(cfg, policy, tokenizer, key) as server:
        print(f"serving {cfg.model} at {server.base}/v1 (model name {cfg.model!r})")
        if cfg.api_key is None:
            print(f"api_key: {key}")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopped")
    return 0


def build_server(cfg: ServeModelConfig, policy, tokenizer, key: str):
    """The endpoint serving `policy` at /v1 for `key` (not started): a vision-language model's with its
    processor (image_url parts) on the vision engine, else the text engine's."""
    from rlhfkit.agents.endpoint import EndpointLimits, EndpointServer, Settings  # noqa: PLC0415 - the agents extra
    from rlhfkit.agents.endpoint.episodes import VISION_REQUEST_BYTES  # noqa: PLC0415
    from rlhfkit.agents.endpoint.wire import MAX_N  # noqa: PLC0415

    processor = served_processor(cfg.model)
    text_body = EndpointLimits.max_request_bytes
    body = cfg.max_request_bytes or (VISION_REQUEST_BYTES if processor is not None else text_body)
    limits = EndpointLimits(per_call=cfg.max_tokens, total=cfg.max_tokens * MAX_N, context=cfg.max_context,
                            max_request_bytes=body)  # each of a request's n replies may take max_tokens
    settings = Settings(SamplingParams(max_new_tokens=cfg.max_tokens), honor_sampling=True, model_name=cfg.model,
                        processor=processor, max_images=cfg.max_images, images_flag="--max_images")
    server = EndpointServer(tokenizer, settings, batch_window=0.005, serve_key=key, serve_limits=limits,
                            port=cfg.port, host=cfg.host)
    server.engine = (HFEngine if processor is None else VisionEngine)(policy, tokenizer)
    return server


def served_processor(model: str):
    """The processor of `model` when it is a vision-language model (its config has a vision_config), else None."""
    path, gguf = resolve_model(model)
    return load_processor(path) if gguf is None and is_vision_folder(path) else None
