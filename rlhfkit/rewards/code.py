"""Code-execution reward: run model-written Python against tests in a sandboxed subprocess.

The reward is 1.0 when the program (the response's last ```python block, else the whole
response) followed by the tests (plain `assert` statements) exits with status 0, else 0.0.

Containment, in layers (each hostile case is tested in tests/unit/rewards/test_code_reward.py):
  * a throwaway working directory, deleted afterwards; `python -I -S` (no site, no env vars);
  * rlimits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), file size (RLIMIT_FSIZE: also
    caps stdout, which goes to a file in the directory), open files, processes (RLIMIT_NPROC);
  * when run as root, the child drops to uid/gid 65534 (nobody), so NPROC applies and files of
    other users are unreadable;
  * no network: a fresh network namespace (`unshare -rn`, as the child's user) where the
    machine allows it, and in every case an audit hook (PEP 578) installed before the program
    runs that refuses sockets, subprocesses, fork/exec, ctypes, and opening or listing paths
    outside the working directory (reads of the Python installation stay allowed for imports);
  * a wall-clock timeout after which the whole process group is killed.
This is containment for reward computation on one's own machine, not a security boundary
against a determined attacker (run untrusted code in a VM or container for that).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from rlhfkit.rewards.base import RewardOutput

_BLOCK_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
NOBODY = 65534

# Runs first in the child: installs the audit hook, then executes solution.py.
_RUNNER = r'''
import os, sys
_ROOT = os.path.realpath(os.getcwd())
_READ_OK = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, _ROOT)})
_DENY = ("socket.", "subprocess.", "os.fork", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
         "ctypes.", "os.kill", "os.killpg", "pty.", "os.forkpty", "_posixsubprocess")
def _inside(path, roots):
    p = os.path.realpath(path)
    return any(p == r or p.startswith(r + os.sep) for r in roots)
def _hook(event, args):
    if event.startswith(_DENY):
        raise PermissionError("sandbox: " + event + " is not allowed")
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
        roots = _READ_OK if mode in ("r", "rb") else (_ROOT,)
        if not _inside(path, roots):
            raise PermissionError("sandbox: open " + path + " is not allowed")
    if event in ("os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chdir",
                 "shutil.rmtree", "os.symlink", "os.link", "os.chmod", "os.chown", "os.truncate", "os.utime"):
        path = args[0] if args else "."
        roots = _READ_OK if event in ("os.listdir", "os.scandir") else (_ROOT,)
        if isinstance(path, (str, bytes, os.PathLike)) and not _inside(os.fsdecode(path), roots):
            raise PermissionError("sandbox: " + event + " " + os.fsdecode(path) + " is not allowed")
src = open("solution.py").read()
code = compile(src, "solution.py", "exec")
sys.addaudithook(_hook)
del os.environ
exec(code, {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class RunResult:
    """What one sandboxed run did."""

    passed: bool
    returncode: int | None  # None when killed on the wall-clock timeout
    timed_out: bool
    output: str  # the first `output_bytes` of stdout + stderr


class CodeSandbox:
    """Runs Python source in a contained subprocess (see the module docstring).

    Args:
      cpu_seconds: RLIMIT_CPU of the child. wall_seconds: killed after this long.
      memory_mb: RLIMIT_AS. output_bytes: most bytes of output kept (and RLIMIT_FSIZE).
      max_processes: RLIMIT_NPROC (counts every process of the child's user).
    """

    def __init__(self, cpu_seconds: int = 2, wall_seconds: float = 5.0, memory_mb: int = 512,
                 output_bytes: int = 1 << 16, max_processes: int = 64):
        self.cpu_seconds, self.wall_seconds, self.memory_mb = cpu_seconds, wall_seconds, memory_mb
        self.output_bytes, self.max_processes = output_bytes, max_processes
        self.python = os.path.realpath(sys.executable)
        self.drop_root, self.net_prefix = self._probe()

    def run(self, source: str) -> RunResult:
        """Run `source` as a script; passed = exit status 0 within the limits."""
        workdir = Path(tempfile.mkdtemp(prefix="rlhfkit_sandbox_"))
        try:
            (workdir / "solution.py").write_text(source)
            (workdir / "runner.py").write_text(_RUNNER)
            if self.drop_root:
                for p in (workdir, workdir / "solution.py", workdir / "runner.py"):
                    os.chown(p, NOBODY, NOBODY)
            out_path = workdir / "output.txt"
            with open(out_path, "wb") as out:
                proc = subprocess.Popen(
                    [*self.net_prefix, self.python, "-I", "-S", "runner.py"], cwd=workdir,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin"},
                    preexec_fn=self._limits, start_new_session=True,
                )
                timed_out = False
                try:
                    code = proc.wait(timeout=self.wall_seconds)
                except subprocess.TimeoutExpired:
                    timed_out, code = True, None
                    _kill_group(proc)
            with open(out_path, "rb") as f:
                text = f.read(self.output_bytes).decode("utf-8", "replace")
            return RunResult(passed=code == 0, returncode=code, timed_out=timed_out, output=text)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _limits(self) -> None:
        """In the child before exec: rlimits, then drop root."""
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds))
        mem = self.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.output_bytes, self.output_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.drop_root:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

    def _probe(self) -> tuple[bool, list[str]]:
        """The strongest (drop root, network-namespace prefix) under which Python starts here.

        Dropping root needs the interpreter to be executable by nobody; a network namespace
        needs `unshare` and user namespaces. What is unavailable is skipped (the audit hook and
        the rlimits always apply).
        """
        exe = shutil.which("unshare")
        nets = ([[exe, "-rn"], [exe, "--net"]] if exe else []) + [[]]
        drops = [True, False] if os.geteuid() == 0 else [False]
        for drop in drops:
            for net in nets:
                self.drop_root = drop
                try:
                    done = subprocess.run([*net, self.python, "-I", "-S", "-c", "pass"], capture_output=True,
                                          timeout=10, preexec_fn=self._limits, cwd=tempfile.gettempdir())
                except (OSError, subprocess.TimeoutExpired):
                    continue
                if done.returncode == 0:
                    return drop, net
        return False, []


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def extract_code(response: str) -> str:
    """The last ```python (or bare ```) block of `response`, else the whole response."""
    blocks = _BLOCK_RE.findall(response)
    return blocks[-1] if blocks else response


def code_reward(responses: list[str], tests: list[str], sandbox: CodeSandbox | None = None) -> RewardOutput:
    """1.0 per response whose code passes its tests in the sandbox, else 0.0.

    Args:
      responses: B model responses (code in a ```python block, or bare code).
      tests: B test programs (e.g. "assert add(1, 2) == 3"), run after the code.
    Returns:
      RewardOutput: rewards = scores [B]; extra_logs {"timed_out": [B]}.
    """
    sandbox = sandbox or CodeSandbox()
    results = [sandbox.run(extract_code(r) + "\n\n" + t) for r, t in zip(responses, tests)]
    passed = torch.tensor([float(r.passed) for r in results])
    return RewardOutput(rewards=passed, scores=passed.clone(),
                        extra_logs={"timed_out": torch.tensor([float(r.timed_out) for r in results])})
