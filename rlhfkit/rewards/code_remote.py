"""The `remote` code sandbox: programs run on a SandboxFusion-style HTTP server.

The client speaks SandboxFusion's `POST /run_code`:
  request  {"code": str, "language": "python", "stdin": str, "run_timeout": float,
            "compile_timeout": float, "memory_limit_MB": int, "files": {}}
  response {"status": "Success" | "Failed" | "SandboxError", "message": str,
            "run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error",
                           "return_code": int, "stdout": str, "stderr": str, ...} | null}
One run = one request: the server is the boundary (its containment is its own; this client
only trusts the JSON it returns). How `rlhfkit.rewards.code` judges tests through it:
  * stdin -> stdout tests: one run each; passed when the run finished with return code 0 and its
    stdout matches, as locally;
  * function tests: every call the test makes to the solution is one run of the solution plus a
    harness that replays the test's earlier calls (the run is stateless) and prints each reply as
    JSON after a per-run random token; the trainer reads the replies that follow the token and
    judges the assert itself, with the expected values, which never leave the trainer.
Weaker than local judging: the program and the harness share one process on the server, so a
program can find the token (it is in its own process) and print a forged reply. A forged reply
only helps when it carries the right value, since the comparison happens in the trainer: the
program can return a fixed value or skip work, not claim "passed". Solutions must be
deterministic for the replay to rebuild their state; and each call costs one request.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from rlhfkit.errors import RewardError
from rlhfkit.rewards.code_sandbox import RunResult


class RemoteSandbox:
    """A client of a SandboxFusion-style `/run_code` server, with `CodeSandbox.run`'s contract.

    Args:
      url: the server (http://HOST:PORT, or its full .../run_code URL).
      wall_seconds: run_timeout of each run. memory_mb: memory_limit_MB.
      output_bytes: the most bytes of stdout kept.
      request_timeout: seconds to wait for one HTTP answer (default wall_seconds + 30).
      attempts: tries per request before the run stops (RewardError).
    Raises:
      RewardError: the server does not answer a probe run correctly (at construction).
    """

    backend = "remote"

    def __init__(self, url: str, wall_seconds: float = 5.0, memory_mb: int = 512, output_bytes: int = 1 << 16,
                 request_timeout: float | None = None, attempts: int = 3):
        base = url.rstrip("/")
        self.url = base if base.endswith("/run_code") else base + "/run_code"
        self.wall_seconds, self.memory_mb, self.output_bytes = wall_seconds, memory_mb, output_bytes
        self.request_timeout = request_timeout or wall_seconds + 30
        self.attempts = attempts
        probe = self.run("print(input()[::-1])", stdin="ok\n")
        if not probe.passed or probe.output != "ko\n":
            raise RewardError(f"the code sandbox server {self.url} did not run a probe program correctly "
                              f"(stdout {probe.output[:80]!r}, stderr {probe.stderr[:200]!r})")

    def set_worker_slot(self, k: int) -> None:
        """No per-worker state: the server isolates runs."""

    def run(self, source: str, stdin: str = "") -> RunResult:
        """Run `source` as a script with `stdin` on the server."""
        reply = self._post({"code": source, "language": "python", "stdin": stdin, "run_timeout": self.wall_seconds,
                            "compile_timeout": self.wall_seconds, "memory_limit_MB": self.memory_mb, "files": {}})
        if reply.get("status") == "SandboxError":
            raise RewardError(f"the code sandbox server {self.url} failed: {str(reply.get('message'))[:200]}")
        result = reply.get("run_result") or {}
        if type(result) is not dict:
            raise RewardError(f"the code sandbox server {self.url} sent a malformed run_result")
        code = result.get("return_code")
        code = code if type(code) is int else None
        stdout, stderr = result.get("stdout") or "", result.get("stderr") or ""
        return RunResult(passed=reply.get("status") == "Success" and code == 0, returncode=code,
                         timed_out=result.get("status") == "TimeLimitExceeded",
                         output=str(stdout)[:self.output_bytes], stderr=str(stderr)[:4096])

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        error: Exception | None = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                    reply = json.loads(response.read())
                if type(reply) is dict:
                    return reply
                error = ValueError("the answer is not a JSON object")
            except (OSError, ValueError) as e:  # URLError and timeouts are OSErrors
                error = e
        raise RewardError(f"the code sandbox server {self.url} did not answer after {self.attempts} tries: {error}")
