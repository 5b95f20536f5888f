"""The Tinker API over HTTP (FastAPI), as the official `tinker` SDK speaks it.

Routes are the SDK's (`/api/v1/...`). Work on models (create_model, forward_backward,
optim_step, save/load, asample) is queued to one worker thread in arrival order (queue.py: waiting
forward / forward_backward requests of any clients run as one batch, and so do waiting sample
requests with the same parameters, each client's own requests kept in order) and answered
with a future (`{"request_id": ...}`); `retrieve_future` waits up to `poll_s` seconds for it and
answers the result (protobuf for forward_backward and sample, JSON otherwise), `try_again`, or
`{"error": ..., "category": "user"}`, which the SDK raises as one line. Every route but the
health check needs the SDK's `X-API-Key` header; bodies over `max_request_bytes` get 413 while
they are read; a route the SDK has that this server does not serve gets a 404 naming it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from rlhfkit.errors import RlhfkitError, one_line
from rlhfkit.serving.tinker.host import ModelHost
from rlhfkit.serving.tinker.queue import RequestQueue
from rlhfkit.serving.tinker.scoring import check_topk
from rlhfkit.serving.tinker.wire import (
    FwdBwdRequest,
    SampleOptions,
    WireImage,
    forward_backward_output,
    parse_forward_backward,
    sample_response,
)

PROTO = "application/x-protobuf"
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "use_pyqwest_transport": False,
                 "parallel_fwdbwd_chunks": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}
KEPT_FUTURES = 4096


class Futures:
    """Queued work (a RequestQueue) and its results, by request id (the oldest results dropped past
    KEPT_FUTURES)."""

    def __init__(self, queue: RequestQueue) -> None:
        self.queue = queue
        self.items: OrderedDict[str, Future] = OrderedDict()

    def submit(self, fn: Callable[[], Any] | None, model_id: str | None = None, owner: str | None = None,
               group: tuple | None = None, payload: Any = None, **extra) -> dict:
        """Queue `fn` (or `payload` in a group of key `group`) for `owner` (default `model_id`); the
        SDK's answer `{"request_id", "model_id", **extra}`."""
        request_id = uuid.uuid4().hex
        self.items[request_id] = self.queue.submit(owner or model_id, fn, group, payload)
        while len(self.items) > KEPT_FUTURES:
            self.items.popitem(last=False)
        return {"request_id": request_id, "model_id": model_id, **extra}

    async def now(self, fn: Callable[[], Any], owner: str | None = None):
        """Run `fn` in the queue and wait for its result (requests answered at once); a check `fn`
        fails (an unknown model or checkpoint) is a 400 in one line, which the SDK raises at once
        (a 500 it would retry for a minute)."""
        try:
            return await asyncio.wrap_future(self.queue.submit(owner, fn))
        except RlhfkitError as exc:
            raise HTTPException(400, one_line(exc)) from exc

    async def retrieve(self, request_id: str, poll_s: float) -> Response:
        future = self.items.get(request_id)
        if future is None:
            raise HTTPException(404, f"request_id {request_id!r}: no such request on this server")
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), poll_s)
        except asyncio.TimeoutError:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        except RlhfkitError as exc:
            return JSONResponse({"error": one_line(exc), "category": "user"})
        except Exception as exc:  # noqa: BLE001 - the server's own failure: say so, keep serving
            return JSONResponse({"error": f"server error: {one_line(exc)}", "category": "server"})
        result = future.result()
        if isinstance(result, bytes):
            return Response(result, media_type=PROTO)
        try:
            return JSONResponse(result)
        except (TypeError, ValueError) as exc:  # e.g. a NaN: say so, not a 500 the SDK retries without end
            return JSONResponse({"error": f"server error: the answer cannot be sent as JSON ({one_line(exc)})",
                                 "category": "server"})


@dataclass
class SampleRequest:
    session: str
    prompt: list  # token ids, a WireImage where an image chunk sits
    n: int
    params: dict
    options: SampleOptions

    def group(self) -> tuple:
        """Requests with the same key run in one engine call: the same n and parameters but the seed
        (any sampling session: LoRA samplers' rows each use their own adapter)."""
        return "sample", self.n, json.dumps({k: v for k, v in self.params.items() if k != "seed"}, sort_keys=True)


def runners(host: ModelHost) -> dict[str, Callable[[list], list]]:
    """The queue's group runners: forward / forward_backward requests (FwdBwdRequest) of any
    models in `host.forward_backward_many`, sample requests (SampleRequest) of one key in one
    `host.sample`; each answered with its protobuf bytes or its own error."""

    def forward_backward(requests: list[FwdBwdRequest]) -> list:
        return [r if isinstance(r, Exception) else forward_backward_output(*r)
                for r in host.forward_backward_many(requests)]

    def sample(requests: list[SampleRequest]) -> list:
        first = requests[0]
        outs = host.sample([r.session for r in requests], [r.prompt for r in requests], first.n, first.params,
                           [r.params.get("seed") for r in requests], [r.options for r in requests])
        return [out if isinstance(out, Exception) else sample_response(*out) for out in outs]

    return {"fwdbwd": forward_backward, "sample": sample}


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes is over this server's limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"request body over this server's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> dict:
    try:
        body = json.loads(await read_body(request, limit) or b"{}")
    except ValueError as exc:
        raise HTTPException(422, f"the body is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise HTTPException(422, "the body must be a JSON object")
    return body


def field(body: dict, name: str, kind: type | tuple = str):
    value = body.get(name)
    if not isinstance(value, kind):
        raise HTTPException(422, f"field {name!r}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def make_app(host: ModelHost, api_key: str, max_request_bytes: int = 64 << 20, poll_s: float = 20.0,
             max_group: int = 64) -> FastAPI:
    """The server's FastAPI app over `host` (see the module docstring); `max_group`: the most waiting
    requests run together (`app.state.queue.calls` counts the calls and their sizes)."""
    app = FastAPI(title="rlhfkit Tinker server")
    app.state.queue = RequestQueue(runners(host), max_group)
    futures = Futures(app.state.queue)
    app.state.futures = futures

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if request.url.path != "/api/v1/healthz":
            given = request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return JSONResponse({"detail": "wrong or missing API key (set TINKER_API_KEY to the server's key)"},
                                    status_code=401)
        return await call_next(request)

    async def body(request: Request) -> dict:
        return await read_json(request, max_request_bytes)

    _client_routes(app, host, body, max_request_bytes)
    _model_routes(app, host, futures, body)
    _step_routes(app, host, futures, body, max_request_bytes)
    _sampling_routes(app, host, futures, body, poll_s)
    _checkpoint_routes(app, host, futures)

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def unsupported(rest: str):
        raise HTTPException(404, f"/api/v1/{rest} is not served by rlhfkit's Tinker server")

    return app


def _client_routes(app: FastAPI, host: ModelHost, body, max_request_bytes: int) -> None:
    """Health, capabilities, the SDK's configuration, telemetry and sessions."""

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": host.name, "max_context_length": host.max_context_length,
                                      "trainable": True,
                                      "sampleable": True}]}

    @app.post("/api/v1/client/config")
    async def client_config(request: Request):
        await body(request)
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config(request: Request):
        await body(request)
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request):
        await read_body(request, max_request_bytes)
        return {"status": "accepted"}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        await body(request)
        return {"type": "create_session", "session_id": f"session-{uuid.uuid4().hex[:16]}"}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        await body(request)
        return {"type": "session_heartbeat"}


def _check_base(host: ModelHost, name: str | None) -> None:
    if name is not None and name != host.name:
        raise HTTPException(404, f"base_model {name!r}: this server serves {host.name!r} only")


# Why Tinker's other optimizer is refused (docs/tinker.md, after the losses).
DIMUON_REFUSED = ("Dimuon is not served by rlhfkit's Tinker server (its update is not published: the SDK names only "
                  "its hyperparameters, and rlhfkit's Muon is another update); use AdamW, the default "
                  "(AdamOptimizerConfig, AdamParams)")


def _check_optimizer(config) -> None:
    """422 for an optimizer_config (create_model, load_weights) that is not AdamW's."""
    kind = config.get("type") if isinstance(config, dict) else None
    if kind not in (None, "adamw"):
        raise HTTPException(422, f"optimizer_config {kind!r}: " + (DIMUON_REFUSED if kind == "dimuon" else
                                                                 "only AdamW (AdamOptimizerConfig) is served"))


def _model_routes(app: FastAPI, host: ModelHost, futures: Futures, body) -> None:
    """Training clients' models: create, describe, unload, save and load."""

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        req = await body(request)
        _check_base(host, field(req, "base_model"))
        _check_optimizer(req.get("optimizer_config"))
        lora = req.get("lora_config") or {}
        if not isinstance(lora, dict):
            raise HTTPException(422, "field 'lora_config': expected an object")

        model_id = f"{field(req, 'session_id')}:train:{field(req, 'model_seq_id', int)}"

        def run():
            host.create_model(model_id, lora.get("rank"), lora.get("seed"), lora.get("train_attn", True),
                              lora.get("train_mlp", True), lora.get("train_unembed", True))
            return {"type": "create_model", "model_id": model_id}
        return futures.submit(run)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        req = await body(request)
        model_id = field(req, "model_id")
        return await futures.now(lambda: host.info(model_id), model_id)

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish_session(session_id: str, request: Request):
        """`ServiceClient.close(status)`: the session's training models are unloaded (their saved
        checkpoints stay), after the requests queued before it."""
        await body(request)
        await futures.now(lambda: host.end_session(session_id))
        return {}

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request):
        model_id = field(await body(request), "model_id")
        return futures.submit(lambda: (host.unload(model_id), {"type": "unload_model", "model_id": model_id})[1],
                              model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        req = await body(request)
        model_id, name = field(req, "model_id"), req.get("path") or f"step-{uuid.uuid4().hex[:8]}"
        return futures.submit(lambda: {"type": "save_weights", "path": host.save_state(model_id, name)}, model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        req = await body(request)
        model_id, name = field(req, "model_id"), req.get("path")

        def run():
            uri = host.save_for_sampler(model_id, name or f"sampler-{uuid.uuid4().hex[:8]}")
            if name is not None:
                return {"type": "save_weights_for_sampler", "path": uri}
            return {"type": "save_weights_for_sampler", "path": uri, "sampling_session_id": host.create_sampler(uri)}
        return futures.submit(run, model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        req = await body(request)
        path, optimizer = field(req, "path"), bool(req.get("optimizer", False))
        _check_optimizer(req.get("optimizer_config"))
        model_id, create = req.get("model_id"), req.get("model_id") is None
        if create:
            _check_base(host, req.get("base_model"))
            model_id = f"{field(req, 'session_id')}:train:{field(req, 'model_seq_id', int)}"

        def run():
            loaded = host.load_state(model_id, path, optimizer, create)
            return {"type": "load_weights", "path": path, "model_id": loaded}
        return futures.submit(run, model_id)


def _checkpoint_routes(app: FastAPI, host: ModelHost, futures: Futures) -> None:
    """The RestClient's checkpoint listing and deletion (the other REST routes are not served)."""

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def list_checkpoints(model_id: str):
        return {"checkpoints": await futures.now(lambda: host.list_checkpoints(model_id))}

    @app.get("/api/v1/checkpoints")
    async def list_user_checkpoints(limit: int = 100, offset: int = 0):
        every = await futures.now(host.list_checkpoints)
        return {"checkpoints": every[offset:offset + limit],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(every)}}

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{kind}/{name}")
    async def delete_checkpoint(model_id: str, kind: str, name: str):
        await futures.now(lambda: host.delete_checkpoint(f"tinker://{model_id}/{kind}/{name}"))
        return {}


def _step_routes(app: FastAPI, host: ModelHost, futures: Futures, body, max_request_bytes: int) -> None:
    """The training steps: forward_backward and optim_step."""

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        if request.headers.get("content-encoding"):
            raise HTTPException(415, "compressed forward_backward bodies are not accepted (the server's client "
                                     "config turns compression off)")
        raw = await read_body(request, max_request_bytes)
        try:
            fb = parse_forward_backward(raw)
        except RlhfkitError as exc:
            raise HTTPException(422, one_line(exc)) from exc

        return futures.submit(None, fb.model_id, group=("fwdbwd",), payload=fb)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        req = await body(request)
        model_id = field(req, "model_id")
        params = req.get("adam_params")
        if not isinstance(params, dict):
            other = req.get("optimizer_params")
            kind = other.get("type") if isinstance(other, dict) else None
            raise HTTPException(422, "optim_step: " + (DIMUON_REFUSED if kind == "dimuon" else
                                                       "only AdamW is served here; send AdamParams"))
        return futures.submit(lambda: {"metrics": host.optim_step(model_id, params)}, model_id)


def _sampling_routes(app: FastAPI, host: ModelHost, futures: Futures, body, poll_s: float) -> None:
    """Sampling sessions, sampling (batched across concurrent requests) and the futures' results."""
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        req = await body(request)
        _check_base(host, req.get("base_model"))
        model_path = req.get("model_path")
        if not (model_path is None or isinstance(model_path, str)):
            raise HTTPException(422, f"field 'model_path': expected a tinker:// path, got {model_path!r}")
        session = await futures.now(lambda: host.create_sampler(model_path))
        return {"type": "create_sampling_session", "sampling_session_id": session}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def sampler(sampler_id: str):
        known, path = await futures.now(lambda: host.sampler_path(sampler_id))
        if not known:
            raise HTTPException(404, f"sampler {sampler_id!r}: no such sampling session")
        return {"sampler_id": sampler_id, "base_model": host.name, "model_path": path}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        req = await body(request)
        session = field(req, "sampling_session_id")
        prompt = _prompt_tokens(req)
        n = field(req, "num_samples", int)
        params = req.get("sampling_params") or {}
        if not 1 <= n <= 256:
            raise HTTPException(422, f"num_samples {n}: give 1..256")
        if not isinstance(params, dict) or not isinstance(params.get("seed"), (int, type(None))):
            raise HTTPException(422, f"field 'sampling_params': expected SamplingParams (an integer seed), "
                                     f"got {params!r}")

        sample = SampleRequest(session, prompt, n, params, _sample_options(req))
        return futures.submit(None, owner=session, group=sample.group(), payload=sample,
                              sample_sequence_ids=[uuid.uuid4().hex for _ in range(n)])

    @app.post("/api/v1/retrieve_future")
    async def retrieve(request: Request):
        return await futures.retrieve(field(await body(request), "request_id"), poll_s)


# SampleRequest fields this server does not serve, and the value that asks for nothing.
UNSERVED_SAMPLE_FIELDS = {"target_prompt_logprobs": None, "prompt_alt_tokens_k": 0, "prompt_logprobs_last_n": None}


def _sample_options(req: dict) -> SampleOptions:
    """The logprobs a sample request asks for (422 in one line for a field this server refuses)."""
    for name, nothing in UNSERVED_SAMPLE_FIELDS.items():
        if req.get(name, nothing) != nothing:
            raise HTTPException(422, f"sample: {name} is not served by rlhfkit's Tinker server; served are "
                                     "include_prompt_logprobs, topk_prompt_logprobs and topk_sample_logprobs")
    try:
        return SampleOptions(bool(req.get("prompt_logprobs")),
                             check_topk(req.get("topk_prompt_logprobs", 0), "topk_prompt_logprobs"),
                             check_topk(req.get("topk_sample_logprobs", 0), "topk_sample_logprobs"))
    except RlhfkitError as exc:
        raise HTTPException(422, one_line(exc)) from exc


def _prompt_tokens(req: dict) -> list:
    """The prompt's tokens, each image chunk a WireImage in its place (422 for a chunk not served)."""
    prompt = req.get("prompt")
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list):
        raise HTTPException(422, "field 'prompt': expected a ModelInput with chunks")
    tokens: list = []
    for chunk in chunks:
        kind = chunk.get("type", "encoded_text") if isinstance(chunk, dict) else None
        if kind == "image":
            tokens.append(_image_chunk(chunk))
            continue
        if kind != "encoded_text":
            raise HTTPException(422, f"prompt: a {kind} chunk; served are encoded_text and image chunks (an image "
                                     "by reference, image_asset_pointer, is not fetched: send its bytes)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise HTTPException(422, "prompt: a chunk's tokens must be a list of ints")
        tokens += ids
    return tokens


def _image_chunk(chunk: dict) -> WireImage:
    expected = chunk.get("expected_tokens")
    try:
        data = base64.b64decode(chunk.get("data") or "", validate=True)
    except (binascii.Error, TypeError) as exc:
        raise HTTPException(422, f"prompt: an image chunk's data is not base64 ({exc})") from exc
    if not isinstance(chunk.get("format"), str) or not (expected is None or isinstance(expected, int)):
        raise HTTPException(422, "prompt: an image chunk needs format (png or jpeg) and an integer expected_tokens")
    return WireImage(data, chunk["format"], expected)
