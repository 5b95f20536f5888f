"""A reward function over HTTP: `POST /get_reward` (OpenRLHF's protocol), FastAPI app.

Request JSON: {"query": [B str], "prompts": [B str] (optional), "labels": [B] (optional)}.
Answer: {"rewards": [B], "scores": [B], "extra_logs": {name: [B]}}. Errors: 401 without the
bearer token (when one is set), 413 for a body over `max_request_bytes` (checked while reading,
so a huge body is never held in memory), 422 for malformed JSON or fields, 500 when the reward
function fails (its `RewardError` message is the answer's "detail"). `GET /health` says ok.
The reward function runs in a worker thread, so an async reward function works too.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardFn


def make_app(reward_fn: RewardFn, token: str | None = None, max_request_bytes: int = 8 << 20) -> FastAPI:
    """The FastAPI app serving `reward_fn` (see the module docstring)."""
    app = FastAPI(title="rlhfkit reward server")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/get_reward")
    async def get_reward(request: Request) -> dict:
        _check_token(request, token)
        body = await read_limited(request, max_request_bytes)
        queries, prompts, labels = _parse(body)
        try:
            out = await run_in_threadpool(reward_fn, queries, prompts, labels)
        except RewardError as exc:
            raise HTTPException(status_code=500, detail=str(exc)) from exc
        return {"rewards": out.rewards.tolist(), "scores": out.scores.tolist(),
                "extra_logs": {k: v.tolist() for k, v in out.extra_logs.items()}}

    return app


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


def _parse(body: bytes) -> tuple[list[str], list[str], list[Any]]:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HTTPException(status_code=422, detail="body is not JSON") from None
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
