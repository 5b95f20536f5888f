"""The Tinker server's work queue: requests run on one worker thread, in arrival order, except that
waiting requests that can share the model's work run together.

Every request is a `Job` with an `owner` (the training model or sampling session it belongs to)
and, for a request that may share work, a `group` key and a `payload`. When the worker reaches the
oldest waiting job, it runs it alone, or, when it has a group key, together with every later
waiting job of that key (at most `max_group`) whose owner has no earlier job still waiting outside
the group: a client's own requests keep their order (a `forward_backward` never passes its
client's `optim_step`), other clients' requests may run earlier than their turn. A group runs as
one call `runners[kind](payloads)` (`kind` = the key's first element) that answers each payload
with its result or the RlhfkitError that refused it, so one client's bad request fails alone;
an error of the call itself fails the whole group. Each job counts as one item of work: a job
already answered by an earlier group is skipped when its turn comes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any


@dataclass
class Job:
    owner: str | None
    group: tuple | None = None  # jobs with an equal key may run in one call
    payload: Any = None  # what the group's runner gets (group jobs)
    fn: Callable[[], Any] | None = None  # what runs it alone (other jobs)
    future: Future = dataclass_field(default_factory=Future)


class RequestQueue:
    """See the module docstring. `runners`: kind -> `(payloads) -> [result or exception, ...]`."""

    def __init__(self, runners: dict[str, Callable[[list], list]], max_group: int = 64) -> None:
        self.runners, self.max_group = runners, max_group
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-worker")
        self.pending: list[Job] = []
        self.lock = threading.Lock()
        self.calls: dict[str, list[int]] = {kind: [] for kind in runners}  # per kind: the size of each call

    def submit(self, owner: str | None, fn: Callable[[], Any] | None = None, group: tuple | None = None,
               payload: Any = None) -> Future:
        """Queue `fn` (run alone) or `payload` (run in a group of key `group`); its future."""
        job = Job(owner, group, payload, fn)
        with self.lock:
            self.pending.append(job)
        self.worker.submit(self._next)
        return job.future

    def _take(self) -> list[Job]:
        """The oldest waiting job and the jobs that join it (see the module docstring)."""
        with self.lock:
            if not self.pending:
                return []
            first = self.pending[0]
            taken, blocked = [first], set()
            if first.group is not None:
                for job in self.pending[1:]:
                    if job.group == first.group and job.owner not in blocked and len(taken) < self.max_group:
                        taken.append(job)
                    elif job.owner is not None:
                        blocked.add(job.owner)
            for job in taken:
                self.pending.remove(job)
            return taken

    def _next(self) -> None:
        jobs = self._take()
        if not jobs:
            return
        if jobs[0].group is None:
            _settle(jobs[0].future, jobs[0].fn)
            return
        kind = jobs[0].group[0]
        self.calls[kind].append(len(jobs))
        try:
            results = self.runners[kind]([job.payload for job in jobs])
        except Exception as exc:  # noqa: BLE001 - the call itself failed: every job of it fails alike
            for job in jobs:
                job.future.set_exception(exc)
            return
        for job, result in zip(jobs, results):
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)


def _settle(future: Future, fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except Exception as exc:  # noqa: BLE001 - handed to the request's future
        future.set_exception(exc)
