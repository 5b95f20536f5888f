"""The RL loop (loop.py) and its stages: stream, generate, scoring, experience, update, batching, sync; opd.py for on-policy distillation.
May import core, data, models, rollout, rewards, agents and trainers' shared modules (learner, checkpoint); never config."""
