"""Defaults that two config modules need: here so that neither imports the other
(config/openrlhf.py translates OpenRLHF's flags into config/rl.py's, which imports its flag table)."""

PROMPT_MAX_LEN = 1024  # --data.prompt_max_len (rl.DataConfig)
