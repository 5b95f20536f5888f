"""The supervised side: the shared step loop (loop.py) and SFT, RM / DPO / KTO, PRM and KD on it.
May import what trainers/ may; a loop reads its config's sections as plain attributes."""
