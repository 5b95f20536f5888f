"""Python reward functions in either of two contracts, behind one wrapper: `CallableRewardFn`.

Reward files (`load_reward_file`), callables passed as `reward_fn=` and each member of a list of
reward functions all go through `CallableRewardFn(func, source, name)`. The trainer calls every
`RewardFn` (see `rlhfkit.rewards.base`) as

    reward_fn(queries, prompts, labels, responses=[B str], response_lengths=FloatTensor [B],
              group_ids=LongTensor [B], completion_ids=[B list[int]],
              raw_prompts=[B str | list[{"role", "content"}]], records=[B dict])

where `raw_prompts[i]` is the dataset's prompt before templating and `records[i]` the dataset row
(all its columns) of sample i's prompt; prompts with images add `prompt_images=[B list[PIL image] | None]`
(rewards.reward_model.prompt_images). The function's parameter names say which contract it
follows (`detect_contract`); anything else is refused in one line naming them:

* OpenRLHF (its first parameter is `queries`): `reward_func(queries, prompts, labels, **kwargs)`
  gets the three lists positionally and, as keywords, the caller's other arguments and each
  dataset column as a list of B values (a column never replaces a standard argument of the same
  name): all of them if it takes **kwargs, else only those it names.
* TRL (any other function that names one of TRL's keywords `prompts`, `completions`,
  `completion_ids`, `trainer_state`, `log_extra`, `log_metric` or takes **kwargs, all its parameters
  passable by keyword: `def f(completion_ids, **kwargs)`, as TRL's `get_soft_overlong_punishment`
  returns, is one): called as TRL's GRPOTrainer calls a reward function,
  `reward(prompts=raw_prompts, completions=..., completion_ids=..., **columns)`, where a
  completion is the response text, or `[{"role": "assistant", "content": text}]` when the
  sample's prompt is a list of messages (for a tool-calling episode, `completion_messages`: its
  assistant turns with their `tool_calls` and the `role: "tool"` results); columns named prompt /
  completion / completion_ids are
  left out, as TRL does. Its other parameters are dataset columns: one that the call cannot fill
  (no default, not a column) is refused in one line naming the columns there are. Departures from
  TRL: no `trainer_state=`, `log_extra=` or `log_metric=` (rlhfkit has none of TRL's trainer
  objects; a function that needs one is refused), and keywords the function neither names nor takes
  through **kwargs are dropped, not a TypeError.
* verl (a function taking `solution_str`, or `solution_strs` for verl's batch reward manager):
  `compute_score(data_source, solution_str, ground_truth, extra_info=None)` called per sample, by
  keyword, its float / bool / {"score": ...} results read as verl reads them (`rlhfkit.rewards.verl`).

Either returns what `normalize_reward_output` accepts. A `None` in a returned list means "does not
apply to this sample": a list of reward functions (`RewardSum`) skips it, as TRL does; a function
used alone must score every sample. Every call also:
  * runs an `async def` function to completion (in a worker thread when the calling thread already
    runs an event loop, e.g. in a notebook, since `asyncio.run` cannot nest);
  * turns an exception raised by the function into a `RewardError` naming it;
  * honours `batched(K)` (calls on chunks of at most K samples) and `grouped` (one call per group
    of `group_ids`: all samples of one prompt), or the attributes they set,
    `func.batch_size = K` / `func.group_level = True`. Chunks of an async function run
    concurrently; per-sample arguments are sliced to the chunk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from rlhfkit.errors import RewardError, first_line
from rlhfkit.rewards.base import RewardOutput, gather_awaitables, normalize_reward_output, response_texts
from rlhfkit.rewards.verl import VerlBatch, is_verl_function

OPENRLHF, TRL, VERL = "openrlhf", "trl", "verl"
CONTRACTS = (
    "OpenRLHF's `reward_func(queries, prompts, labels, **kwargs)` (first parameter named "
    "queries), TRL's `reward(completions, **kwargs)` (keywords: any of prompts, completions, "
    "completion_ids and dataset columns, plus **kwargs) or verl's `compute_score(data_source, "
    "solution_str, ground_truth, extra_info=None)`"
)
TRL_SKIPPED_COLUMNS = frozenset({"prompt", "completion", "completion_ids"})
TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")



def detect_contract(func: Callable[..., Any], source: str) -> str:
    """OPENRLHF, VERL or TRL from the names of func's parameters.

    Raises:
      RewardError: the signature cannot be read, fits neither contract (the message names both),
        or is OpenRLHF's but cannot take (queries, prompts, labels) as its first three.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        raise RewardError(
            f"reward function {source} has no signature to read; write it as {CONTRACTS}"
        ) from None
    names = list(signature.parameters)
    if names[:1] == ["queries"]:
        try:
            signature.bind_partial(None, None, None)  # later ones may be columns
        except TypeError as exc:
            raise RewardError(
                f"reward function {source} with parameters {signature} cannot be called with "
                f"(queries, prompts, labels) ({exc}); use "
                "`def reward_func(queries, prompts, labels, **kwargs)`"
            ) from exc
        return OPENRLHF
    if is_verl_function(names):
        return VERL
    params = signature.parameters.values()
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    required_positional = [p.name for p in params
                           if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty]
    if (takes_kwargs or any(n in TRL_KEYWORDS for n in names)) and not required_positional:
        return TRL
    raise RewardError(
        f"reward function {source} with parameters {signature} fits neither contract; "
        f"write it as {CONTRACTS}"
    )


class CallableRewardFn:
    """A `RewardFn` around a Python callable in either contract (see the module docstring).

    `source` names it in errors (a file path; default: the function's name) and `name` keys its
    rewards in the logs of a list of reward functions (a file's stem; default: `__name__`).
    """

    def __init__(self, func: Callable[..., Any], source: str | None = None,
                 name: str | None = None) -> None:
        self.func = func
        self.name = name or callable_name(func)
        self.source = source or self.name
        self.contract = detect_contract(func, self.source)
        self._call = VerlBatch(func, self.source) if self.contract == VERL else func  # verl's: adapted to a batch
        n_positional = 0 if self.contract == TRL else 3
        self._takes_all_kwargs, self._kwarg_names = _keyword_parameters(self._call, n_positional)

    def __repr__(self) -> str:
        return f"CallableRewardFn({self.source!r}, contract={self.contract!r})"

    def __call__(
        self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
    ) -> RewardOutput:
        """Score B samples (lists of length B); returns [B] values. A None is an error here."""
        out, applies = self.score(queries, prompts, labels, **kwargs)
        if not bool(applies.all()):
            i = int((~applies).nonzero()[0, 0])
            raise RewardError(
                f"reward function {self.source} returned None for sample {i} of {len(queries)}; "
                "a reward function used alone must score every sample (None only skips a "
                "function within a list of reward functions)"
            )
        return out

    def score(
        self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
    ) -> tuple[RewardOutput, torch.Tensor]:
        """(RewardOutput [B] with 0 where the function returned None, BoolTensor [B] True where
        it returned a number). Arguments as for `__call__`."""
        batch_size = len(queries)
        if len(prompts) != batch_size or len(labels) != batch_size:
            raise RewardError(
                f"reward function {self.source}: got {batch_size} queries, {len(prompts)} prompts "
                f"and {len(labels)} labels; pass one prompt and one label per query"
            )
        chunks = self._chunks(batch_size, kwargs.get("group_ids"))
        build = _trl_arguments if self.contract == TRL else _openrlhf_arguments
        args, kw = build(queries, prompts, labels, kwargs)
        if not self._takes_all_kwargs:
            kw = {k: v for k, v in kw.items() if k in self._kwarg_names}
        self._check_required(kw)
        calls = []
        try:
            for rows in chunks:
                calls.append(self._call(*(_slice(a, rows, batch_size) for a in args),
                                       **{k: _slice(v, rows, batch_size) for k, v in kw.items()}))
            if any(inspect.isawaitable(c) for c in calls):
                calls = _run_async(calls)
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(
                f"reward function {self.source} raised {type(exc).__name__}: {first_line(exc)}; "
                "fix it (call it alone on a few samples to see the traceback)"
            ) from exc
        parts = [self._check(out, len(rows)) for out, rows in zip(calls, chunks)]
        return _merge(parts, chunks, batch_size)

    def _check_required(self, kw: dict[str, Any]) -> None:
        """A TRL function's parameters without a default that the call does not fill: refused."""
        if self.contract != TRL:
            return
        params = inspect.signature(self.func).parameters.values()
        missing = [p.name for p in params if p.default is p.empty and p.name not in kw
                   and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        if missing:
            columns = sorted(set(kw) - {"prompts", "completions", "completion_ids"})
            raise RewardError(
                f"reward function {self.source} (TRL's contract) needs {', '.join(missing)}, which is neither "
                f"a keyword rlhfkit passes (prompts, completions, completion_ids) nor a dataset column (the "
                f"columns: {', '.join(columns) or 'none'}); give it a default or add the column")

    def _check(self, out: Any, n: int) -> tuple[RewardOutput, torch.Tensor]:
        """One chunk's result checked; None entries of a plain list become 0 and not-applicable."""
        applies = torch.ones(n, dtype=torch.bool)
        values = out.get("rewards") if isinstance(out, dict) else out
        if isinstance(values, (list, tuple)) and len(values) == n:
            applies = torch.tensor([v is not None for v in values], dtype=torch.bool)
            values = [0.0 if v is None else v for v in values]
            out = {**out, "rewards": values} if isinstance(out, dict) else values
        return normalize_reward_output(out, n, source=self.source), applies

    def _chunks(self, batch_size: int, group_ids: Any) -> list[list[int]]:
        if getattr(self.func, "group_level", False):
            if group_ids is None:
                raise RewardError(f"reward function {self.source} asks for whole groups "
                                  "(group_level) but the caller passed no group_ids")
            groups: dict[int, list[int]] = {}
            for i, g in enumerate(torch.as_tensor(group_ids).tolist()):
                groups.setdefault(g, []).append(i)
            return list(groups.values())
        size = getattr(self.func, "batch_size", None) or batch_size
        chunks = [list(range(s, min(s + size, batch_size))) for s in range(0, batch_size, size)]
        return chunks or [[]]


def batched(size: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: call this reward function on chunks of at most `size` samples."""

    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        func.batch_size = size  # type: ignore[attr-defined]
        return func

    return mark


def grouped(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: call this reward function once per group (all samples of one prompt)."""
    func.group_level = True  # type: ignore[attr-defined]
    return func


def callable_name(func: Any) -> str:
    """`__name__` of a function (of the wrapped one for functools.partial), else its class name."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", None) or type(func).__name__


# ---- the two contracts: (positional, keyword) arguments for the whole batch ----------------

def _openrlhf_arguments(queries: list[str], prompts: list[str], labels: list[Any],
                        kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    standard = {"queries", "prompts", "labels", *kwargs}
    return (queries, prompts, labels), {**_columns(kwargs.get("records"), standard), **kwargs}


def _trl_arguments(queries: list[str], prompts: list[str], labels: list[Any],
                   kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """TRL's keywords; without raw_prompts / responses (e.g. from the reward server) the
    templated prompts stand in and each response is its query after the prompt."""
    raw_prompts = kwargs.get("raw_prompts")
    raw_prompts = list(prompts) if raw_prompts is None else list(raw_prompts)
    responses = response_texts(queries, prompts, kwargs.get("responses"))
    completions = [[{"role": "assistant", "content": r}] if isinstance(p, (list, tuple)) else r
                   for p, r in zip(raw_prompts, responses)]
    conversations = kwargs.get("completion_messages")  # tool-calling episodes: their turns as messages
    if conversations is not None:
        completions = [c if m is None else list(m) for c, m in zip(completions, conversations)]
    standard: dict[str, Any] = {"prompts": raw_prompts, "completions": completions}
    if kwargs.get("completion_ids") is not None:
        standard["completion_ids"] = kwargs["completion_ids"]
    skipped = TRL_SKIPPED_COLUMNS | set(standard)
    return (), {**_columns(kwargs.get("records"), skipped), **standard}


def _columns(records: list[dict] | None, exclude: set[str] | frozenset[str]) -> dict[str, list]:
    """Dataset columns as keywords {name: [B values]} (None where a row lacks the column)."""
    if not records:
        return {}
    names = dict.fromkeys(k for r in records for k in r if isinstance(k, str) and k not in exclude)
    return {k: [r.get(k) for r in records] for k in names}


def _keyword_parameters(func: Callable[..., Any], n_positional: int) -> tuple[bool, frozenset[str]]:
    """(takes **kwargs, names of keyword-passable parameters after the first n positional ones)."""
    params = list(inspect.signature(func).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return True, frozenset()
    positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    n_taken = min(n_positional, sum(p.kind in positional_kinds for p in params))
    taken = {p.name for p in params[:n_taken]}  # queries, prompts, labels
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in params if p.kind in keyword_kinds and p.name not in taken}
    return False, frozenset(names)


# ---- chunks -------------------------------------------------------------------------------

def _slice(value: Any, rows: list[int], batch_size: int) -> Any:
    """value[rows] for a per-sample list / tensor of length B; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch_size:
        return value[rows]
    if isinstance(value, (list, tuple)) and len(value) == batch_size:
        return [value[i] for i in rows]
    return value


def _merge(parts: list[tuple[RewardOutput, torch.Tensor]], chunks: list[list[int]],
           batch_size: int) -> tuple[RewardOutput, torch.Tensor]:
    if len(parts) == 1 and chunks[0] == list(range(batch_size)):
        return parts[0]
    rewards, scores = torch.zeros(batch_size), torch.zeros(batch_size)
    applies = torch.zeros(batch_size, dtype=torch.bool)
    logs = {k: torch.zeros(batch_size) for out, _ in parts for k in out.extra_logs}
    for (out, ok), rows in zip(parts, chunks):
        idx = torch.tensor(rows, dtype=torch.long)
        rewards[idx], scores[idx], applies[idx] = out.rewards, out.scores, ok
        for k, v in out.extra_logs.items():
            logs[k][idx] = v
    return RewardOutput(rewards=rewards, scores=scores, extra_logs=logs), applies


def _run_async(calls: list[Any]) -> list[Any]:
    """The results of calls, awaiting those that are awaitable concurrently under one loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather_awaitables(calls))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # this thread's loop is busy
        return pool.submit(asyncio.run, gather_awaitables(calls)).result()

