"""rlhfkit: reinforcement learning for language models and agents.

The public API (imported on first use, so `import rlhfkit` stays cheap):
`RLConfig`, `RLTrainer`, the supervised stages' configs and trainers, and the sampling workflows
(`RSConfig` / `RejectionSampling`, `IterativeDPOConfig` / `IterativeDPO`; `GenerateConfig` with
`rlhfkit.api.workflows.generate`).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlhfkit")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0.0.0+unknown"

_LAZY = {
    "RLConfig": "rlhfkit.config.rl",
    "SFTConfig": "rlhfkit.config.sft",
    "RMConfig": "rlhfkit.config.preference",
    "DPOConfig": "rlhfkit.config.preference",
    "KTOConfig": "rlhfkit.config.preference",
    "PRMConfig": "rlhfkit.config.prm",
    "KDConfig": "rlhfkit.config.kd",
    "OPDConfig": "rlhfkit.config.opd",
    "RLTrainer": "rlhfkit.api.rl",
    "SFTTrainer": "rlhfkit.api.supervised",
    "RMTrainer": "rlhfkit.api.supervised",
    "DPOTrainer": "rlhfkit.api.supervised",
    "KTOTrainer": "rlhfkit.api.supervised",
    "PRMTrainer": "rlhfkit.api.supervised",
    "GenerateConfig": "rlhfkit.config.generate",
    "RSConfig": "rlhfkit.config.generate",
    "IterativeDPOConfig": "rlhfkit.config.generate",
    "RejectionSampling": "rlhfkit.api.workflows",
    "IterativeDPO": "rlhfkit.api.workflows",
    "KDTrainer": "rlhfkit.api.supervised",
    "OPDTrainer": "rlhfkit.api.rl",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
