"""Client of reward servers (`--reward.remote_url http://host:port/get_reward[,http://...]`).

The protocol is OpenRLHF's: POST JSON {"query": [B str], "prompts": [B str], "labels": [B]}
and receive {"rewards": [B], "scores": [B] (optional), "extra_logs": {...} (optional)} or a
bare list of B numbers. When the prompts carry images (the `prompt_images=` of a vision-language
policy's batch), each request also holds what a reward model over images reads (rewards/server.py):
"raw_prompts" (each prompt's messages, image parts as bare `{"type": "image"}` placeholders),
"responses" and "images" (each prompt's images as PNG data: URLs, in placeholder order).

A batch is cut into requests of at most `batch_size` queries, dealt round-robin to the URLs
(sharding), and sent concurrently. A request that fails (connection refused, timeout, 5xx) is
retried `max_retries` times with exponential backoff; a server that stays down or answers garbage
(not JSON, 4xx, wrong length, NaN) stops the run with a `RewardError` naming the URL.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
import torch

from rlhfkit.data.images import image_data_url
from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput, normalize_reward_output


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


class RemoteRewardFn:
    """A `RewardFn` over one or more reward servers (see the module docstring)."""

    def __init__(self, urls: Sequence[str], timeout: float = 60.0, max_retries: int = 3, batch_size: int = 64,
                 token: str | None = None, backoff: float = 0.5):
        self.urls = [u.strip() for u in urls if u.strip()]
        if not self.urls or not all(is_url(u) for u in self.urls):
            raise RewardError(f"reward server URLs must start with http:// or https:// (got {list(urls)})")
        self.timeout, self.max_retries, self.batch_size = timeout, max_retries, batch_size
        self.backoff = backoff
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def __repr__(self) -> str:
        return f"RemoteRewardFn({self.urls})"

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> RewardOutput:
        """Score B queries on the servers; returns a checked RewardOutput of [B] values."""
        n = len(queries)
        starts = list(range(0, n, self.batch_size))
        jobs = [(self.urls[k % len(self.urls)], s, min(s + self.batch_size, n)) for k, s in enumerate(starts)]
        extra = image_fields(kwargs)
        outs = asyncio.run(self._gather(jobs, queries, prompts, labels, extra)) if jobs else []
        if not outs:
            return RewardOutput(torch.zeros(0), torch.zeros(0))
        names = {k for o in outs for k in o.extra_logs}
        return RewardOutput(
            rewards=torch.cat([o.rewards for o in outs]),
            scores=torch.cat([o.scores for o in outs]),
            extra_logs={k: torch.cat([o.extra_logs.get(k, torch.zeros(o.batch_size)) for o in outs]) for k in names},
        )

    async def _gather(self, jobs, queries, prompts, labels, extra: dict) -> list[RewardOutput]:
        async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers) as client:
            return list(await asyncio.gather(*(
                self._post(client, url, {"query": queries[a:b], "prompts": prompts[a:b],
                                         "labels": [_jsonable(x) for x in labels[a:b]],
                                         **{k: v[a:b] for k, v in extra.items()}})
                for url, a, b in jobs)))

    async def _post(self, client: httpx.AsyncClient, url: str, payload: dict) -> RewardOutput:
        """One request with retries; RewardError naming `url` when it cannot get a usable answer."""
        n = len(payload["query"])
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = await client.post(url, json=payload)
            except httpx.TransportError as exc:  # refused, reset, timeout: worth retrying
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise RewardError(f"reward server {url} answered HTTP {resp.status_code}: {resp.text[:200]}")
            try:
                body = resp.json()
            except json.JSONDecodeError:
                raise RewardError(f"reward server {url} answered non-JSON: {resp.text[:200]!r}") from None
            return normalize_reward_output(body, n, source=f"server {url}")
        raise RewardError(f"reward server {url} failed after {self.max_retries + 1} attempts ({last}); "
                          "is it running? start it with `rlhfkit serve-reward`")


def image_fields(kwargs: dict) -> dict:
    """The per-query fields a reward model over images reads ({} when no prompt has images): raw_prompts
    (image parts as bare placeholders), responses and images (PNG data: URLs)."""
    images = kwargs.get("prompt_images")
    if not images or not any(images):
        return {}
    return {"raw_prompts": [_placeholders(p) for p in kwargs["raw_prompts"]], "responses": list(kwargs["responses"]),
            "images": [None if ims is None else [image_data_url(im) for im in ims] for ims in images]}


def _placeholders(raw: Any) -> Any:
    """A prompt (a string or messages) with each image part as a bare `{"type": "image"}` (its image travels in
    "images", in this order)."""
    if isinstance(raw, str) or not isinstance(raw, list):
        return raw
    out = []
    for m in raw:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = [{"type": "image"} if isinstance(p, dict) and p.get("type") == "image" else p for p in content]
            m = {**m, "content": content}
        out.append(m)
    return out


def _jsonable(x: Any) -> Any:
    """A label as JSON can carry it: tensors as lists, anything json cannot encode as str."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    try:
        json.dumps(x)
    except (TypeError, ValueError):
        return str(x)
    return x
