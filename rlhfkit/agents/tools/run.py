"""Execute a turn's tool calls: in parallel, each under a time limit, failures as results.

Every call becomes one `role: "tool"` message. A call that cannot run is answered with an
error message the model reads, and the episode goes on: an unknown tool, arguments that do not
fit the function's signature or its schema's types (`ToolSet.arguments`), a malformed call (from
the parser), a tool that raises (or calls sys.exit), one that
runs past `ToolLimits.seconds_per_call` (its result is abandoned: a sync tool's thread is left to
finish on its own, an async tool is cancelled). A result longer than `tokens_per_result` tokens
is cut there. Calls beyond `calls_per_episode` are not run; one message says how many were
dropped. A tool function with a `max_concurrency` attribute (builtin:python: one program per CPU
core) runs at most that many calls at once; the others wait, and their time limit starts when
they run. What tools print to stdout is captured (and dropped), not mixed into the trainer's output.

`ToolStats` counts per tool: calls, errors, timeouts and the mean latency (seconds), logged as
`tools/NAME/calls` etc.; malformed calls and calls of unknown tools count under `<invalid>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rlhfkit.agents.base import gather_or_cancel
from rlhfkit.agents.tools.schema import ToolCall, ToolSet
from rlhfkit.errors import ConfigError, first_line

INVALID = "<invalid>"


@dataclass(frozen=True)
class ToolLimits:
    """Limits of tool use: calls per episode, seconds per call, tokens per result."""

    calls_per_episode: int = 8
    seconds_per_call: float = 10.0
    tokens_per_result: int = 256

    def __post_init__(self) -> None:
        if self.calls_per_episode < 1 or self.seconds_per_call <= 0 or self.tokens_per_result < 1:
            raise ConfigError(f"tool limits need calls_per_episode >= 1, seconds_per_call > 0 and "
                              f"tokens_per_result >= 1, got {self}")


@dataclass
class ToolStats:
    """Per-tool counters: name -> [calls, errors, timeouts, total seconds]."""

    counts: dict[str, list[float]] = field(default_factory=dict)
    dropped: int = 0  # calls over the per-episode limit

    def add(self, name: str, seconds: float = 0.0, error: bool = False, timeout: bool = False) -> None:
        c = self.counts.setdefault(name, [0, 0, 0, 0.0])
        c[0] += 1
        c[1] += error or timeout
        c[2] += timeout
        c[3] += seconds

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"tools/dropped_calls": float(self.dropped)}
        for name, (calls, errors, timeouts, seconds) in sorted(self.counts.items()):
            out |= {f"tools/{name}/calls": float(calls), f"tools/{name}/errors": float(errors),
                    f"tools/{name}/timeouts": float(timeouts), f"tools/{name}/mean_latency_s": seconds / calls}
        return out


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


class ToolRunner:
    """Runs calls of `tools` under `limits`, counting in `stats`; `tokenizer` cuts long results."""

    def __init__(self, tools: ToolSet, limits: ToolLimits | None = None, tokenizer=None,
                 stats: ToolStats | None = None, slots: dict[str, asyncio.Semaphore] | None = None):
        self.tools, self.limits, self.tokenizer = tools, limits or ToolLimits(), tokenizer
        self.stats = stats if stats is not None else ToolStats()
        # tool name -> its semaphore, for tools with a `max_concurrency` attribute (one event loop's)
        self.slots: dict[str, asyncio.Semaphore] = {} if slots is None else slots

    def cut(self, text: str) -> str:
        """`text` cut to `tokens_per_result` tokens (characters only read up to 16 per token)."""
        n = self.limits.tokens_per_result
        head = text[: 16 * n]
        if self.tokenizer is None:
            return head if len(head) == len(text) else head + " ...[cut]"
        ids = self.tokenizer(head, add_special_tokens=False)["input_ids"]
        if len(ids) <= n and len(head) == len(text):
            return text
        return self.tokenizer.decode(ids[:n]) + " ...[cut]"

    async def run(self, calls: list[ToolCall], errors: list[str], used: int = 0) -> list[dict]:
        """The tool messages answering one turn: `calls` (run in parallel, at most what is left of
        the episode's `calls_per_episode` after `used`) and the parser's `errors`."""
        room = max(self.limits.calls_per_episode - used, 0)
        run, over = calls[:room], calls[room:]
        with contextlib.redirect_stdout(io.StringIO()):
            results = await gather_or_cancel(self._one(c) for c in run)
        messages = [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r}
                    for c, r in zip(run, results)]
        for e in errors:
            self.stats.add(INVALID, error=True)
            messages.append({"role": "tool", "name": INVALID, "content": f"error: {e}"[:1000]})
        if over:
            self.stats.dropped += len(over)
            messages.append({"role": "tool", "name": INVALID, "content": (
                f"error: {len(over)} call(s) not run: at most {self.limits.calls_per_episode} tool calls "
                "per episode")})
        return messages

    async def _one(self, call: ToolCall) -> str:
        fn = self.tools.functions.get(call.name)
        if fn is None:
            self.stats.add(INVALID, error=True)
            return f"error: unknown tool {call.name!r}; the tools are {', '.join(self.tools.names)}"
        try:
            arguments = self.tools.arguments(call.name, call.arguments)
        except TypeError as exc:
            self.stats.add(call.name, error=True)
            return f"error: wrong arguments for {call.name}: {exc}"
        async with self._slot(call.name, fn):  # the time limit starts once the call may run
            return await self._timed(call, fn, arguments)

    def _slot(self, name: str, fn: Any) -> contextlib.AbstractAsyncContextManager:
        """What a call of `fn` waits for: one of its `max_concurrency` slots (shared by the runners
        given the same `slots`), or nothing for a tool without that attribute."""
        n = getattr(fn, "max_concurrency", None)
        if not n:
            return contextlib.nullcontext()
        return self.slots.setdefault(name, asyncio.Semaphore(n))

    async def _timed(self, call: ToolCall, fn: Any, arguments: dict[str, Any]) -> str:
        """The result of `fn(**arguments)` as text, or the error message the model reads."""
        start = time.perf_counter()
        try:
            coro = _no_exit(fn(**arguments)) if inspect.iscoroutinefunction(fn) else _in_thread(fn, arguments)
            text = _as_text(await asyncio.wait_for(coro, self.limits.seconds_per_call))
        except asyncio.TimeoutError:
            self.stats.add(call.name, time.perf_counter() - start, timeout=True)
            return f"error: {call.name} timed out after {self.limits.seconds_per_call:g} s"
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the tool's own failure (an argparse exit too)
            self.stats.add(call.name, time.perf_counter() - start, error=True)
            kind = "SystemExit" if isinstance(exc, _Exited) else type(exc).__name__
            return f"error: {call.name} raised {kind}: {first_line(exc)}"
        self.stats.add(call.name, time.perf_counter() - start)
        return self.cut(text)


class _Exited(Exception):
    """An async tool's SystemExit, as an ordinary exception: a task hands SystemExit on to the event
    loop (asyncio.run would end the whole run) even when the code awaiting the task catches it."""


async def _no_exit(coro: Any) -> Any:
    try:
        return await coro
    except SystemExit as exc:
        raise _Exited(exc.code) from None


def _in_thread(fn, kwargs: dict) -> asyncio.Future:
    """`fn(**kwargs)` in a daemon thread (one that hangs past its timeout does not block exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def work() -> None:
        try:
            value, ok = fn(**kwargs), True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting call
            value, ok = exc, False
        with contextlib.suppress(RuntimeError):  # the loop closed after a timeout
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=work, daemon=True, name=f"tool-{getattr(fn, '__name__', 'fn')}").start()
    return future
