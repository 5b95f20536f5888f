"""`rlhfkit serve MODEL`: a plain OpenAI-compatible server of a model, to try a trained policy with any
OpenAI client (`openai`, an agent framework, curl).

  rlhfkit serve runs/agent/final --port 8000
  # then: openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=THE_PRINTED_KEY)

Serves POST /v1/chat/completions (tools too), POST /v1/completions, GET /v1/models and GET /health
with the same engine and wire format as the training endpoint; requests' own temperature, top_p
and top_k are used. Safe by default: it binds 127.0.0.1 and needs the bearer key (random unless
--api_key is given); nothing is recorded. Ctrl-C stops it.
"""

from __future__ import annotations

import secrets
import threading

from rlhfkit.config.parse import parse_config
from rlhfkit.config.serve_model import ServeModelConfig, validate_serve_model
from rlhfkit.models.loading import load_policy
from rlhfkit.models.precision import resolve_device
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine


def run(argv: list[str]) -> int:
    if argv and not argv[0].startswith("-"):
        argv = ["--model", argv[0], *argv[1:]]
    cfg = parse_config(ServeModelConfig, argv)
    validate_serve_model(cfg)
    from rlhfkit.agents.endpoint import EndpointLimits, EndpointServer, Settings  # noqa: PLC0415 - the agents extra

    device = resolve_device(cfg.device, "--device")
    policy, tokenizer = load_policy(cfg.model, cfg.dtype)
    policy.to(device)
    key = cfg.api_key or "sk-rlhfkit-" + secrets.token_urlsafe(24)
    limits = EndpointLimits(per_call=cfg.max_tokens, total=cfg.max_tokens, context=cfg.max_context,
                            max_request_bytes=cfg.max_request_bytes)
    settings = Settings(SamplingParams(max_new_tokens=cfg.max_tokens), honor_sampling=True, model_name=cfg.model)
    server = EndpointServer(tokenizer, settings, batch_window=0.005, serve_key=key, serve_limits=limits,
                            port=cfg.port, host=cfg.host)
    server.engine = HFEngine(policy, tokenizer)
    with server:
        print(f"serving {cfg.model} at {server.base}/v1 (model name {cfg.model!r})")
        if cfg.api_key is None:
            print(f"api_key: {key}")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopped")
    return 0
