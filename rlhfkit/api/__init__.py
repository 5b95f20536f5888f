"""The public Python API: configs from the CLI's flags, trainers built from them.

    import rlhfkit
    cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", path, ...])
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=my_reward, train_dataset=rows)
    metrics = trainer.train()
    trainer.save("out/final")

The supervised stages follow the same pattern (`SFTConfig` / `SFTTrainer`, `RMConfig` / `RMTrainer`,
`DPOConfig` / `DPOTrainer`, `KTOConfig` / `KTOTrainer`, `PRMConfig` / `PRMTrainer`).
"""

from rlhfkit.api.rl import RLTrainer
from rlhfkit.api.supervised import DPOTrainer, KTOTrainer, PRMTrainer, RMTrainer, SFTTrainer

__all__ = ["DPOTrainer", "KTOTrainer", "PRMTrainer", "RLTrainer", "RMTrainer", "SFTTrainer"]
