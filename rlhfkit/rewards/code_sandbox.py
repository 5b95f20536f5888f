"""The process boundary model-written code runs behind (used by `rlhfkit.rewards.code`).

Every program runs in a fresh child process started by `CodeSandbox.popen`; before the
interpreter starts, the child (in order):
  * leaves the parent's session (its process group is killed on the wall-clock timeout);
  * gets rlimits: CPU seconds, address space, file size (stdout goes to a file, so it is capped
    too), open files, processes (RLIMIT_NPROC, which binds only a non-root uid), no core files;
  * enters new network, mount and pid namespaces when the kernel allows (as root, or through a
    user namespace): no network at all; private empty tmpfs mounts over the world-writable
    directories (/tmp, /var/tmp, /dev/shm, /run/lock), so nothing written there reaches the host;
    the program runs as the pid namespace's init, so every process it starts dies with it;
  * sets no-new-privileges (a setuid program cannot give privileges back);
  * when the trainer runs as root, drops to uid/gid 65534 (nobody) with no supplementary groups:
    from then on file permissions keep it from writing anywhere on the host but its working
    directory, and from reading files that are not world-readable. The interpreter must be
    runnable by nobody: the trainer's own Python is tried first, then the system's python3.
    If none is, the sandbox refuses to start (RewardError) unless `allow_root=True`.
These steps run at the start of the child's interpreter, before the program (`_CONTAIN`).
The child starts in a fresh temporary working directory (owned by the child's uid, deleted
afterwards) with an empty environment and `python -I -S`.

As an ordinary user, no uid can be dropped: the child runs as that user and can write where the
user can (the home directory); the namespaces, the rlimits and an in-process audit hook (which
refuses subprocesses, sockets, ctypes and writes outside the working directory, but which code
inside can defeat) are the only barriers. Run the trainer as root in a container, or in a VM,
when the policy's code must not touch the user's files.
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
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.errors import RewardError

log = logging.getLogger("rlhfkit")
NOBODY = 65534
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

# Runs first in every child, before anything of the program: the containment (see the module
# docstring). The interpreter starts as the trainer's user (no preexec_fn: the trainer is not
# forked, which is slow with a large address space and unsafe with threads); any step that fails
# ends the child with status 125 before the program runs.
_CONTAIN = r'''
def _contain(cfg):
    import ctypes, os, resource
    libc = ctypes.CDLL(None, use_errno=True)
    def die():
        os._exit(125)
    for which, value in cfg["limits"]:
        resource.setrlimit(which, (value, value))
    if cfg["as_user"] is not None:
        u = cfg["as_user"]
        os.setgroups([]); os.setgid(u); os.setuid(u)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as a process started by that user is
    ns = cfg["ns"]
    if ns:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(ns) != 0:
            die()
        if ns & 0x10000000:  # CLONE_NEWUSER: map our uid so that files keep their owner inside
            for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", "%d %d 1" % (uid, uid)),
                               ("/proc/self/gid_map", "%d %d 1" % (gid, gid))):
                with open(path, "w") as f:
                    f.write(text)
        if ns & 0x00020000:  # CLONE_NEWNS: private mounts, empty tmpfs over the shared writable dirs
            if libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None) != 0:  # MS_REC | MS_PRIVATE
                die()
            for d in cfg["shared"]:
                if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0, b"size=16m,mode=1777") != 0:
                    die()
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        die()
    if cfg["uid"] is not None:
        u = cfg["uid"]
        os.setgroups([]); os.setgid(u); os.setuid(u)
        if os.getuid() != u or os.geteuid() != u or os.getgid() != u or os.getgroups():
            die()
try:
    _contain(CFG)
except BaseException:
    import os as _o
    _o._exit(125)
del _contain, CFG
'''

# Then, in a new pid namespace: the first forked child is the namespace's init, which waits for
# the program (its own forked child: signals such as the CPU limit's SIGXCPU do not reach an init)
# and passes on its exit status. When the init exits or is killed, every process the program
# started dies too, even one in a session of its own. SIGTERM to the outer process (`stop`) kills
# the init, whose exit the outer process then reaps, so that nothing is left to the host to reap.
_PIDNS_INIT = r'''
import os as _os
def _pidns_init():
    import signal
    kid = [0]
    def stop(*_):
        if kid[0]:
            _os.kill(kid[0], signal.SIGKILL)
        else:
            _os._exit(137)
    signal.signal(signal.SIGTERM, stop)
    kid[0] = _os.fork()
    if kid[0]:
        _os._exit(_os.waitstatus_to_exitcode(_os.waitpid(kid[0], 0)[1]) & 255)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pid = _os.fork()
    if pid:
        _os._exit(_os.waitstatus_to_exitcode(_os.waitpid(pid, 0)[1]) & 255)
if PIDNS:
    _pidns_init()
del _pidns_init
'''

# Installed first in every child unless audit_hook=False: a layer on top of the boundary (code
# inside can get around it; the uid drop and the namespaces are what hold).
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
_SCRIPT = r'''
import sys
code = compile(open("solution.py").read(), "solution.py", "exec")
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
      cpu_seconds: RLIMIT_CPU of the child. wall_seconds: its process group is killed after this.
      memory_mb: RLIMIT_AS. output_bytes: RLIMIT_FSIZE, and the most bytes of output read back.
      max_processes: RLIMIT_NPROC of the child's uid (binds when the child is not root).
      allow_root: as root, run the child as root when no interpreter is runnable by nobody
        (otherwise that is a RewardError).
      audit_hook: install the in-process audit hook layer (tests turn it off to check the boundary).
      as_user: as root, behave as a trainer run by this ordinary uid (the child switches to it first,
        then is contained as an ordinary user's child is): how the tests check that case as root.
    Raises:
      RewardError: as root without allow_root, when no Python interpreter is runnable by nobody.
    """

    def __init__(self, cpu_seconds: int = 2, wall_seconds: float = 5.0, memory_mb: int = 512,
                 output_bytes: int = 1 << 16, max_processes: int = 16, allow_root: bool = False,
                 audit_hook: bool = True, as_user: int | None = None):
        self.cpu_seconds, self.wall_seconds, self.memory_mb = cpu_seconds, wall_seconds, memory_mb
        self.output_bytes, self.max_processes, self.audit_hook = output_bytes, max_processes, audit_hook
        if as_user is not None and (os.geteuid() != 0 or as_user == 0):
            raise ValueError("as_user needs a root trainer and a non-root uid")
        self.as_user = as_user
        self.is_root = os.geteuid() == 0 and as_user is None
        self.base_uid: int | None = NOBODY if self.is_root else None
        self._slot = threading.local()
        self.namespaces = 0
        self.python = self._probe(allow_root)

    @property
    def uid(self) -> int | None:
        """The uid children of this thread run as: nobody, or 65534 - k in worker thread k."""
        return None if self.base_uid is None else self.base_uid - getattr(self._slot, "k", 0)

    def set_worker_slot(self, k: int) -> None:
        """In worker thread k (of `code_reward(workers=...)`): its children run as uid 65534 - k, so
        that RLIMIT_NPROC (per uid) of one child does not starve another's."""
        self._slot.k = k

    # ------------------------------------------------------------------ starting children
    def make_workdir(self) -> Path:
        """A fresh working directory owned by the child's uid."""
        workdir = Path(tempfile.mkdtemp(prefix="rlhfkit_sandbox_"))
        self._chown(workdir)
        return workdir

    def write(self, workdir: Path, name: str, text: str) -> None:
        path = workdir / name
        path.write_text(text)
        self._chown(path)

    def _chown(self, path: Path) -> None:
        owner = self.uid if self.uid is not None else self.as_user
        if owner is not None:
            os.chown(path, owner, owner)

    def popen(self, code: str, workdir: Path, **kwargs) -> subprocess.Popen:
        """`python -I -S -c code` in `workdir`, contained; kwargs go to subprocess.Popen."""
        pidns = bool(self.namespaces & _CLONE_NEWPID)
        prelude = (f"CFG = {self._settings()!r}\n" + _CONTAIN + f"PIDNS = {pidns}\n" + _PIDNS_INIT
                   + AUDIT_HOOK + f"HOOK = {bool(self.audit_hook)}\n")
        return subprocess.Popen([self.python, "-I", "-S", "-c", prelude + code], cwd=workdir, env={},
                                start_new_session=True, **kwargs)

    def run(self, source: str, stdin: str = "") -> RunResult:
        """Run `source` as a script with `stdin`; passed = exit status 0 within the limits."""
        workdir = self.make_workdir()
        try:
            self.write(workdir, "solution.py", source)
            self.write(workdir, "stdin.txt", stdin)
            # read back through the descriptors opened here: the child may put a symlink in their place
            with open(workdir / "stdin.txt", "rb") as inp, open(workdir / "stdout.txt", "w+b") as out, \
                    open(workdir / "stderr.txt", "w+b") as err:
                proc = self.popen(_SCRIPT, workdir, stdin=inp, stdout=out, stderr=err)
                timed_out, code = self.wait(proc)
                return RunResult(passed=code == 0, returncode=code, timed_out=timed_out,
                                 output=_head(out, self.output_bytes), stderr=_head(err, 4096))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def wait(self, proc: subprocess.Popen, timeout: float | None = None) -> tuple[bool, int | None]:
        """(timed_out, returncode) after waiting up to wall_seconds; the group is killed either way."""
        try:
            code = proc.wait(timeout=self.wall_seconds if timeout is None else timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out, code = True, None
        kill_group(proc)
        return timed_out, code

    # ------------------------------------------------------------------ in the child, before exec
    def _settings(self) -> dict:
        limits = [(resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_AS, self.memory_mb << 20),
                  (resource.RLIMIT_FSIZE, self.output_bytes), (resource.RLIMIT_NOFILE, 64),
                  (resource.RLIMIT_NPROC, self.max_processes), (resource.RLIMIT_CORE, 0)]
        return {"limits": limits, "as_user": self.as_user, "ns": self.namespaces, "uid": self.uid,
                "shared": [d for d in _SHARED_DIRS if os.path.isdir(d)]}

    # ------------------------------------------------------------------ what this machine allows
    def _probe(self, allow_root: bool) -> str:
        """The interpreter the child runs, and the namespaces it can enter (self.namespaces)."""
        candidates = [os.path.realpath(sys.executable)]
        for name in ("python3", "python"):
            found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
            if found and os.path.realpath(found) not in candidates:
                candidates.append(os.path.realpath(found))
        base = _CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWPID
        ns_options = [base, 0] if self.is_root else [_CLONE_NEWUSER | base, 0]
        for python in candidates:
            for ns in ns_options:
                self.namespaces = ns
                if self._starts(python):
                    if not ns:
                        log.warning("code sandbox: no network/mount namespace on this machine; "
                                    "the child's network is not cut off")
                    if not self.is_root:
                        log.warning("code sandbox: not running as root, so the child keeps your uid "
                                    "and can write where you can; run as root in a container or a VM "
                                    "to contain it")
                    return python
        if os.geteuid() == 0 and self.as_user is None and allow_root:
            log.warning("code sandbox: no Python runnable by nobody; model code runs as root "
                        "(--reward.code.allow_root)")
            self.base_uid, self.namespaces = None, base
            if self._starts(candidates[0]):
                return candidates[0]
            self.namespaces = 0
            return candidates[0]
        if os.geteuid() == 0 and self.as_user is None:
            raise RewardError("no Python interpreter is runnable by the unprivileged uid nobody "
                              f"(tried {', '.join(candidates)}), so model code would run as root; "
                              "install a system python3 or pass --reward.code.allow_root")
        raise RewardError(f"no Python interpreter starts in the code sandbox (tried {', '.join(candidates)})")

    def _starts(self, python: str) -> bool:
        workdir = self.make_workdir()
        try:
            self.python = python
            proc = self.popen("import json, math, os\nos.getcwd()\nif HOOK:\n    _install_hook()\n", workdir,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return self.wait(proc, timeout=30) == (False, 0)
        except (OSError, subprocess.SubprocessError):
            return False
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def kill_group(proc: subprocess.Popen, grace: float = 1.0) -> None:
    """End a child and everything it started: SIGTERM makes its outer process kill the pid
    namespace's init and reap it (all the program's processes are dead by then); after `grace`
    seconds, or without a pid namespace, SIGKILL to its process group. The child is reaped."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _head(f, n: int) -> str:
    f.seek(0)
    return f.read(n).decode("utf-8", "replace")
