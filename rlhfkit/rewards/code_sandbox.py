"""The process boundary model-written code runs behind (used by `rlhfkit.rewards.code`).

Two local backends (a third, `remote`, sends programs to a SandboxFusion-style server:
`rlhfkit.rewards.code_remote`):

* `bwrap` (the default): every program runs under bubblewrap in new pid, network, ipc, uts and
  mount namespaces (a cgroup namespace where the kernel has one). Its file system is a read-only
  root holding only /usr and the /bin, /lib* links or folders, the interpreter's prefix (bound
  read-only at its own path), a minimal read-only /dev (with a fresh 64 MiB /dev/shm), a /proc of
  its own pid namespace, and two fresh 64 MiB tmpfs folders: /sandbox (the working directory) and
  /tmp. Nothing else of the host is visible (no /etc, /home, /root, the trainer's working tree or
  its temporary files). The program's
  source reaches it through an inherited descriptor; its stdout goes to a descriptor the trainer
  opened. `--die-with-parent` and the pid namespace tie every process it starts to the bwrap
  process, which the trainer kills on the wall-clock timeout; `--new-session` keeps it off the
  trainer's terminal. It runs as an unprivileged uid:
    - trainer as root: no user namespace; bwrap keeps only CAP_SETUID/CAP_SETGID, and the first
      lines of the child drop to uid/gid 65534 (65534 - k in worker k) with no groups, which also
      clears those capabilities: the uid is unprivileged on the host, so RLIMIT_NPROC binds;
    - trainer as an ordinary user: a new user namespace (`--unshare-all --uid 65534`): the
      program sees uid 65534, mapped onto the trainer's own uid.
  Where bwrap is missing or cannot start, `CodeSandbox` refuses (RewardError), never weaker.
* `none`: a plain child process with the same limits, its own session and an empty
  environment, in a fresh temporary directory, and the audit hook below; no namespaces and no
  uid change (as root it runs as root). A warning is logged: the program can read and write
  whatever the trainer can, and reach the network.

Both: rlimits (CPU seconds, address space, file size, which caps stdout, open files, processes,
no core files) set by the child's first lines, `python -I -S` (no site, no environment), and
an in-process audit hook (refuses subprocesses, sockets, ctypes and writes outside the working
directory) that code inside can defeat: a layer on top, not the boundary.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import RewardError

log = logging.getLogger("rlhfkit")
NOBODY = 65534
LOCAL_BACKENDS = ("bwrap", "none")
WORKDIR = "/sandbox"  # the working directory inside bwrap
_TMPFS_BYTES = 64 << 20
_INSTALL = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or pass "
            "--reward.code.sandbox remote with --reward.code.remote_url, or --reward.code.sandbox none "
            "to run model code unconfined")

# Runs first in every child, before anything of the program: the rlimits, then (bwrap as root)
# the drop to an unprivileged uid. Any step that fails ends the child with status 125.
_CONTAIN = r'''
def _contain(cfg):
    import os, resource
    for which, value in cfg["limits"]:
        resource.setrlimit(which, (value, value))
    if cfg["uid"] is not None:
        u = cfg["uid"]
        os.setgroups([]); os.setgid(u); os.setuid(u)
        if os.getuid() != u or os.geteuid() != u or os.getgid() != u or os.getgroups():
            os._exit(125)
try:
    _contain(CFG)
except BaseException:
    import os as _o
    _o._exit(125)
del _contain, CFG
with open(_SRC_FD, "rb") as _f:
    _SOURCE = _f.read().decode("utf-8", "replace")
'''

# Installed first in every child unless audit_hook=False: a layer on top of the boundary (code
# inside can get around it; bwrap's namespaces and the uid are what hold).
AUDIT_HOOK = r'''
import os as _os, sys as _sys
def _install_hook():
    root = _os.path.realpath(_os.getcwd())
    deny = ("socket.", "subprocess.", "os.fork", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
            "ctypes.", "os.kill", "os.killpg", "pty.", "os.forkpty", "_posixsubprocess")
    realpath, sep, fsdecode = _os.path.realpath, _os.sep, _os.fsdecode
    def inside(path):
        p = realpath(path)
        return p == root or p.startswith(root + sep)
    def hook(event, args):
        if event.startswith(deny):
            raise PermissionError("sandbox: " + event + " is not allowed")
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
            if mode not in ("r", "rb") and not inside(fsdecode(args[0])):
                raise PermissionError("sandbox: writing " + fsdecode(args[0]) + " is not allowed")
    _sys.addaudithook(hook)
'''

# Runs a program as a script (stdin -> stdout tasks and `CodeSandbox.run`).
SCRIPT = r'''
code = compile(_SOURCE, "solution.py", "exec")
if HOOK:
    _install_hook()
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


@dataclass(frozen=True)
class RunResult:
    """What one sandboxed run did."""

    passed: bool  # exit status 0 within the limits
    returncode: int | None  # None when killed on the wall-clock timeout
    timed_out: bool
    output: str  # the first `output_bytes` of stdout
    stderr: str = ""


class CodeSandbox:
    """Starts contained Python children (see the module docstring).

    Args:
      backend: "bwrap" (default) or "none" (unconfined, with a warning).
      cpu_seconds: RLIMIT_CPU of the child. wall_seconds: it is killed after this.
      memory_mb: RLIMIT_AS. output_bytes: RLIMIT_FSIZE, and the most bytes of output read back.
      max_processes: RLIMIT_NPROC of the child's uid (binds when the child is not root).
      audit_hook: install the in-process audit hook layer (tests turn it off to check the boundary).
    Raises:
      RewardError: bwrap is missing or cannot start a Python child here (the message says what
        to install, or to pass --reward.code.sandbox none).
    """

    def __init__(self, backend: str = "bwrap", cpu_seconds: int = 2, wall_seconds: float = 5.0,
                 memory_mb: int = 512, output_bytes: int = 1 << 16, max_processes: int = 16,
                 audit_hook: bool = True):
        if backend not in LOCAL_BACKENDS:
            raise ValueError(f"unknown code sandbox backend {backend!r}; valid: {', '.join(LOCAL_BACKENDS)}")
        self.backend = backend
        self.cpu_seconds, self.wall_seconds, self.memory_mb = cpu_seconds, wall_seconds, memory_mb
        self.output_bytes, self.max_processes, self.audit_hook = output_bytes, max_processes, audit_hook
        self.is_root = os.geteuid() == 0
        self.base_uid: int | None = NOBODY if self.is_root and backend == "bwrap" else None
        self._slot = threading.local()
        self.bwrap = shutil.which("bwrap") if backend == "bwrap" else None
        if backend == "bwrap" and self.bwrap is None:
            raise RewardError(f"the code sandbox needs bubblewrap (bwrap), which is not on PATH: {_INSTALL}")
        self.python, self._mounts = "", []
        self._probe()
        if backend == "none":
            log.warning("code sandbox: --reward.code.sandbox none: model code runs unconfined, as uid %d, "
                        "with only rlimits and an audit hook it can defeat; it can read and write what the "
                        "trainer can and reach the network", os.geteuid())

    @property
    def uid(self) -> int | None:
        """The uid children of this thread switch to: 65534 - k in worker thread k (bwrap as root)."""
        return None if self.base_uid is None else self.base_uid - getattr(self._slot, "k", 0)

    def set_worker_slot(self, k: int) -> None:
        """In worker thread k (of `code_reward(workers=...)`): its children run as uid 65534 - k, so
        that RLIMIT_NPROC (per uid) of one child does not starve another's."""
        self._slot.k = k

    # ------------------------------------------------------------------ starting children
    @contextmanager
    def started(self, code: str, source: str, **kwargs) -> Iterator[subprocess.Popen]:
        """`python -I -S -c code`, contained, with `source` readable once as `_SOURCE`; the child is
        killed and its traces removed on exit. kwargs go to subprocess.Popen."""
        workdir = None if self.bwrap else Path(tempfile.mkdtemp(prefix="rlhfkit_sandbox_"))
        try:
            with tempfile.TemporaryFile() as src:
                src.write(source.encode())
                src.flush()
                src.seek(0)
                prelude = (f"CFG = {self._settings()!r}\n_SRC_FD = {src.fileno()}\n" + _CONTAIN + AUDIT_HOOK
                           + f"HOOK = {bool(self.audit_hook)}\n")
                argv = [self.python, "-I", "-S", "-c", prelude + code]
                if self.bwrap:
                    argv = [self.bwrap, *self._mounts, *self._identity(), "--", *argv]
                pass_fds = (src.fileno(), *kwargs.pop("pass_fds", ()))
                proc = subprocess.Popen(argv, cwd=workdir, env={}, start_new_session=True, pass_fds=pass_fds,
                                        **kwargs)
            try:
                yield proc
            finally:
                kill_group(proc)
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def run(self, source: str, stdin: str = "") -> RunResult:
        """Run `source` as a script with `stdin`; passed = exit status 0 within the limits."""
        with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            inp.write(stdin.encode())
            inp.seek(0)
            with self.started(SCRIPT, source, stdin=inp, stdout=out, stderr=err) as proc:
                timed_out, code = self.wait(proc)
            return RunResult(passed=code == 0, returncode=code, timed_out=timed_out,
                             output=_head(out, self.output_bytes), stderr=_head(err, 4096))

    def wait(self, proc: subprocess.Popen, timeout: float | None = None) -> tuple[bool, int | None]:
        """(timed_out, returncode) after waiting up to wall_seconds (`started` kills the child)."""
        try:
            return False, proc.wait(timeout=self.wall_seconds if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            return True, None

    # ------------------------------------------------------------------ what the child gets
    def _settings(self) -> dict:
        limits = [(resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_AS, self.memory_mb << 20),
                  (resource.RLIMIT_FSIZE, self.output_bytes), (resource.RLIMIT_NOFILE, 64),
                  (resource.RLIMIT_NPROC, self.max_processes), (resource.RLIMIT_CORE, 0)]
        return {"limits": limits, "uid": self.uid}

    def _identity(self) -> list[str]:
        """bwrap's namespaces and capabilities (see the module docstring)."""
        common = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                  "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--clearenv"]
        if self.is_root:
            return [*common, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return [*common, "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]

    def _bwrap_mounts(self, roots: list[str]) -> list[str]:
        """A read-only root with /usr, the /bin and /lib* links or folders and `roots` (the
        interpreter's prefix, its venv), minimal /dev (read-only) and /proc, fresh tmpfs /tmp, /sandbox
        (the working dir) and /dev/shm."""
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        for root in roots:
            if root == "/usr" or root.startswith("/usr/"):
                continue
            for parent in list(reversed(Path(root).parents))[1:]:  # without "/"
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", root, root]
        args += ["--proc", "/proc", "--dev", "/dev"]
        # /dev is a tmpfs of half the host's memory, writable by the child in a user namespace (an
        # ordinary trainer): read-only, with a bounded /dev/shm (multiprocessing's semaphores) in it
        for folder in ("/tmp", WORKDIR, "/dev/shm"):
            args += ["--size", str(_TMPFS_BYTES), "--perms", "1777", "--tmpfs", folder]
        return args + ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", WORKDIR]

    # ------------------------------------------------------------------ what this machine allows
    def _probe(self) -> None:
        """Pick the interpreter: the trainer's own, else the system's python3; the first that starts
        in the sandbox (the trainer's may live where the child's uid cannot read it)."""
        candidates = [os.path.realpath(sys.executable)]
        for name in ("python3", "python"):
            found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
            if found and os.path.realpath(found) not in candidates:
                candidates.append(os.path.realpath(found))
        errors = []
        for python in candidates:
            prefix = _prefix(python)
            if prefix is None:
                continue
            # a venv made with --copies: its python lies outside the prefix; bind the venv too
            roots = [prefix] if python.startswith(prefix + "/") else [prefix, str(Path(python).parents[1])]
            self.python, self._mounts = python, self._bwrap_mounts(roots) if self.bwrap else []
            error = self._start_error()
            if error is None:
                return
            errors.append(f"{python}: {error}")
        what = "bwrap cannot start a Python child here" if self.bwrap else "no Python interpreter starts"
        raise RewardError(f"{what} ({'; '.join(errors) or 'no interpreter found'}): {_INSTALL}")

    def _start_error(self) -> str | None:
        """None when a child starts and imports the standard library; else what went wrong."""
        try:
            with tempfile.TemporaryFile() as err:
                with self.started("import json, math, os\nif HOOK:\n    _install_hook()\n", "",
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err) as proc:
                    timed_out, code = self.wait(proc, timeout=30)
                if (timed_out, code) == (False, 0):
                    return None
                return " ".join(_head(err, 300).split()) or f"exit status {code}"
        except (OSError, subprocess.SubprocessError) as e:
            return str(e)


def _prefix(python: str) -> str | None:
    """The installation prefix of `python` (what the sandbox binds read-only), or None."""
    try:
        out = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    prefix = out.stdout.strip()
    return os.path.realpath(prefix) if out.returncode == 0 and prefix.startswith("/") else None


def kill_group(proc: subprocess.Popen) -> None:
    """End a child and everything it started, and reap it: SIGKILL to its process group (under
    bwrap, bwrap's death takes the pid namespace and all its processes with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _head(f, n: int) -> str:
    f.seek(0)
    return f.read(n).decode("utf-8", "replace")
