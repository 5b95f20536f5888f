"""Typed errors. Each names the file, line or field at fault and says how to fix it.

The CLI prints `str(error)` on one line and exits non-zero (traceback only with --debug).
Any package may import this module.
"""


class RlhfkitError(Exception):
    """Base class of every error rlhfkit raises on purpose."""


class ConfigError(RlhfkitError):
    """A setting is missing, has the wrong type, or does not fit with another."""


class DataError(RlhfkitError):
    """A dataset file is missing, malformed or lacks a key."""


class ModelError(RlhfkitError):
    """A model folder or file cannot be found or loaded."""


class RewardError(RlhfkitError):
    """A reward function or server failed or returned something unusable."""


class CheckpointError(RlhfkitError):
    """A checkpoint cannot be written (e.g. a full disk) or read back (corrupt, incomplete, or from
    a run whose data does not match)."""


class TrainingError(RlhfkitError):
    """Training cannot go on (e.g. too many consecutive non-finite losses or gradients)."""
