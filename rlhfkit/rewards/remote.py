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

A process reward model's server (`rlhfkit serve-reward` of a `train prm` folder) answers per query its steps'
scores, "step_rewards" [B] (lists of numbers) and "step_ends" [B] (each step's last token in the
response), beside one aggregate in "rewards"; they are checked and kept (`RewardOutput.steps`,
`step_ends`). With `vocab` (the fingerprint of the policy tokenizer's vocabulary) each request also
holds the policy's token ids ("prompt_ids", "response_ids", from the `prompt_ids=` and `completion_ids=`
of the call) and "vocab": the server reads those tokens as they are (it refuses another vocabulary: 422),
so the step ends are indices in the policy's response tokens. Without `vocab` the server tokenizes the
text and its step ends are not kept.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import httpx
import torch

from rlhfkit.data.images import image_data_url
from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput, concat_outputs, normalize_reward_output


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


class RemoteRewardFn:
    """A `RewardFn` over one or more reward servers (see the module docstring)."""

    def __init__(self, urls: Sequence[str], timeout: float = 60.0, max_retries: int = 3, batch_size: int = 64,
                 token: str | None = None, backoff: float = 0.5, vocab: str | None = None):
        self.vocab = vocab
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
        extra = {**image_fields(kwargs), **self.token_fields(kwargs)}
        outs = asyncio.run(self._gather(jobs, queries, prompts, labels, extra)) if jobs else []
        if not outs:
            return RewardOutput(torch.zeros(0), torch.zeros(0))
        return concat_outputs(outs)

    def with_vocab(self, vocab: str) -> RemoteRewardFn:
        """This client sending the policy's token ids, of the vocabulary whose fingerprint is `vocab`."""
        out = copy.copy(self)
        out.vocab = vocab
        return out

    def token_fields(self, kwargs: dict) -> dict:
        """The per-query token ids a process reward model reads ({} without `vocab` or the call's ids)."""
        prompt_ids, response_ids = kwargs.get("prompt_ids"), kwargs.get("completion_ids")
        if self.vocab is None or prompt_ids is None or response_ids is None:
            return {}
        return {"prompt_ids": [list(map(int, x)) for x in prompt_ids],
                "response_ids": [list(map(int, x)) for x in response_ids]}

    async def _gather(self, jobs, queries, prompts, labels, extra: dict) -> list[RewardOutput]:
        vocab = {"vocab": self.vocab} if "response_ids" in extra else {}
        async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers) as client:
            return list(await asyncio.gather(*(
                self._post(client, url, {"query": queries[a:b], "prompts": prompts[a:b],
                                         "labels": [_jsonable(x) for x in labels[a:b]],
                                         **{k: v[a:b] for k, v in extra.items()}, **vocab})
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
                raise RewardError(f"reward server {url} answered HTTP {resp.status_code}: {_detail(resp)}")
            try:
                body = resp.json()
            except json.JSONDecodeError:
                raise RewardError(f"reward server {url} answered non-JSON: {resp.text[:200]!r}") from None
            out = normalize_reward_output(body, n, source=f"server {url}")
            if isinstance(body, dict) and body.get("step_rewards") is not None:
                steps, ends = step_fields(body, n, payload.get("response_ids"), url)
                out = dataclasses.replace(out, steps=steps, step_ends=ends)
            return out
        raise RewardError(f"reward server {url} failed after {self.max_retries + 1} attempts ({last}); "
                          "is it running? start it with `rlhfkit serve-reward`")


def step_fields(body: dict, n: int, response_ids: list[list[int]] | None, url: str
                ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """A process reward model's answer to `n` queries checked: (per query its steps' scores [S_b], and, when
    the request sent `response_ids`, each step's last token in them [S_b] (else None)); RewardError naming
    `url` for a malformed one."""
    where = f"reward server {url}"
    steps = body["step_rewards"]
    if not isinstance(steps, list) or len(steps) != n or not all(_numbers(s) for s in steps):
        raise RewardError(f"{where} answered step_rewards that are not {n} lists of finite numbers (one per query)")
    scores = [torch.tensor(s, dtype=torch.float32) for s in steps]
    if response_ids is None:
        return scores, None
    ends = body.get("step_ends")
    if not isinstance(ends, list) or len(ends) != n:
        raise RewardError(f"{where} answered step_rewards without step_ends for its {n} queries")
    for i, (e, s, r) in enumerate(zip(ends, steps, response_ids)):
        ok = isinstance(e, list) and len(e) == len(s) and all(type(t) is int for t in e)
        if not (ok and all(0 <= t < len(r) for t in e) and all(a < b for a, b in zip(e, e[1:]))):
            raise RewardError(f"{where} answered step_ends[{i}] = {e!r:.80}: it must be {len(s)} increasing token "
                              f"indices in the response's {len(r)} tokens, one per step")
    return scores, [torch.tensor(e, dtype=torch.long) for e in ends]


def _detail(resp: httpx.Response) -> str:
    """What a refusal says: its JSON "detail" when it is a string (FastAPI's), else the body's start."""
    try:
        detail = resp.json().get("detail")
    except (json.JSONDecodeError, AttributeError):
        detail = None
    return (detail if isinstance(detail, str) else resp.text)[:400]


def _numbers(xs: Any) -> bool:
    return isinstance(xs, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                        and math.isfinite(x) for x in xs)


def image_fields(kwargs: dict) -> dict:
    """The per-query fields a reward model over images reads ({} when no prompt has images): raw_prompts
    (image parts as bare placeholders), responses and images (PNG data: URLs)."""
    images = kwargs.get("prompt_images")
    if not images or not any(images):
        return {}
    urls: dict[int, str] = {}  # id -> URL: the samples of a prompt share its image objects, encoded once a call

    def url(image) -> str:
        if id(image) not in urls:
            urls[id(image)] = image_data_url(image)
        return urls[id(image)]

    return {"raw_prompts": [_placeholders(p) for p in kwargs["raw_prompts"]], "responses": list(kwargs["responses"]),
            "images": [None if ims is None else [url(im) for im in ims] for ims in images]}


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
