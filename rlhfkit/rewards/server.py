"""A reward function over HTTP: `POST /get_reward` (OpenRLHF's protocol), FastAPI app.

Request JSON: {"query": [B str], "prompts": [B str] (optional), "labels": [B] (optional)}.
Answer: {"rewards": [B], "scores": [B], "extra_logs": {name: [B]}} (an extra log's NaN, "not
applicable", as null). Errors: 401 without the
bearer token (when one is set), 413 for a body over `max_request_bytes` (checked while reading,
so a huge body is never held in memory), 422 for malformed JSON or fields, 500 when the reward
function fails (its `RewardError` message is the answer's "detail"). `GET /health` says ok.
The reward function runs in a worker thread, so an async reward function works too.

A reward model over images (`read_images`) also needs, per query, the prompt's messages and images
and the response: "raw_prompts" [B] (a string or chat messages whose image parts are bare
`{"type": "image"}` placeholders), "responses" [B str] and "images" [B] (each a list of
`data:image/<format>;base64,...` URLs in placeholder order, or null). They reach the reward function
as `raw_prompts=`, `responses=` and `prompt_images=` (decoded images). Paths and http(s) URLs are
refused (422): the server reads no file and fetches nothing a request names.

A process reward model (`tokens`: its vocabulary) answers per query its steps' scores beside the one
aggregate of "rewards": "step_rewards" [B] (each a list, one P(good) per step of the response, in order)
and "step_ends" [B] (each step's last token, an index in the response's token ids). A request may send
the policy's token ids: "prompt_ids" [B] and "response_ids" [B] (lists of ints) with "vocab", the
fingerprint of their vocabulary (rewards.reward_model.vocabulary_fingerprint), which must be the PRM's
(else 422); the PRM then reads those tokens as they are, else it tokenizes "prompts" and each query past
its prompt.

`PooledReward` lets concurrent requests share the model's passes (`rlhfkit serve-reward` serves a
reward model through it).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from rlhfkit.data.images import data_url_bytes, open_image
from rlhfkit.errors import DataError, RewardError
from rlhfkit.rewards.base import RewardFn, RewardOutput


@dataclass(frozen=True)
class TokenVocabulary:
    """The vocabulary whose token ids a served process reward model reads: its fingerprint
    (rewards.reward_model.vocabulary_fingerprint) and its size (the largest id + 1)."""

    fingerprint: str
    size: int


def make_app(reward_fn: RewardFn, token: str | None = None, max_request_bytes: int = 8 << 20,
             read_images: bool = False, tokens: TokenVocabulary | None = None) -> FastAPI:
    """The FastAPI app serving `reward_fn` (see the module docstring; `app.state.reward_fn` is it);
    `tokens`: a process reward model's vocabulary, whose token ids a request may send."""
    app = FastAPI(title="rlhfkit reward server")
    app.state.reward_fn = reward_fn

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/get_reward")
    async def get_reward(request: Request) -> dict:
        _check_token(request, token)
        body = await read_limited(request, max_request_bytes)
        data = _json(body)
        queries, prompts, labels = _parse(data)
        if not queries:
            return {"rewards": [], "scores": [], "extra_logs": {}}
        extra = _image_fields(data, len(queries)) if read_images else {}
        if tokens is not None:
            extra.update(_token_fields(data, len(queries), tokens))
        try:
            out = await run_in_threadpool(reward_fn, queries, prompts, labels, **extra)
        except RewardError as exc:
            raise HTTPException(status_code=500, detail=str(exc)) from exc
        answer = {"rewards": out.rewards.tolist(), "scores": out.scores.tolist(),
                  "extra_logs": {k: _json_floats(v) for k, v in out.extra_logs.items()}}
        if out.steps is not None and out.step_ends is not None:  # a process reward model's
            answer.update(step_rewards=[p.tolist() for p in out.steps], step_ends=[e.tolist() for e in out.step_ends])
        return answer

    return app


def _json_floats(values) -> list:
    """A [B] extra log as JSON can carry it: NaN ("not applicable") as null."""
    return [None if x != x else x for x in values.tolist()]


def _check_token(request: Request, token: str | None) -> None:
    if token is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise HTTPException(status_code=401, detail="missing or wrong bearer token")


async def read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status_code=413, detail=f"request body over {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status_code=413, detail=f"request body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HTTPException(status_code=422, detail="body is not JSON") from None


def _parse(data: Any) -> tuple[list[str], list[str], list[Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("query"), list):
        raise HTTPException(status_code=422, detail='body must be {"query": [...], "prompts": [...], "labels": [...]}')
    queries = data["query"]
    n = len(queries)
    prompts = data.get("prompts") or [""] * n
    labels = data.get("labels") or [None] * n
    if not all(isinstance(q, str) for q in queries) or not all(isinstance(p, str) for p in prompts):
        raise HTTPException(status_code=422, detail="query and prompts must be lists of strings")
    if len(prompts) != n or not isinstance(labels, list) or len(labels) != n:
        raise HTTPException(status_code=422, detail=f"{n} queries need {n} prompts and {n} labels")
    return queries, prompts, labels


def _image_fields(data: dict, n: int) -> dict:
    """raw_prompts=, responses= and prompt_images= (opened images) of a request to a reward model over images."""
    raw, responses, images = data.get("raw_prompts"), data.get("responses"), data.get("images")
    if not (isinstance(raw, list) and isinstance(responses, list) and len(raw) == len(responses) == n):
        raise HTTPException(status_code=422, detail=f"a reward model over images needs {n} raw_prompts (the prompts' "
                            f"messages) and {n} responses beside the {n} queries")
    if not all(isinstance(r, str) for r in responses):
        raise HTTPException(status_code=422, detail="responses must be a list of strings")
    images = [None] * n if images is None else images
    if not isinstance(images, list) or len(images) != n:
        raise HTTPException(status_code=422, detail=f"images must be a list of {n} lists of data: URLs (or null)")
    return {"raw_prompts": raw, "responses": responses,
            "prompt_images": [_open_images(urls, i) for i, urls in enumerate(images)]}


def _token_fields(data: dict, n: int, tokens: TokenVocabulary) -> dict:
    """prompt_ids= and completion_ids= of a request to a process reward model that sends the policy's token
    ids ("prompt_ids", "response_ids" and their vocabulary's fingerprint "vocab"); {} for one of text alone."""
    if data.get("prompt_ids") is None and data.get("response_ids") is None:
        return {}
    if data.get("vocab") != tokens.fingerprint:
        given = data.get("vocab")
        raise HTTPException(status_code=422, detail=f"the request's token ids are of vocabulary {given!r:.40}, the "
                            f"process reward model's is {tokens.fingerprint!r}: the policy must have the PRM's "
                            "tokenizer (train the PRM from the policy's base model), or send the text alone")
    return {"prompt_ids": _id_lists(data, "prompt_ids", n, tokens.size),
            "completion_ids": _id_lists(data, "response_ids", n, tokens.size)}


def _id_lists(data: dict, key: str, n: int, size: int) -> list[list[int]]:
    ids = data.get(key)
    ok = isinstance(ids, list) and len(ids) == n and all(
        isinstance(row, list) and all(type(t) is int and 0 <= t < size for t in row) for row in ids)
    if not ok:
        raise HTTPException(status_code=422, detail=f"{key} must be {n} lists of token ids in [0, {size})")
    return ids


def _open_images(urls: Any, i: int) -> list | None:
    if urls is None:
        return None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise HTTPException(status_code=422, detail=f"images[{i}] must be a list of data:image/...;base64 URLs")
    try:
        return [open_image(data_url_bytes(u, f"images[{i}][{j}]"), f"images[{i}][{j}]") for j, u in enumerate(urls)]
    except DataError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from exc


# ---------------------------------------------------------------------------------- requests sharing passes
@dataclass
class _Call:
    queries: list[str]
    prompts: list[str]
    labels: list
    kwargs: dict
    done: bool = False
    out: RewardOutput | None = None
    error: Exception | None = None


class PooledReward:
    """A reward function whose concurrent calls share its passes: a call that arrives while another one
    runs waits, and the calls waiting when the model is free run as ONE call of `reward_fn` over all
    their queries, in order of arrival (a reward model then cuts them into its micro-batches); each
    call gets its own rows of the output. `window_s`: how long the call that finds the model free
    waits for others to join it. Keyword arguments are per-query lists (concatenated); calls with
    different keywords run apart. `passes` counts the calls of `reward_fn`."""

    def __init__(self, reward_fn: RewardFn, window_s: float = 0.0):
        self.reward_fn, self.window_s = reward_fn, window_s
        self.passes = 0
        self._pending: list[_Call] = []
        self._pending_lock = threading.Lock()
        self._model = threading.Lock()

    def __call__(self, queries: list[str], prompts: list[str], labels: list, **kwargs: Any) -> RewardOutput:
        call = _Call(queries, prompts, labels, kwargs)
        with self._pending_lock:
            self._pending.append(call)
        with self._model:
            if not call.done:  # no earlier pass took it
                if self.window_s > 0:
                    time.sleep(self.window_s)
                with self._pending_lock:
                    calls, self._pending = self._pending, []
                for keys in dict.fromkeys(tuple(sorted(c.kwargs)) for c in calls):
                    self._run([c for c in calls if tuple(sorted(c.kwargs)) == keys])
        if call.error is not None:
            raise call.error
        assert call.out is not None
        return call.out

    def _run(self, calls: list[_Call]) -> None:
        """One call of `reward_fn` over `calls`' queries; each gets its rows, or the error."""
        kwargs = {k: [v for c in calls for v in c.kwargs[k]] for k in calls[0].kwargs}
        try:
            self.passes += 1
            out = self.reward_fn([q for c in calls for q in c.queries], [p for c in calls for p in c.prompts],
                                 [x for c in calls for x in c.labels], **kwargs)
        except Exception as exc:  # noqa: BLE001 - each waiting request answers with it
            for c in calls:
                c.error, c.done = exc, True
            return
        start = 0
        for c in calls:
            rows = slice(start, start + len(c.queries))
            c.out = out.select(rows)
            c.done, start = True, rows.stop
