"""The supervised loops: the shared step loop (loop.py) and SFT, RM/DPO/KTO, PRM and KD on it.
May import core, data, models and trainers' shared modules (learner, checkpoint); they read their config sections as plain objects."""
