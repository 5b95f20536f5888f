"""verl's reward-function contract, adapted to rlhfkit's batch call (`CallableRewardFn` uses it).

verl (`custom_reward_function.path=FILE custom_reward_function.name=compute_score`) scores one
sample at a time by keyword,

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | bool | dict

or, with its batch reward manager, the whole batch as lists (`data_sources`, `solution_strs`,
`ground_truths`, `extra_infos`) -> a list of those. A dict result holds the reward under "score";
its other numeric entries (e.g. "acc") are logged, its strings (e.g. the extracted "pred") are not.
Each argument comes from where verl's own reward managers take it:

  data_source   the record's "data_source" column (None without one)
  solution_str  the response text, special tokens skipped
  ground_truth  the label (--data.label_key); without one, the record's reward_model.ground_truth
  extra_info    the record's "extra_info" column (None without one)

A function is called with only the names it takes (all four if it has **kwargs). `async def`
works (the per-sample calls of a batch run concurrently). A `None` score means "does not apply"
(see `rlhfkit.rewards.callables`). Departure from verl: a sample with no ground truth at all is a
`RewardError` naming the flag, where verl raises a KeyError from inside its reward manager.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import gather_awaitables, is_scalar, response_texts

SAMPLE_NAMES = ("data_source", "solution_str", "ground_truth", "extra_info")
BATCH_NAMES = ("data_sources", "solution_strs", "ground_truths", "extra_infos")


def is_verl_function(names: list[str]) -> bool:
    """True when a function's parameter names are verl's (it takes solution_str or solution_strs)."""
    return "solution_str" in names or "solution_strs" in names


class VerlBatch:
    """An OpenRLHF-contract batch function around a verl `compute_score` (see the module docstring).

    Called as `(queries, prompts, labels, responses=..., records=...)`; returns a list of B scores
    (None where the function returned None), or {"rewards": [B], "extra_logs": {name: [B]}} when
    some result was a dict. (`CallableRewardFn` reads the function's `batched` / `grouped` marks.)
    """

    def __init__(self, func: Callable[..., Any], source: str) -> None:
        self.func, self.source = func, source
        params = inspect.signature(func).parameters.values()
        names = [p.name for p in params]
        self.batch = "solution_strs" in names
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        # (the parameter's name, the argument's per-sample name), for the arguments the function takes
        self.keys = [(b if self.batch else s, s) for s, b in zip(SAMPLE_NAMES, BATCH_NAMES)
                     if takes_all or (b if self.batch else s) in names]
        given = {name for name, _ in self.keys}
        unfilled = [p.name for p in params if p.name not in given and (
            p.kind is inspect.Parameter.POSITIONAL_ONLY
            or (p.default is p.empty and p.kind is not inspect.Parameter.VAR_POSITIONAL
                and p.kind is not inspect.Parameter.VAR_KEYWORD))]
        if unfilled:
            raise RewardError(
                f"reward function {source} (verl's contract) needs {', '.join(unfilled)}, which rlhfkit does not "
                f"pass (it passes {', '.join(BATCH_NAMES if self.batch else SAMPLE_NAMES)} by keyword); give "
                "it a default, e.g. with functools.partial")

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> Any:
        columns = self._columns(queries, prompts, labels, kwargs)
        names = [name for name, _ in self.keys]
        if self.batch:
            out = self.func(**dict(zip(names, columns)))
        else:
            out = [self.func(**dict(zip(names, row))) for row in zip(*columns)]
            if any(inspect.isawaitable(c) for c in out):
                out = gather_awaitables(out)
        if inspect.isawaitable(out):
            return self._finish(out, len(queries))
        return self._results(out, len(queries))

    async def _finish(self, pending: Any, n: int) -> Any:
        return self._results(await pending, n)

    def _columns(self, queries: list[str], prompts: list[str], labels: list[Any],
                 kwargs: dict[str, Any]) -> list[list[Any]]:
        """The arguments the function takes, each a list of B values, in the order of `self.keys`."""
        records = [r if isinstance(r, Mapping) else {} for r in (kwargs.get("records") or [None] * len(queries))]
        responses = response_texts(queries, prompts, kwargs.get("responses"))
        truths = [label if label is not None else _nested_truth(r) for label, r in zip(labels, records)]
        wanted = [sample for _, sample in self.keys]
        if "ground_truth" in wanted and any(t is None for t in truths):
            i = truths.index(None)
            raise RewardError(
                f"reward function {self.source} (verl's contract) has no ground_truth for sample {i}: its label "
                "is None and its record has no reward_model.ground_truth; set --data.label_key to the column "
                "holding the answer")
        every = {"data_source": [r.get("data_source") for r in records], "solution_str": responses,
                 "ground_truth": truths, "extra_info": [r.get("extra_info") for r in records]}
        return [every[sample] for sample in wanted]

    def _results(self, out: Any, n: int) -> Any:
        """verl's results as the list or dict that `normalize_reward_output` checks."""
        if not isinstance(out, (list, tuple)) or len(out) != n:
            what = f"{len(out)} results" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RewardError(f"reward function {self.source} (verl's batch contract) returned {what} for "
                              f"{n} samples; return a list of one score (or dict with 'score') per sample")
        scores: list[Any] = []
        logs: dict[str, list[float]] = {}
        for i, value in enumerate(out):
            if isinstance(value, Mapping):
                if "score" not in value:
                    raise RewardError(f"reward function {self.source} returned a dict without 'score' for "
                                      f"sample {i} (keys: {sorted(map(str, value))}); verl reads the reward "
                                      "from 'score'")
                for key, extra in value.items():
                    if key != "score" and is_scalar(extra):
                        logs.setdefault(str(key), [math.nan] * n)[i] = float(extra)
                value = value["score"]
            scores.append(value)
        return {"rewards": scores, "extra_logs": logs} if logs else scores


def _nested_truth(record: Any) -> Any:
    """record["reward_model"]["ground_truth"], where verl's data keeps it; None when absent."""
    holder = record.get("reward_model") if isinstance(record, Mapping) else None
    return holder.get("ground_truth") if isinstance(holder, Mapping) else None

