"""`rlhfkit serve-reward`: a reward file or a trained reward model over HTTP (OpenRLHF's /get_reward).

  rlhfkit serve-reward --reward.remote_url my_reward.py --port 5000
  rlhfkit serve-reward --reward.model_name_or_path runs/rm/final --reward.normalize_enable --port 5000
  # then: rlhfkit train rl ... --reward.remote_url http://127.0.0.1:5000/get_reward

A reward model (a folder of `rlhfkit train rm`: a sequence-classification model, or a reward model over
images) scores each query as `train rl --reward.model_name_or_path` scores it in-process (its own
tokenizer, the score at the last token), each query cut to --data.max_len tokens; with
--reward.normalize_enable the answer is (score - mean) / std from its config, else the raw score.
Requests that arrive together share its forward passes (--batch_size queries each). OpenRLHF's
serve_rm flags (--reward_pretrain, --normalize_reward, --max_len, --bf16, ...) are read too.

A process reward model (a folder of `rlhfkit train prm`) scores each step of each response as `train rl`
scores it in-process: it answers "step_rewards" (one P(good) per step) and "step_ends" (where each step
ends in the response's tokens) beside "rewards", their --reward.prm_aggregate (min: the weakest step), so a
client that reads only "rewards" gets one score per query; `train rl --reward.remote_url` sends the
policy's token ids and puts each step's score on the token where it ends (rewards/server.py).
"""

from __future__ import annotations

import torch

from rlhfkit.api.builder import load_reward
from rlhfkit.config.serve import IMAGE_REQUEST_BYTES, TEXT_REQUEST_BYTES, ServeRewardConfig
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import resolve_model_path
from rlhfkit.models.precision import resolve_device
from rlhfkit.models.reward import load_reward_model, prm_settings
from rlhfkit.models.vision_reward import is_vision_reward_folder
from rlhfkit.rewards.reward_model import (
    ProcessRewardFn,
    RewardModelFn,
    VisionRewardModelFn,
    vocabulary_fingerprint,
)
from rlhfkit.rewards.server import PooledReward, TokenVocabulary, make_app


def run(argv: list[str]) -> int:
    cfg = ServeRewardConfig.from_args(argv)
    import uvicorn

    app, what = build_app(cfg)
    print(f"serving {what} at http://{cfg.host}:{cfg.port}/get_reward")
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
    return 0


def build_app(cfg: ServeRewardConfig):
    """(the FastAPI app of `cfg`, what it serves in words): a reward file called once per request, or a
    reward model whose concurrent requests share passes."""
    r = cfg.reward
    if r.model_name_or_path is None:
        body = cfg.max_request_bytes or TEXT_REQUEST_BYTES
        return make_app(load_reward(r.remote_url), token=cfg.auth_token, max_request_bytes=body), r.remote_url
    fn = served_reward_model(cfg)
    images = isinstance(fn, VisionRewardModelFn)
    body = cfg.max_request_bytes or (IMAGE_REQUEST_BYTES if images else TEXT_REQUEST_BYTES)
    pooled = PooledReward(fn, cfg.batch_window_ms / 1000)
    tokens = None
    if isinstance(fn, ProcessRewardFn):
        vocab = fn.tokenizer.get_vocab()
        tokens = TokenVocabulary(vocabulary_fingerprint(fn.tokenizer), max(vocab.values()) + 1)
    app = make_app(pooled, token=cfg.auth_token, max_request_bytes=body, read_images=images, tokens=tokens)
    if tokens is not None:
        return app, f"process reward model {r.model_name_or_path} (steps' P(good), rewards: {r.prm_aggregate})"
    kind = "reward model over images" if images else "reward model"
    return app, f"{kind} {r.model_name_or_path} ({'normalised' if r.normalize_enable else 'raw'} scores)"


def served_reward_model(cfg: ServeRewardConfig) -> RewardModelFn | VisionRewardModelFn | ProcessRewardFn:
    """The reward function of --reward.model_name_or_path in --dtype on --device."""
    path = cfg.reward.model_name_or_path
    device = resolve_device(cfg.device, "--device")
    if prm_settings(path) is not None:
        if cfg.reward.normalize_enable:
            raise ConfigError(f"--reward.normalize_enable: {path} is a process reward model, whose scores are "
                              "probabilities with no stored mean and std; drop the flag")
        return ProcessRewardFn(path, micro_batch_size=cfg.batch_size, device=device,
                               aggregate=cfg.reward.prm_aggregate, dtype=cfg.dtype)
    model = load_reward_model(path, getattr(torch, cfg.dtype))
    options = {"micro_batch_size": cfg.batch_size, "normalize": cfg.reward.normalize_enable, "device": device,
               "model": model}
    if is_vision_reward_folder(resolve_model_path(path)):
        return VisionRewardModelFn(path, **options)
    return RewardModelFn(path, max_len=cfg.data.max_len, **options)
