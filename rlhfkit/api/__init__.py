"""The public Python API: configs from the CLI's flags, trainers built from them.

    import rlhfkit
    cfg = rlhfkit.RLConfig.from_args(["--actor.model_name_or_path", path, ...])
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=my_reward, train_dataset=rows)
    metrics = trainer.train()
    trainer.save("out/final")

The supervised stages follow the same pattern (`SFTConfig` / `SFTTrainer`, `RMConfig` / `RMTrainer`,
`DPOConfig` / `DPOTrainer`, `KTOConfig` / `KTOTrainer`, `PRMConfig` / `PRMTrainer`, `KDConfig` /
`KDTrainer`); on-policy distillation is `OPDConfig` / `OPDTrainer`, an RL trainer.
"""

from rlhfkit.api.rl import OPDTrainer, RLTrainer
from rlhfkit.api.supervised import DPOTrainer, KDTrainer, KTOTrainer, PRMTrainer, RMTrainer, SFTTrainer

__all__ = ["DPOTrainer", "KDTrainer", "KTOTrainer", "OPDTrainer", "PRMTrainer", "RLTrainer", "RMTrainer",
           "SFTTrainer"]
