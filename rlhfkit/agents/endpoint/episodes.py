"""The endpoint's episodes: who may call, what each call may ask, and the record of every call.

Each episode has its own base URL (`/e/<episode id>/v1`) and its own key (the `api_key` its
client sends as `Authorization: Bearer KEY`), both random. A request is refused, and counted, when
its key is missing or wrong (401), when the key is another episode's (403), when the episode has
ended (410), when the episode made more calls than `max_calls` or has `max_in_flight` calls
waiting (429), when its response budget is spent, its prompt does not fit the episode's context
or it sends more distinct images than a vision-language policy allows (400). `max_tokens` above
the per-call budget is lowered to it (counted). Counters are read and reset with `pop_metrics`;
every refusal is logged once per episode and reason, in one line.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfkit.agents.endpoint.segments import Call

log = logging.getLogger("rlhfkit")
SERVE_ID = "serve"  # the one-request episode of `rlhfkit serve`'s /v1 routes (nothing recorded)
VISION_REQUEST_BYTES = 16 << 20  # the largest request body with images (base64 images are large)


@dataclass(frozen=True)
class EndpointLimits:
    """Limits of one episode's calls.

    per_call: most new tokens of one call (--rollout.max_new_tokens); total: most sampled tokens
    of the episode (--agent.max_response_tokens); max_calls: most calls of an episode;
    max_in_flight: most calls of an episode waiting at once; max_request_bytes: the largest request
    body; context: most tokens of a call's prompt + its new tokens."""

    per_call: int = 256
    total: int = 1024
    max_calls: int = 64
    max_in_flight: int = 8
    max_request_bytes: int = 1 << 20
    context: int = 4096


class Refused(Exception):
    """A request the endpoint does not serve: the HTTP status, the counter and the message."""

    def __init__(self, status: int, counter: str, message: str):
        super().__init__(message)
        self.status, self.counter, self.message = status, counter, message


@dataclass
class Turn:
    """A chat call the episode made, for continuing its conversation token for token: the
    messages it sent (normalised), the reply per choice (normalised), the prompt ids and per choice
    the sampled ids and whether sampling ended on a stop token; the keys and tensors of its
    prompt's images (a vision-language policy)."""

    messages: list[tuple]
    replies: list[tuple]
    prompt_ids: list[int]
    sampled: list[list[int]]
    stopped: list[bool]
    images: tuple[str, ...] = ()
    vision: Any = None


@dataclass
class Episode:
    """One episode: its id and key, the prompt it answers (`group_id`), its seed, its calls."""

    id: str
    key: str
    group_id: int
    seed: int
    limits: EndpointLimits
    calls: list[Call] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    texts: list[tuple[str, list[int]]] = field(default_factory=list)  # completions: (text so far, its ids)
    requests: int = 0
    in_flight: int = 0
    sampled: int = 0
    open: bool = True
    logged: set = field(default_factory=set)
    in_engine: int = 0  # calls between asking the engine and its answer (queued or generating)
    engine_since: float = 0.0  # when the first of them asked (time.monotonic)
    engine_s: float = 0.0  # seconds with a call in the engine, before that
    image_keys: set = field(default_factory=set)  # the distinct images its calls sent (vision.ImageParts keys)
    _seeds: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._seeds = torch.Generator().manual_seed(int(self.seed))

    def next_seed(self) -> int:
        """The seed of the episode's next engine call (call k: the k-th draw from `seed`)."""
        return int(torch.randint(0, 2**62, (1,), generator=self._seeds))


class Registry:
    """The open and ended episodes of a server; thread-safe (the server and the runner share it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.episodes: dict[str, Episode] = {}
        self.by_key: dict[str, str] = {}
        self.counts: Counter = Counter()

    def open(self, group_id: int, seed: int, limits: EndpointLimits) -> Episode:
        e = Episode(secrets.token_hex(8), "ep-" + secrets.token_urlsafe(24), group_id, seed, limits)
        with self.lock:
            self.episodes[e.id] = e
            self.by_key[e.key] = e.id
        return e

    def close(self, episode_id: str) -> Episode:
        """End the episode: later calls get 410; calls still generating are not recorded."""
        with self.lock:
            e = self.episodes[episode_id]
            e.open = False
            return e

    def forget(self, episode_id: str) -> None:
        with self.lock:
            e = self.episodes.pop(episode_id, None)
            if e is not None:
                self.by_key.pop(e.key, None)

    def running(self) -> int:
        """Open episodes: the batcher waits for each of them to ask (or for its window to pass)."""
        with self.lock:
            return sum(e.open for e in self.episodes.values())

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def pop_metrics(self) -> dict[str, float]:
        with self.lock:
            out = {f"endpoint/{k}": float(v) for k, v in self.counts.items()}
            self.counts.clear()
        return out

    def admit(self, episode_id: str, authorization: str | None) -> Episode:
        """The episode a request may act for, with its call counted in flight; else `Refused`."""
        key = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else ""
        with self.lock:
            e = self.episodes.get(episode_id)
            if e is None or not key:
                raise self._refuse(None, 401 if not key else 404, "refused_auth" if not key else "refused_unknown",
                                   "no bearer key" if not key else f"no episode {episode_id!r} on this endpoint")
            if not hmac.compare_digest(key.encode(), e.key.encode()):
                other = self.by_key.get(key)
                if other is not None:
                    raise self._refuse(e, 403, "refused_other_episode", f"the key of episode {other} was sent to "
                                       f"episode {episode_id}'s URL; each episode calls its own base URL")
                raise self._refuse(e, 401, "refused_auth", "wrong bearer key")
            if not e.open:
                raise self._refuse(e, 410, "refused_ended", f"episode {episode_id} has ended; its calls are closed")
            if e.requests >= e.limits.max_calls:
                raise self._refuse(e, 429, "refused_flood", f"episode {episode_id} made {e.requests} calls, "
                                   f"the most an episode may make ({e.limits.max_calls})")
            if e.in_flight >= e.limits.max_in_flight:
                raise self._refuse(e, 429, "refused_flood", f"episode {episode_id} has {e.in_flight} calls waiting, "
                                   f"the most at once ({e.limits.max_in_flight})")
            e.requests += 1
            e.in_flight += 1
            self.counts["calls"] += 1
            return e

    def refuse(self, e: Episode | None, status: int, counter: str, message: str) -> Refused:
        with self.lock:
            return self._refuse(e, status, counter, message)

    def _refuse(self, e: Episode | None, status: int, counter: str, message: str) -> Refused:
        self.counts[counter] += 1
        if e is None or counter not in e.logged:
            if e is not None:
                e.logged.add(counter)
            log.warning("agent endpoint: refused a call (%d): %s", status, message)
        return Refused(status, counter, message)

    def record(self, e: Episode, calls: list[Call], turn: Turn | None = None,
               texts: list[tuple[str, list[int]]] | None = None) -> bool:
        """Keep a finished call's samples (False, nothing kept, when the episode ended meanwhile)."""
        with self.lock:
            if not e.open:
                self.counts["discarded_after_end"] += 1
                return False
            e.calls += calls
            e.sampled += sum(len(c.sampled_ids) for c in calls)
            if turn is not None:
                e.turns.append(turn)
            e.texts += texts or []
            return True

    def take_images(self, e: Episode, keys: list[str], most: int | None,
                    flag: str = "--data.max_images_per_prompt") -> None:
        """Count a call's images among the episode's distinct images; `Refused` past `most` (None: any number),
        naming the `flag` that sets it."""
        with self.lock:
            seen = e.image_keys | set(keys)
            if most is not None and len(seen) > most:
                who = "the request" if e.id == SERVE_ID else f"episode {e.id}"
                raise self._refuse(e, 400, "refused_images", f"{who} would send {len(seen)} distinct images, "
                                   f"more than {flag} {most}")
            e.image_keys = seen

    def release(self, e: Episode) -> None:
        with self.lock:
            e.in_flight -= 1

    @contextlib.contextmanager
    def in_engine(self, e: Episode):
        """Around a call's wait for the engine (its queue and its generation): the time the episode
        waited on the engine, which its --agent.timeout does not count."""
        with self.lock:
            if e.in_engine == 0:
                e.engine_since = time.monotonic()
            e.in_engine += 1
        try:
            yield
        finally:
            with self.lock:
                e.in_engine -= 1
                if e.in_engine == 0:
                    e.engine_s += time.monotonic() - e.engine_since

    def engine_seconds(self, e: Episode) -> float:
        """Seconds so far in which at least one of the episode's calls waited on the engine."""
        with self.lock:
            return e.engine_s + (time.monotonic() - e.engine_since if e.in_engine else 0.0)


def room(e: Episode, prompt_len: int, asked: Any, registry: Registry, n: int = 1) -> int:
    """New tokens each of a call's `n` samples may sample: what it asked for (None: the per-call budget),
    at most the per-call budget (a larger ask is lowered and counted), an n-th of what the episode's
    response budget has left (the n samples all count) and what its context has left; `Refused` when
    nothing is left."""
    limits = e.limits
    if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
        raise registry.refuse(e, 400, "bad_request", f"max_tokens={asked!r}; give a positive integer")
    want = limits.per_call if asked is None else asked
    if want > limits.per_call:
        registry.count("max_tokens_lowered")
        want = limits.per_call
    left = limits.total - e.sampled
    if left <= 0:
        raise registry.refuse(e, 400, "refused_budget", f"episode {e.id} sampled its {limits.total} tokens "
                              "(--agent.max_response_tokens); end the episode")
    if left < n:
        raise registry.refuse(e, 400, "refused_budget", f"episode {e.id} has {left} of its {limits.total} tokens "
                              f"(--agent.max_response_tokens) left, fewer than n={n} samples need; ask fewer")
    fits = limits.context - prompt_len
    if fits <= 0:
        raise registry.refuse(e, 400, "refused_too_long", f"a prompt of {prompt_len} tokens leaves no room in the "
                              f"episode's context of {limits.context} tokens")
    return min(want, left // n, fits)
