"""The remote code sandbox client and the fake SandboxFusion server of test_code_remote.py, both
checked against SandboxFusion's published /run_code example (request and sample answer, recorded in
tests/fixtures/sandbox_fusion_run_code.json): the client reads the real answer, and the fake answers
that request in the real answer's shape. A live SandboxFusion server is not tested."""

import json
import shutil
import threading
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from rlhfkit.rewards.code import RemoteSandbox
from rlhfkit.rewards.code_sandbox import CodeSandbox
from tests.unit.rewards.test_code_remote import FakeSandboxFusion

RECORDED = json.loads((Path(__file__).parents[2] / "fixtures" / "sandbox_fusion_run_code.json").read_text())


def shape(value):
    """The keys of a JSON answer, nested (values dropped)."""
    return {k: shape(v) for k, v in value.items()} if isinstance(value, dict) else type(value).__name__


def test_the_client_reads_the_published_answer(monkeypatch):
    sent = []
    monkeypatch.setattr(RemoteSandbox, "_post", lambda self, body: sent.append(body) or RECORDED["response"])
    client = object.__new__(RemoteSandbox)  # no probe run: the recorded server answered one request
    client.url = "http://sandbox/run_code"
    client.wall_seconds, client.memory_mb, client.output_bytes = 5.0, 512, 1 << 16
    r = client.run(RECORDED["request"]["code"])
    assert (r.passed, r.returncode, r.timed_out, r.output, r.stderr) == (True, 0, False, "Hello, world!\n", "")
    assert {k: sent[0][k] for k in RECORDED["request"]} == RECORDED["request"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the fake server runs code under bwrap")
def test_the_fake_answers_the_published_request_in_the_published_shape():
    box = CodeSandbox(cpu_seconds=1, wall_seconds=3, memory_mb=256, output_bytes=1 << 16)
    handler = type("Handler", (FakeSandboxFusion,), {"box": box, "requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{httpd.server_address[1]}/run_code",
                                         data=json.dumps(RECORDED["request"]).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            got = json.loads(response.read())
    finally:
        httpd.shutdown()
        httpd.server_close()
    want = RECORDED["response"]
    assert shape(got) == shape(want)
    assert (got["status"], got["run_result"]["status"], got["run_result"]["return_code"],
            got["run_result"]["stdout"]) == ("Success", "Finished", 0, "Hello, world!\n")
