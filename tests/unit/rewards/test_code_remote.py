"""The remote code sandbox against a local fake SandboxFusion server (POST /run_code) that runs
each request under the bwrap backend: requests and answers in SandboxFusion's shape, honest
solutions in every style score 1, the hacks score 0, the replayed state, a failing server stops
the run instead of scoring 0."""

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlhfkit.errors import RewardError
from rlhfkit.rewards.code import CodeReward, RemoteSandbox, code_reward, run_tests
from rlhfkit.rewards.code_sandbox import CodeSandbox
from tests.unit.rewards.test_code_hostile import HACKS, TESTS

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the fake server runs code under bwrap")


class FakeSandboxFusion(BaseHTTPRequestHandler):
    box: CodeSandbox
    requests: list

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        if self.path != "/run_code" or body.get("language") != "python":
            answer = {"status": "SandboxError", "message": "unsupported", "run_result": None}
        else:
            r = self.box.run(body["code"], stdin=body.get("stdin", ""))
            run_status = "TimeLimitExceeded" if r.timed_out else "Finished"
            answer = {"status": "Success" if r.passed else "Failed", "message": "", "compile_result": None,
                      "run_result": {"status": run_status, "execution_time": 0.1, "return_code": r.returncode,
                                     "stdout": r.output, "stderr": r.stderr},
                      "executor_pod_name": None, "files": {}}  # the published answer's keys (see the fixture)
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    handler = type("Handler", (FakeSandboxFusion,), {"box": CodeSandbox(cpu_seconds=1, wall_seconds=3,
                                                                        memory_mb=256, output_bytes=1 << 16),
                                                     "requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler.requests
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def remote(server):
    return RemoteSandbox(server[0], wall_seconds=3, memory_mb=256)


def test_the_requests_have_sandboxfusions_shape(server, remote):
    url, seen = server
    r = remote.run("import sys\nprint(sys.stdin.read().upper(), end='')\nraise SystemExit(3)", stdin="ab")
    assert (r.passed, r.returncode, r.output, r.timed_out) == (False, 3, "AB", False)
    assert seen[-1] == {"code": "import sys\nprint(sys.stdin.read().upper(), end='')\nraise SystemExit(3)",
                        "language": "python", "stdin": "ab", "run_timeout": 3, "compile_timeout": 3,
                        "memory_limit_MB": 256, "files": {}}
    assert RemoteSandbox(url + "/run_code/").url == url + "/run_code"
    assert remote.run("import time\ntime.sleep(30)").timed_out


def test_honest_solutions_score_one_remotely(remote):
    add = "def add(a, b):\n    return a + b\n"
    assert run_tests(add, "assert add(2, 3) == 5\nassert add((1,), (2,)) == (1, 2)", remote).passed == (True, True)
    leetcode = "class Solution:\n    def twice(self, xs):\n        return [2 * x for x in xs]\n"
    assert run_tests(leetcode, {"fn_name": "twice", "inputs": [[[1, 2]]], "outputs": [[2, 4]]},
                     remote).passed == (True,)
    stdio = {"inputs": ["2 3\n", "1 1\n"], "outputs": ["5\n", "2"]}
    assert run_tests("a, b = map(int, input().split())\nprint(a + b)", stdio, remote).passed == (True, True)


def test_state_is_rebuilt_by_replaying_the_tests_earlier_calls(remote):
    counter = "class Counter:\n    def __init__(self):\n        self.n = 0\n    def tick(self):\n" \
              "        self.n += 1\n        return self.n\n"
    assert run_tests(counter, "c = Counter()\nc.tick()\nassert c.tick() == 2", remote).passed == (True,)
    assert run_tests(counter, "c = Counter()\nc.tick()\nassert c.tick() == 1", remote).passed == (False,)


@pytest.mark.parametrize("name", ["system_exit_before_tests", "os_exit_0", "exit_inside_the_call", "print_fake_results",
                                  "forge_the_reply_pipe", "patch_builtins", "patch_the_harness", "always_equal_object",
                                  "always_equal_int_subclass", "raises_in_the_call", "infinite_loop"])
def test_hacks_score_zero_remotely(remote, name):
    out = code_reward(["```python\n" + HACKS[name] + "\n```"], [TESTS], remote, partial_credit=True)
    assert out.rewards.item() == 0.0


def test_a_program_that_finds_the_token_can_only_forge_values_it_could_have_returned(remote):
    """The documented weakness: the token is in the program's own process. A forged reply is judged
    like a returned value, in the trainer: a fixed 5 passes add(2, 3) == 5 and nothing more."""
    forge = ("import os, sys\ndef add(a, b):\n    pre = sys._getframe(1).f_globals['_PRE']\n"
             "    os.write(1, pre + b'{\"value\": 5}\\n')\n    os._exit(0)\n")
    fixed = "def add(a, b):\n    return 5\n"
    assert run_tests(forge, TESTS, remote).passed == run_tests(fixed, TESTS, remote).passed == (True, False)
    twice = forge.replace("os._exit(0)", "os.write(1, pre + b'{\"value\": 5}\\n')\n    os._exit(0)")
    assert run_tests(twice, TESTS, remote).passed == (False, False)  # an extra reply breaks the replay count


def test_a_failing_server_stops_the_run_instead_of_scoring_zero(server, remote, monkeypatch):
    with pytest.raises(RewardError, match=r"did not answer after 3 tries"):
        RemoteSandbox("http://127.0.0.1:9", attempts=3, request_timeout=2)
    monkeypatch.setattr(remote, "_post", lambda body: {"status": "SandboxError", "message": "pod lost"})
    with pytest.raises(RewardError, match="failed: pod lost"):
        run_tests("def add(a, b):\n    return a + b\n", TESTS, remote)


def test_builtin_code_with_the_remote_backend(server):
    fn = CodeReward(sandbox="remote", remote_url=server[0], timeout=3.0)
    out = fn(["P" + "def add(a, b):\n    return a + b", "P" + "def add(a, b):\n    return 5"], ["P", "P"], [TESTS] * 2)
    assert out.rewards.tolist() == [1.0, 0.0] and "sandbox=remote" in repr(fn)
