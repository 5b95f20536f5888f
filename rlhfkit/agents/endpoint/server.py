"""An OpenAI-compatible HTTP endpoint over a rlhfkit generation engine, for black-box agents.

    with EndpointServer(tokenizer, settings) as server:        # binds 127.0.0.1 on a free port
        server.engine = engine
        e = server.open_episode(group_id=0, seed=7, limits=EndpointLimits())
        client = openai.AsyncOpenAI(base_url=server.url(e), api_key=e.key)
        ...                                                    # the agent calls its base URL
        calls = server.close_episode(e.id).calls               # what the engine sampled for it

Routes per episode, under `/e/<episode id>/v1`: `POST chat/completions`, `POST completions`,
`POST responses` (OpenAI's Responses API, served as a chat completion: responses.py), `GET models`;
`GET /health` needs no key. With `serve_key` (rlhfkit serve) the same routes are
served at `/v1` for that one key, and nothing is recorded. Requests from many episodes are
batched into one engine call: the batcher waits until every open episode has a call waiting, or
`batch_window` seconds pass without a new one, then generates them together (grouped by sampling
parameters) in a worker thread while the server goes on taking requests. Each episode's k-th call
samples with the k-th seed drawn from the episode's seed, so its tokens do not depend on the others.
A call with images (a vision-language policy) hands its image tensors to the engine with its prompt.

The server runs in its own thread with its own event loop (uvicorn); `close` stops it, and both
threads end (no port or thread outlives it). It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import re
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlhfkit.agents.endpoint import responses
from rlhfkit.agents.endpoint.episodes import SERVE_ID, EndpointLimits, Episode, Refused, Registry
from rlhfkit.agents.endpoint.handlers import Completions, Settings
from rlhfkit.agents.endpoint.wire import BadRequest, stream_events
from rlhfkit.data.types import Trajectory
from rlhfkit.errors import RlhfkitError, one_line
from rlhfkit.rewards.server import read_limited
from rlhfkit.rollout.base import SamplingParams

log = logging.getLogger("rlhfkit")
HOST = "127.0.0.1"
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class Batcher:
    """Gathers generation requests and runs them as batched engine calls (see the module docstring)."""

    def __init__(self, server: EndpointServer, window: float):
        self.server, self.window = server, window
        self.pending: list[tuple[list[int], SamplingParams, int, asyncio.Future, object, object, object]] = []
        self.last = 0.0
        self.task: asyncio.Task | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlhfkit-endpoint-engine")

    async def submit(self, ids: list[int], params: SamplingParams, seed: int, who: object,
                     vision: object = None, constraint: object = None) -> list[Trajectory]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, params, seed, future, who, vision, constraint))
        self.last = time.monotonic()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.flush())
        return await future

    def ready(self) -> bool:
        waiting = len({id(p[4]) for p in self.pending})
        running = self.server.registry.running()
        return (running and waiting >= running) or time.monotonic() - self.last >= self.window

    async def flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self.pending:
            while not self.ready():
                await asyncio.sleep(self.window / 4)
            batch, self.pending = self.pending, []
            groups: dict[SamplingParams, list] = {}
            for item in batch:
                groups.setdefault(item[1], []).append(item)
            for params, items in groups.items():
                live = [it for it in items if not it[3].done()]  # a client that gave up
                if not live:
                    continue
                try:
                    trajs = await loop.run_in_executor(self.pool, self._generate, [it[0] for it in live], params,
                                                       [it[2] for it in live], [it[5] for it in live],
                                                       [it[6] for it in live])
                except Exception as exc:  # noqa: BLE001 - NaN weights and the like: the run reports them
                    self.server.engine_error = self.server.engine_error or exc
                    for it in live:
                        if not it[3].done():
                            it[3].set_exception(exc)
                    continue
                for j, it in enumerate(live):
                    if not it[3].done():
                        it[3].set_result(trajs[j * params.n:(j + 1) * params.n])

    def _generate(self, prompts, params, seeds, vision, constraints) -> list[Trajectory]:
        engine = self.server.engine
        if engine is None:
            raise RuntimeError("the endpoint has no engine")
        more = {"vision": vision} if any(v is not None for v in vision) else {}  # a VisionEngine takes them
        if any(c is not None for c in constraints):  # response_format (an unconstrained call passes nothing)
            more["constraints"] = constraints
        return engine.generate(prompts, params, seeds=seeds, **more)


class EndpointServer:
    """The endpoint (see the module docstring).

    Args:
      tokenizer: the policy's tokenizer (its chat template renders messages).
      settings: the run's sampling parameters, whether requests may set their own, the tool parser.
      batch_window: seconds the batcher waits for more calls once a call is waiting.
      serve_key: serve plain `/v1` routes to this bearer key, recording nothing (rlhfkit serve).
      serve_limits: the limits of one `/v1` request.
      port: the port to bind (0: a free one).
    """

    def __init__(self, tokenizer, settings: Settings, batch_window: float = 0.02, serve_key: str | None = None,
                 serve_limits: EndpointLimits | None = None, port: int = 0, host: str = HOST):
        if host not in (HOST, "localhost", "::1"):
            log.warning("agent endpoint: listening on %s, not only on this machine's loopback", host)
        self.tokenizer, self.settings = tokenizer, settings
        self.serve_key, self.serve_limits = serve_key, serve_limits or EndpointLimits()
        self.registry = Registry()
        self.engine = None
        self.engine_error: BaseException | None = None
        self.batcher = Batcher(self, batch_window)
        self.completions = Completions(tokenizer, settings, self.registry, self._generate)
        self._host, self._port = host, port
        self._server = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port = 0

    async def _generate(self, ids, params, seed, who, vision=None, constraint=None):
        if constraint is not None and not takes_constraints(self.engine):
            raise BadRequest(f"response_format: this run's engine ({type(self.engine).__name__}) samples no structured "
                             "outputs; the HF and vLLM engines do")
        return await self.batcher.submit(ids, params, seed, who, vision, constraint)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EndpointServer:
        import uvicorn  # noqa: PLC0415 - the serve extra

        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._socket, self.port = sock, sock.getsockname()[1]
        config = uvicorn.Config(make_app(self), log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="rlhfkit-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RlhfkitError(f"the agent endpoint did not start on {self._host}:{self.port}")
            time.sleep(0.005)
        return self

    def close(self) -> None:
        """Stop serving: the server thread and the engine thread end, the port is released."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.batcher.pool.shutdown(wait=True)
        if self._socket is not None:
            self._socket.close()
        self._server, self._thread, self._socket = None, None, None

    def __enter__(self) -> EndpointServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ episodes
    @property
    def base(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    def url(self, e: Episode) -> str:
        return f"{self.base}/e/{e.id}/v1"

    def open_episode(self, group_id: int, seed: int, limits: EndpointLimits) -> Episode:
        return self.registry.open(group_id, seed, limits)

    def close_episode(self, episode_id: str) -> Episode:
        return self.registry.close(episode_id)


def takes_constraints(engine) -> bool:
    """Whether `engine.generate` takes per-prompt `constraints` (structured outputs)."""
    try:
        return "constraints" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def _json_object(raw: bytes) -> dict:
    """The request body's JSON object; `BadRequest` when it is not one, or holds text no tokenizer takes (an
    unpaired UTF-16 surrogate escape such as "\\ud800", which JSON parses but UTF-8 cannot encode)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from exc
    except RecursionError as exc:
        raise BadRequest("the body's JSON is nested too deeply") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if _SURROGATE.search(raw):  # paired escapes (an emoji) parse to one character; only unpaired ones fail here
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise BadRequest("the body holds an unpaired UTF-16 surrogate escape (such as \\ud800); send valid "
                             "Unicode text") from exc
    return body


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


class _Handlers:
    """What the routes do: admit a call (an episode's key, or `rlhfkit serve`'s key), run it, and answer
    refusals and failures as the OpenAI API does."""

    def __init__(self, server: EndpointServer):
        self.server, self.reg = server, server.registry

    def serve_episode(self, request: Request) -> Episode:
        given, key = request.headers.get("authorization") or "", self.server.serve_key
        if key is None:
            raise self.reg.refuse(None, 404, "refused_unknown", "this endpoint serves episodes at /e/<episode id>/v1; "
                                  "use the base URL the agent was given")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise self.reg.refuse(None, 401, "refused_auth", "missing or wrong bearer key")
        return Episode(SERVE_ID, "", 0, secrets.randbits(62), self.server.serve_limits)

    async def run(self, request: Request, episode_id: str | None, chat: bool, api: str = "completions"):
        """Serve one call; `api` "responses": a Responses API request, served as a chat completion."""
        reg, completions, admitted = self.reg, self.server.completions, None
        try:
            e = self.serve_episode(request) if episode_id is None else reg.admit(episode_id,
                                                                                 request.headers.get("authorization"))
            admitted = e
            body = _json_object(await read_limited(request, e.limits.max_request_bytes))
            gone = request.is_disconnected
            if api == "responses":
                reply = await responses.serve(completions, e, body, gone)
            else:
                reply = await (completions.chat(e, body, gone) if chat else completions.text(e, body, gone))
        except Refused as exc:
            return _error(exc.status, exc.message)
        except BadRequest as exc:
            reg.count("bad_request")
            return _error(400, str(exc))
        except RlhfkitError as exc:
            reg.count("bad_request")
            return _error(400, one_line(exc))
        except Exception as exc:  # noqa: BLE001 - the engine's failure: the run reports it, the agent gets 500
            if getattr(exc, "status_code", None) == 413:
                reg.count("refused_too_large")
                return _error(413, str(getattr(exc, "detail", exc)))
            reg.count("server_error")
            return _error(500, f"generation failed: {one_line(exc)}", "server_error")
        finally:
            if admitted is not None and admitted.id != SERVE_ID:
                reg.release(admitted)
        if body.get("stream") and api == "responses":
            return StreamingResponse(iter(responses.stream_events(reply)), media_type="text/event-stream")
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(iter(stream_events(reply, chat, usage)), media_type="text/event-stream")
        return JSONResponse(reply)

    def models(self, request: Request, episode_id: str | None):
        try:
            if episode_id is None:
                self.serve_episode(request)
            else:
                self.reg.release(self.reg.admit(episode_id, request.headers.get("authorization")))
        except Refused as exc:
            return _error(exc.status, exc.message)
        name = self.server.settings.model_name
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "rlhfkit"}]}


def make_app(server: EndpointServer):
    """The FastAPI app of `server`'s routes: an episode's own base URL /e/<id>/v1, and /v1 for `rlhfkit serve`."""
    app = FastAPI(title="rlhfkit agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    h = _Handlers(server)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # an unknown route or method: OpenAI's shape
        what = {404: "no such route", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
        return _error(exc.status_code, f"{what}: {request.method} {request.url.path}")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/e/{episode_id}/v1/chat/completions")
    async def chat_e(episode_id: str, request: Request):
        return await h.run(request, episode_id, chat=True)

    @app.post("/e/{episode_id}/v1/completions")
    async def text_e(episode_id: str, request: Request):
        return await h.run(request, episode_id, chat=False)

    @app.post("/e/{episode_id}/v1/responses")
    async def responses_e(episode_id: str, request: Request):
        return await h.run(request, episode_id, chat=True, api="responses")

    @app.get("/e/{episode_id}/v1/models")
    async def models_e(episode_id: str, request: Request):
        return h.models(request, episode_id)

    @app.post("/v1/chat/completions")
    async def chat_v1(request: Request):
        return await h.run(request, None, chat=True)

    @app.post("/v1/completions")
    async def text_v1(request: Request):
        return await h.run(request, None, chat=False)

    @app.post("/v1/responses")
    async def responses_v1(request: Request):
        return await h.run(request, None, chat=True, api="responses")

    @app.get("/v1/models")
    async def models_v1(request: Request):
        return h.models(request, None)

    return app
