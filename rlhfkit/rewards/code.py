"""Code-execution reward: model-written Python judged test by test from outside its process.

A label (the tests of one prompt) is one of, as a dict or its JSON string:
  * {"tests": ["assert add(1, 2) == 3", ...]}, a JSON list of such strings, or plain assert
    source (one test per top-level `assert`; other statements before it are its set-up);
  * {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}: stdin -> stdout cases (APPS/TACO
    `input_output`), outputs compared line by line with whitespace runs collapsed;
  * {"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}: call fn_name(*input) and
    compare with the output (an output given as [value], as APPS does, matches value too); a
    LeetCode-style `class Solution` method of that name is called on Solution().

How a test is judged locally (the solution cannot forge a pass):
  * each test gets a fresh sandboxed child (`CodeSandbox`, bwrap by default) that runs the solution;
  * function tests (asserts, fn_name) are evaluated in the parent, never in the child: the
    solution's top-level functions and classes become proxies, a call is sent to the child as
    JSON, and the child sends back the returned value serialized from plain types only (None,
    bool, int, float, str, bytes, list, tuple, dict, set of exactly these types; any other object
    stays in the child as a handle whose methods can be called, and which equals nothing but
    itself). A test passes when the assert holds in the parent. The expected values never enter
    the child, and nothing it prints, no exit status, no patched builtin and no object with a
    forged `__eq__` reaches the comparison;
  * stdin -> stdout tests pass when the child exits with status 0 and its stdout matches.
The test sources come from the dataset and run in the trainer process, as a reward file does.
With a remote sandbox (`RemoteSandbox`), each call of a function test is one stateless run that
replays the test's earlier calls and prints the replies after a per-run random token; the trainer
still compares the values (see `rlhfkit.rewards.code_remote` for what that guarantees less).
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import os
import re
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards.base import RewardOutput, response_texts
from rlhfkit.rewards.code_remote import RemoteSandbox
from rlhfkit.rewards.code_sandbox import LOCAL_BACKENDS, CodeSandbox, RunResult
from rlhfkit.rewards.code_values import CHILD_SOURCE, decode_value, encode_value

__all__ = ["CodeSandbox", "RemoteSandbox", "RunResult", "CodeTests", "TestResult", "code_reward", "extract_code",
           "make_sandbox", "parse_tests", "run_tests"]
BACKENDS = (*LOCAL_BACKENDS, "remote")

_BLOCK_RE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
_MAX_MESSAGE = 1 << 22  # most bytes of one reply from the child

# The child of a function test: runs the solution (_SOURCE), then answers calls (one JSON line each
# way) read from _RD, replies written to _WR after the bytes _PRE (locally: two pipes and no prefix;
# remotely: stdin, and stdout with a newline and the run's token). Nothing it writes is trusted:
# the parent decodes strictly.
_SERVER = CHILD_SOURCE + r'''
import json as _json, os as _os, sys as _sys
def _serve():
    rd = _os.fdopen(_RD, "rb", 0)
    wr = _os.fdopen(_WR, "wb", 0)
    refs = []
    def keep(x):
        refs.append(x)
        return {"ref": len(refs) - 1}
    def enc(x):
        return encode_value(x, keep)
    def dec(x):
        return decode_value(x, refs.__getitem__)
    def send(obj):
        wr.write(_PRE + _json.dumps(obj).encode() + b"\n")
    code = compile(_SOURCE, "solution.py", "exec")
    ns = {"__name__": "solution", "__builtins__": __builtins__}
    if HOOK:
        _install_hook()
    try:
        exec(code, ns)
    except BaseException as e:
        send({"error": type(e).__name__ + ": " + str(e)[:500]})
        return
    mods = {k: v.__name__ for k, v in ns.items() if type(v) is type(_sys) and type(v.__name__) is str}
    send({"names": [k for k, v in ns.items() if callable(v) and not k.startswith("__")], "modules": mods})
    for line in rd:
        try:
            req = _json.loads(line)
            target = ns[req["name"]] if "name" in req else refs[req["ref"]]
            if "attr" in req:
                target = getattr(target, req["attr"])
            value = target(*dec(req["args"]), **{k: dec(v) for k, v in req["kwargs"].items()})
            send({"value": enc(value)})
        except BaseException as e:
            try:
                send({"error": type(e).__name__ + ": " + str(e)[:500]})
            except BaseException:
                send({"error": type(e).__name__})
_serve()
'''


Sandbox = CodeSandbox | RemoteSandbox


class ProtocolError(Exception):
    """The child broke the call protocol (exited, timed out, or sent something malformed)."""


class SolutionError(Exception):
    """The solution's function raised, or the solution failed to load."""


# ---------------------------------------------------------------------- labels
@dataclass(frozen=True)
class CodeTests:
    """The tests of one prompt: kind "assert" (tests = sources), "call" (fn_name, inputs,
    outputs) or "stdio" (inputs = stdin texts, outputs = expected stdout texts)."""

    kind: str
    tests: tuple[str, ...] = ()
    fn_name: str | None = None
    inputs: tuple[Any, ...] = ()
    outputs: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self.tests) if self.kind == "assert" else len(self.inputs)


def parse_tests(label: Any) -> CodeTests:
    """A label (see the module docstring) as CodeTests; RewardError when it is none of the formats."""
    if isinstance(label, CodeTests):
        return label
    data = label
    if isinstance(label, (str, bytes)):
        text = label.decode() if isinstance(label, bytes) else label
        try:
            data = json.loads(text)
        except ValueError:
            return CodeTests("assert", tuple(split_asserts(text)))
        if isinstance(data, str):
            return CodeTests("assert", tuple(split_asserts(data)))
    if isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        return CodeTests("assert", tuple(t for s in data for t in split_asserts(s)))
    if isinstance(data, dict):
        if "tests" in data:
            return parse_tests(list(data["tests"]) if not isinstance(data["tests"], str) else data["tests"])
        if "input_output" in data:
            return parse_tests(data["input_output"])
        if "inputs" in data and "outputs" in data:
            inputs, outputs = list(data["inputs"]), list(data["outputs"])
            if len(inputs) != len(outputs):
                raise RewardError(f"code label: {len(inputs)} inputs but {len(outputs)} outputs")
            if data.get("fn_name"):
                return CodeTests("call", fn_name=str(data["fn_name"]), inputs=tuple(inputs), outputs=tuple(outputs))
            return CodeTests("stdio", inputs=tuple(_text(i) for i in inputs), outputs=tuple(_text(o) for o in outputs))
    raise RewardError("code label must be assert source, a JSON list of assert sources, or JSON with "
                      f"'tests', or 'inputs'/'outputs' (and 'fn_name'); got {str(label)[:80]!r}")


def split_asserts(source: str) -> list[str]:
    """One test per top-level `assert`, each with the other statements before it as set-up."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return [source]
    lines = source.splitlines(keepends=True)
    tests, setup = [], []
    for node in body:
        text = "".join(lines[node.lineno - 1:node.end_lineno])
        if isinstance(node, ast.Assert):
            tests.append("".join(setup) + text)
        else:
            setup.append(text)
    return tests or [source]


def _text(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)):
        return "\n".join(map(str, x))
    return str(x)


def normalize_output(text: str) -> list[str]:
    """Lines with whitespace runs collapsed, blank lines at the end dropped."""
    lines = [" ".join(line.split()) for line in text.strip().splitlines()]
    return lines


def extract_code(response: str) -> str:
    """The last ```python (or bare ```) block of `response`, else the whole response."""
    blocks = _BLOCK_RE.findall(response)
    return blocks[-1] if blocks else response


# ---------------------------------------------------------------------- values across the boundary
def _handle(x: Any) -> dict:
    """The form of a non-plain argument: only an object of the solution can be passed back to it."""
    if type(x) is RemoteObject:
        return {"ref": x._ref}
    raise TypeError(f"cannot pass a {type(x).__name__} to the solution")


def _encode(x: Any) -> Any:
    """A value sent to the child: plain types, or a handle of an object living there."""
    return encode_value(x, _handle)


def _decode(x: Any, conn: _Session) -> Any:
    """A value from the child, checked type by type (anything else is a ProtocolError)."""
    try:
        return decode_value(x, lambda ref: RemoteObject(conn, ref))
    except ValueError as exc:
        raise ProtocolError(f"from the child: {exc}") from None


class RemoteObject:
    """An object that stays in the child: its methods can be called; it equals only itself."""

    __slots__ = ("_conn", "_ref")

    def __init__(self, conn: _Session, ref: int):
        self._conn, self._ref = conn, ref

    def __getattr__(self, name: str) -> RemoteFunction:
        if name.startswith("__"):
            raise AttributeError(name)
        return RemoteFunction(self._conn, {"ref": self._ref, "attr": name})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.call({"ref": self._ref}, args, kwargs)

    def __repr__(self) -> str:
        return f"<object {self._ref} of the solution>"


class RemoteFunction:
    """A function or class of the solution: calling it runs it in the child."""

    def __init__(self, conn: _Session, target: dict):
        self._conn, self._target = conn, target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.call(self._target, args, kwargs)

    def __getattr__(self, name: str) -> RemoteFunction:
        if name.startswith("__") or "attr" in self._target:
            raise AttributeError(name)
        return RemoteFunction(self._conn, {**self._target, "attr": name})


class _Session:
    """The solution loaded in a sandbox, answering calls: `handshake`, then `namespace` for the test.
    Subclasses say how a message travels: `_hello` (the first message) and `_request`."""

    timed_out = False

    def handshake(self) -> None:
        """Wait for the solution to load; its top-level callables' names, or SolutionError."""
        first = self._hello()
        if "error" in first:
            raise SolutionError(str(first["error"]))
        names = first.get("names")
        if type(names) is not list or not all(type(n) is str for n in names):
            raise ProtocolError("malformed first message")
        self.names = names
        mods = first.get("modules", {})
        self.modules = {k: v for k, v in mods.items() if type(k) is str and type(v) is str
                        and v.split(".")[0] in sys.stdlib_module_names} if type(mods) is dict else {}

    def namespace(self) -> dict:
        """The test's globals: a proxy per function or class of the solution, and the standard
        library modules it imported (imported here: `import math` in the solution, math.isclose in
        a test)."""
        ns = {}
        for name, module in self.modules.items():
            try:
                ns[name] = importlib.import_module(module)
            except ImportError:
                pass
        ns.update({n: RemoteFunction(self, {"name": n}) for n in self.names})
        return ns

    def call(self, target: dict, args: Sequence, kwargs: dict) -> Any:
        msg = {**target, "args": [_encode(a) for a in args], "kwargs": {k: _encode(v) for k, v in kwargs.items()}}
        reply = self._request(msg)
        if "error" in reply:
            raise SolutionError(str(reply["error"])[:500])
        if "value" not in reply:
            raise ProtocolError("malformed reply")
        return _decode(reply["value"], self)

    def _hello(self) -> dict:
        raise NotImplementedError

    def _request(self, msg: dict) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        """End the child (if any) and remove its traces."""


def _parse_reply(line: bytes) -> dict:
    try:
        reply = json.loads(line)
    except ValueError as e:
        raise ProtocolError("malformed reply") from e
    if type(reply) is not dict:
        raise ProtocolError("malformed reply")
    return reply


class _PipeSession(_Session):
    """One local sandboxed child that loads the solution once and answers calls over two pipes."""

    def __init__(self, sandbox: CodeSandbox, source: str):
        self._stack = ExitStack()
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        self._buf = b""
        self.deadline = time.monotonic() + sandbox.wall_seconds
        try:
            self.proc = self._stack.enter_context(sandbox.started(
                f"_RD, _WR, _PRE = {req_r}, {rep_w}, b''\n" + _SERVER, source, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(req_r, rep_w)))
        except BaseException:
            self.close()
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)

    def _hello(self) -> dict:
        return self._recv()

    def _request(self, msg: dict) -> dict:
        try:
            os.write(self._req_w, json.dumps(msg).encode() + b"\n")
        except OSError as e:
            raise ProtocolError("the child is gone") from e
        return self._recv()

    def _recv(self) -> dict:
        while b"\n" not in self._buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                raise ProtocolError("timed out")
            ready, _, _ = select.select([self._rep_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._rep_r, 1 << 16)
            if not chunk:
                raise ProtocolError("the child exited")
            self._buf += chunk
            if len(self._buf) > _MAX_MESSAGE:
                raise ProtocolError("reply too large")
        line, self._buf = self._buf.split(b"\n", 1)
        return _parse_reply(line)

    def close(self) -> None:
        """Close the requests pipe (the child's serving loop ends and it exits), then end it."""
        for fd in (self._req_w, self._rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        self._stack.close()


class _ReplaySession(_Session):
    """The solution on a stateless runner (`RemoteSandbox.run`): every request is a run that loads
    the solution, replays the test's earlier calls and answers the new one; the replies are the
    stdout lines that start with a per-run random token."""

    def __init__(self, sandbox: Any, source: str):
        self.sandbox, self.source, self.log = sandbox, source, []

    def _hello(self) -> dict:
        return self._run()[0]

    def _request(self, msg: dict) -> dict:
        self.log.append(msg)
        replies = self._run()
        if len(replies) != len(self.log) + 1 or "error" in replies[0]:
            raise ProtocolError("the replay ended early")
        return replies[-1]

    def _run(self) -> list[dict]:
        token = secrets.token_hex(16)
        program = (f"_SOURCE = {self.source!r}\nHOOK = False\n_RD, _WR, _PRE = 0, 1, b'\\n{token}'\n" + _SERVER)
        result = self.sandbox.run(program, stdin="".join(json.dumps(m) + "\n" for m in self.log))
        self.timed_out |= result.timed_out
        marker = token.encode()
        replies = [_parse_reply(line[line.index(marker) + len(marker):])
                   for line in result.output.encode().split(b"\n") if marker in line]
        if not replies:
            raise ProtocolError("no reply from the run")
        return replies


# ---------------------------------------------------------------------- judging
@dataclass(frozen=True)
class TestResult:
    """Per-test outcomes of one solution."""

    passed: tuple[bool, ...]
    timed_out: bool

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


def run_tests(code: str, tests: Any, sandbox: Sandbox, stop_at_first_failure: bool = False) -> TestResult:
    """Judge `code` (the solution's source) on each test of `tests` (a label) in its own child.

    Raises:
      RewardError: a remote sandbox server failed (a sandbox failure is never scored as a fail)."""
    spec = parse_tests(tests)
    passed, timed_out = [], False
    for i in range(len(spec)):
        if spec.kind == "stdio":
            r = sandbox.run(code, stdin=spec.inputs[i])
            ok = r.passed and normalize_output(r.output) == normalize_output(spec.outputs[i])
            timed_out |= r.timed_out
        else:
            ok, t = _function_test(code, spec, i, sandbox)
            timed_out |= t
        passed.append(ok)
        if stop_at_first_failure and not ok:
            passed.extend([False] * (len(spec) - len(passed)))
            break
    return TestResult(tuple(passed), timed_out)


def _function_test(code: str, spec: CodeTests, i: int, sandbox: Sandbox) -> tuple[bool, bool]:
    child: _Session | None = None
    try:
        child = _PipeSession(sandbox, code) if isinstance(sandbox, CodeSandbox) else _ReplaySession(sandbox, code)
        child.handshake()
        ns = child.namespace()
        if spec.kind == "assert":
            exec(compile(spec.tests[i], "<test>", "exec"), {"__builtins__": __builtins__, **ns})
            return True, False
        fn = ns.get(spec.fn_name)
        if fn is None and "Solution" in ns:
            fn = getattr(ns["Solution"](), spec.fn_name)
        if fn is None:
            return False, False
        args = spec.inputs[i]
        result = fn(*args) if isinstance(args, list) else fn(args)
        expected = spec.outputs[i]
        return _same(result, expected) or (isinstance(expected, list) and len(expected) == 1
                                           and _same(result, expected[0])), False
    except RewardError:
        raise
    except (SolutionError, ProtocolError, AssertionError, Exception):
        return False, bool(child is not None and child.timed_out)
    finally:
        if child is not None:
            child.close()


def _same(a: Any, b: Any) -> bool:
    """Equality of plain values, a tuple matching a list (JSON has no tuples)."""
    if isinstance(a, RemoteObject) or isinstance(b, RemoteObject):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is float or type(b) is float:
        try:
            return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
        except (TypeError, ValueError):
            return False
    return a == b


def code_reward(responses: list[str], tests: list[Any], sandbox: Sandbox | None = None,
                partial_credit: bool = False, workers: int = 1) -> RewardOutput:
    """Per response: 1.0 when its code passes every test of its label, else 0.0.

    Args:
      responses: B model responses (code in a ```python block, or bare code).
      tests: B labels (assert source, or the JSON / dict formats of the module docstring).
      partial_credit: reward = the fraction of tests passed instead.
      sandbox: where programs run (default: CodeSandbox(), bwrap); see `make_sandbox`.
      workers: samples judged at once (threads; with bwrap as root, worker k's children run as
        uid 65534 - k, uids that must belong to no one on the machine).
    Returns:
      RewardOutput: rewards [B]; scores [B] = all passed (0/1); extra_logs {"timed_out": [B],
      "pass_fraction": [B]}.
    """
    sandbox = sandbox or CodeSandbox()
    def judge(pair: tuple[str, Any]) -> TestResult:
        return run_tests(extract_code(pair[0]), pair[1], sandbox, stop_at_first_failure=not partial_credit)

    pairs = list(zip(responses, tests))
    if workers <= 1 or len(pairs) <= 1:
        results = [judge(p) for p in pairs]
    else:
        slots = itertools.count()
        with ThreadPoolExecutor(min(workers, len(pairs)),
                                initializer=lambda: sandbox.set_worker_slot(next(slots))) as pool:
            results = list(pool.map(judge, pairs))
    solved = torch.tensor([float(r.all_passed) for r in results])
    fraction = torch.tensor([r.fraction for r in results])
    return RewardOutput(rewards=fraction.clone() if partial_credit else solved.clone(), scores=solved,
                        extra_logs={"timed_out": torch.tensor([float(r.timed_out) for r in results]),
                                    "pass_fraction": fraction})


def make_sandbox(sandbox: str = "bwrap", remote_url: str | None = None, wall_seconds: float = 5.0,
                 cpu_seconds: int = 2, memory_mb: int = 512) -> Sandbox:
    """The sandbox named by --reward.code.sandbox: "bwrap", "none" (CodeSandbox) or "remote"
    (RemoteSandbox at `remote_url`; cpu_seconds is then the server's business).

    Raises:
      RewardError: the boundary cannot be had here (bwrap missing or not starting, the server not
        answering), or remote without a URL."""
    if sandbox == "remote":
        if not remote_url:
            raise RewardError("--reward.code.sandbox remote needs --reward.code.remote_url http://HOST:PORT "
                              "(a SandboxFusion-style /run_code server)")
        return RemoteSandbox(remote_url, wall_seconds=wall_seconds, memory_mb=memory_mb)
    if sandbox not in LOCAL_BACKENDS:
        raise RewardError(f"--reward.code.sandbox: unknown value {sandbox!r}; valid: {', '.join(BACKENDS)}")
    return CodeSandbox(sandbox, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb)


class CodeReward:
    """`builtin:code`: code_reward on the responses (the part of each query after its prompt),
    with each prompt's label as its tests. Arguments are the --reward.code.* settings.

    Raises:
      RewardError: the sandbox cannot contain the code here (before any training step)."""

    name = "code"

    def __init__(self, partial_credit: bool = False, sandbox: str = "bwrap", remote_url: str | None = None,
                 timeout: float = 5.0, cpu_seconds: int = 2, memory_mb: int = 512, workers: int = 1):
        self.partial_credit, self.workers = partial_credit, workers
        self.limits = dict(cpu_seconds=cpu_seconds, wall_seconds=timeout, memory_mb=memory_mb)
        self.sandbox = make_sandbox(sandbox, remote_url, **self.limits)

    def __repr__(self) -> str:
        return f"CodeReward(partial_credit={self.partial_credit}, sandbox={self.sandbox.backend}, {self.limits})"

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> RewardOutput:
        """Score B samples; see code_reward."""
        return code_reward(response_texts(queries, prompts), list(labels), self.sandbox, self.partial_credit,
                           self.workers)
