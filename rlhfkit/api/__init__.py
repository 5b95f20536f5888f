"""The Python API: RLTrainer, SFTTrainer, ... .from_config (where a config becomes components); workflows.
May import every package but cli (docs/architecture.md)."""

from rlhfkit.api.rl import OPDTrainer, RLTrainer
from rlhfkit.api.supervised import DPOTrainer, KDTrainer, KTOTrainer, PRMTrainer, RMTrainer, SFTTrainer

__all__ = ["DPOTrainer", "KDTrainer", "KTOTrainer", "OPDTrainer", "PRMTrainer", "RLTrainer", "RMTrainer",
           "SFTTrainer"]
