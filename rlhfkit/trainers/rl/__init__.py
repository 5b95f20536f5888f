"""The RL loop (loop.py) and its stages: stream, generate, scoring, experience, update, batching, sync, opd.
May import what trainers/ may, but never config: the stages take plain arguments."""
