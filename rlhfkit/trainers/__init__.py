"""The loops: rl/ (the RL loop and its stages), supervised/ (SFT, RM, DPO, KTO, PRM, KD); learner, checkpoints.
May import core, config (not rl/), data, models, rollout, rewards, agents (docs/architecture.md)."""
