"""`rlhfkit serve-reward --reward.remote_url FILE.py --port N`: a reward file over HTTP."""

from __future__ import annotations

from rlhfkit.api.builder import load_reward
from rlhfkit.config.parse import parse_config
from rlhfkit.config.serve import ServeRewardConfig, validate_serve
from rlhfkit.rewards.server import make_app


def run(argv: list[str]) -> int:
    cfg = parse_config(ServeRewardConfig, argv)
    validate_serve(cfg)
    import uvicorn

    app = make_app(load_reward(cfg.reward.remote_url), token=cfg.auth_token, max_request_bytes=cfg.max_request_bytes)
    print(f"serving {cfg.reward.remote_url} at http://{cfg.host}:{cfg.port}/get_reward")
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
    return 0
