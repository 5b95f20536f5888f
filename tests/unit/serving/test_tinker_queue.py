"""The Tinker server's queue (serving/tinker/queue.py): waiting requests of one group key run in one
call, a client's own requests never change order, and a request refused by the group's runner
fails alone."""

from __future__ import annotations

import threading

import pytest

from rlhfkit.errors import DataError
from rlhfkit.serving.tinker.queue import RequestQueue


class Recorder:
    """Runners that log what ran, in order: a group call as a tuple of its payloads."""

    def __init__(self):
        self.log: list = []

    def runners(self):
        def fwdbwd(payloads):
            self.log.append(tuple(payloads))
            return [DataError(f"{p} is bad") if p.endswith("bad") else f"{p} done" for p in payloads]
        return {"fwdbwd": fwdbwd, "sample": fwdbwd}

    def alone(self, name):
        return lambda: (self.log.append(name), f"{name} done")[1]


def blocked_queue(recorder):
    """A queue whose worker waits on the returned event, so that what is submitted next waits together."""
    queue = RequestQueue(recorder.runners())
    gate = threading.Event()
    queue.submit(None, gate.wait)
    return queue, gate


def test_waiting_requests_group_and_each_client_keeps_its_order():
    rec = Recorder()
    queue, gate = blocked_queue(rec)
    fb, smp = ("fwdbwd",), ("sample", 2)
    futures = [
        queue.submit("A", group=fb, payload="A.fb1"),
        queue.submit("A", rec.alone("A.optim")),
        queue.submit("B", group=fb, payload="B.fb1"),
        queue.submit("A", group=fb, payload="A.fb2"),  # behind A's optim_step: must not join A.fb1
        queue.submit("C", group=smp, payload="C.s1"),
        queue.submit("D", group=fb, payload="D.bad"),
        queue.submit("C", group=fb, payload="C.fb1"),  # behind C's sample: must not pass it
        queue.submit("E", group=smp, payload="E.s1"),
        queue.submit("B", group=fb, payload="B.fb2"),  # B's earlier request is in the group: joins it
    ]
    gate.set()
    results = [f.exception(timeout=10) or f.result() for f in futures]
    assert rec.log == [("A.fb1", "B.fb1", "D.bad", "B.fb2"), "A.optim", ("A.fb2",), ("C.s1", "E.s1"), ("C.fb1",)]
    assert isinstance(results[5], DataError) and results[0] == "A.fb1 done" and results[8] == "B.fb2 done"
    assert queue.calls == {"fwdbwd": [4, 1, 1], "sample": [2]}


def test_a_failing_group_call_fails_each_of_its_requests_and_the_queue_goes_on():
    def broken(payloads):
        raise RuntimeError("out of memory")

    queue = RequestQueue({"fwdbwd": broken})
    gate = threading.Event()
    queue.submit(None, gate.wait)
    first = [queue.submit(o, group=("fwdbwd",), payload=o) for o in "AB"]
    after = queue.submit("A", lambda: "still serving")
    gate.set()
    for f in first:
        with pytest.raises(RuntimeError, match="out of memory"):
            f.result(timeout=10)
    assert after.result(timeout=10) == "still serving"


def test_the_group_size_is_capped():
    rec = Recorder()
    queue = RequestQueue(rec.runners(), max_group=2)
    gate = threading.Event()
    queue.submit(None, gate.wait)
    futures = [queue.submit(o, group=("fwdbwd",), payload=o) for o in "ABCDE"]
    gate.set()
    [f.result(timeout=10) for f in futures]
    assert rec.log == [("A", "B"), ("C", "D"), ("E",)]
