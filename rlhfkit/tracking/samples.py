"""Completion logs: what the policy wrote at each step, one JSON line per sample.

`run_dir/samples.jsonl` gets `{"step": 3, "prompt": ..., "response": ..., "reward": 1.0, ...}`
for every sample passed to `log`; the fields are whatever the caller passes (typically prompt,
response, reward, advantage, length). Tensors and numpy values become numbers or lists, other
non-JSON values their `str`. Each step is flushed, so the file is readable during a run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

SAMPLES_FILE = "samples.jsonl"


def to_jsonable(value: Any) -> Any:
    """A JSON-ready copy of `value`: tensors/arrays -> numbers or lists, NaN/inf -> None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and numpy scalars
        if hasattr(value, "detach"):
            value = value.detach().cpu()
        return to_jsonable(value.tolist())
    return str(value)


class CompletionLogger:
    """Append the samples of each step to `run_dir/samples.jsonl` (created with its folder).

    Args:
      run_dir: the run folder.
      max_per_step: keep at most this many samples of a step (the first ones); None keeps all.
    """

    def __init__(
        self, run_dir: str | Path, max_per_step: int | None = None, filename: str = SAMPLES_FILE
    ) -> None:
        if max_per_step is not None and max_per_step < 0:
            raise ValueError(f"max_per_step must be >= 0 or None, got {max_per_step}")
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_per_step = max_per_step
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, samples: Sequence[Mapping[str, Any]]) -> int:
        """Write one line {"step": step, **sample} per sample; return how many were written."""
        if self.max_per_step is not None:
            samples = samples[: self.max_per_step]
        for i, sample in enumerate(samples):
            if not isinstance(sample, Mapping):
                raise TypeError(
                    f"sample {i} of step {step} is a {type(sample).__name__}, not a dict"
                )
            if "step" in sample:
                raise ValueError(f"sample {i} of step {step} has a 'step' field; it is reserved")
            row = {"step": int(step), **to_jsonable(dict(sample))}
            self._file.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        self._file.flush()
        return len(samples)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> CompletionLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
