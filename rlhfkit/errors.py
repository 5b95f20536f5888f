"""Typed errors. Each names the file, line or field at fault and says how to fix it.

The CLI prints `str(error)` on one line and exits non-zero (traceback only with --debug).
Any package may import this module. `one_line` and `os_error_fix` phrase what a library or the
filesystem raised, where rlhfkit turns it into one of these errors.
"""

import errno
import re


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


def one_line(exc: BaseException, limit: int = 300) -> str:
    """`exc` as one line for a message: an OSError's reason (`No space left on device`), else
    `Type: message` with the message's lines joined and cut at `limit` characters."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."



def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-blank line of `exc`'s message, cut at `limit` characters; "(no message)" when it has none
    or its `__str__` raises (a user's exception: an environment's, a tool's, a reward function's)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        text = ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "(no message)")[:limit]


_OS_FIXES = {
    errno.ENOSPC: "free disk space", errno.EDQUOT: "free disk space (the disk quota is used up)",
    errno.EACCES: "choose a place you may write to (or fix its permissions)",
    errno.EPERM: "choose a place you may write to (or fix its permissions)",
    errno.EROFS: "choose a place on a writable file system",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EEXIST: "a file is in the way: choose a folder path, or move the file",
    errno.EISDIR: "a folder is in the way: choose another path",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def os_error_fix(exc: BaseException, default: str = "check the path and the disk") -> str:
    """What a user can do about a filesystem error, by its errno (`default` for the others). Rust
    libraries (safetensors, tokenizers) raise their own types that only name it: `(os error 28)`."""
    code = getattr(exc, "errno", None)
    if code is None:
        found = re.search(r"\(os error (\d+)\)", str(exc))
        code = int(found.group(1)) if found else None
    return _OS_FIXES.get(code, default)
