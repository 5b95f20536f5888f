"""The configuration of `rlhfkit serve-reward`: a reward file (--reward.remote_url FILE.py) or a trained
reward model (--reward.model_name_or_path RM_FOLDER) over HTTP. OpenRLHF's `serve_rm` flags are read
through `SERVE_RM_FLAGS` (config/openrlhf_serve.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlhfkit.config.checks import check_device, one_of, require
from rlhfkit.config.openrlhf_serve import SERVE_RM_FLAGS
from rlhfkit.config.parse import Alias, parse_config
from rlhfkit.config.ranges import check_ranges, validate_table
from rlhfkit.errors import ConfigError

PRM_AGGREGATES = ("min", "prod", "mean", "last")  # rewards.reward_model.STEP_AGGREGATES' rules
TEXT_REQUEST_BYTES = 8 << 20  # --max_request_bytes' default for text queries
IMAGE_REQUEST_BYTES = 64 << 20  # ... and for a reward model over images (base64 images come in the body)


@dataclass(frozen=True)
class ServedReward:
    """What is served: a reward file or a reward model (one of the two)."""

    remote_url: str | None = None
    """A Python file defining reward_func(queries, prompts, labels, **kwargs) (FILE.py:NAME names another
    function), or builtin:NAME."""
    model_name_or_path: str | None = None
    """A reward-model folder from `rlhfkit train rm` (a sequence-classification model, or a reward model over
    images) or a hub name: each query is scored at its last token; or a process reward model's from `rlhfkit
    train prm`: each step of the response is scored."""
    normalize_enable: bool = False
    """A reward model's answer is (score - mean) / std with the mean and std stored in its config (OpenRLHF's
    --normalize_reward); off: the raw score."""
    prm_aggregate: str = "min"
    """A process reward model (a folder of `rlhfkit train prm`): how its steps' P(good) make the one reward per
    query of "rewards" (its answer holds each step's too, in "step_rewards"): min (the weakest step), prod
    (every step good), mean or last (the final step's); a response without a step gets 0."""


@dataclass(frozen=True)
class ServedData:
    """How a reward model reads the queries."""

    max_len: int = 2048
    """Most tokens of a query (prompt + response) a reward model reads: a longer one is cut to its first
    max_len tokens (its last ones when the tokenizer truncates on the left), as OpenRLHF's server cuts
    them. A reward model over images reads whole samples (a cut could split an image's tokens)."""


@dataclass(frozen=True)
class ServeRewardConfig:
    """`rlhfkit serve-reward`: a reward file or a trained reward model over HTTP, at POST /get_reward with
    OpenRLHF's JSON (`pip install 'rlhfkit[serve]'`)."""

    reward: ServedReward = field(default_factory=ServedReward)
    data: ServedData = field(default_factory=ServedData)
    host: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 exposes the server to the network (set --auth_token then)."""
    port: int = 5000
    """TCP port to listen on."""
    auth_token: str | None = None
    """Require `Authorization: Bearer TOKEN` on every request."""
    max_request_bytes: int | None = None
    """Refuse request bodies larger than this (HTTP 413); none: 8 MiB, 64 MiB for a reward model over images
    (its requests carry the images)."""
    batch_size: int | None = None
    """A reward model: most queries per forward pass; none: all the queries it holds in one pass (a
    request's, with those of the requests that arrived while the last pass ran)."""
    batch_window_ms: float = 5.0
    """A reward model: how long a request that finds the model free waits for other requests to share its
    pass (milliseconds; 0: it runs at once)."""
    dtype: str = "float32"
    """A reward model's weights: float32, bfloat16 or float16."""
    device: str = "auto"
    """Where a reward model scores: cpu, cuda, cuda:N or auto (CUDA when available)."""

    ALIASES: ClassVar[dict[str, str | Alias]] = SERVE_RM_FLAGS

    @classmethod
    def from_args(cls, argv: list[str]) -> ServeRewardConfig:
        """The config of these flags (OpenRLHF's serve_rm names read too), validated."""
        cfg = parse_config(cls, argv, aliases=cls.ALIASES)
        validate_serve(cfg)
        return cfg


SERVE_RANGES = validate_table({"port": "[1, 65535]", "max_request_bytes": ">= 1", "data.max_len": ">= 1",
                               "batch_size": ">= 1", "batch_window_ms": "[0, 60000]"})


def validate_serve(cfg: ServeRewardConfig) -> None:
    check_ranges(cfg, SERVE_RANGES)
    r = cfg.reward
    if r.remote_url is not None and r.model_name_or_path is not None:
        raise ConfigError("serve-reward serves one reward: --reward.remote_url FILE.py or "
                          "--reward.model_name_or_path RM_FOLDER, not both")
    if r.remote_url is None and r.model_name_or_path is None:
        raise ConfigError("serve-reward needs --reward.remote_url FILE.py (a reward_func) or "
                          "--reward.model_name_or_path RM_FOLDER (a reward model from `rlhfkit train rm`)")
    require(not (r.normalize_enable and r.remote_url is not None),
            "--reward.normalize_enable normalises a reward model's score; a reward file's answer is served as it "
            "returns it: drop the flag")
    one_of("dtype", cfg.dtype, ("float32", "bfloat16", "float16"))
    one_of("reward.prm_aggregate", r.prm_aggregate, PRM_AGGREGATES)
    check_device("--device", cfg.device)
