"""The official `tinker` SDK against `rlhfkit serve-training`'s app (a tiny random Llama on CPU):
an SL loop, an RL loop, save / load / restart, two clients with isolated adapters, hostile
clients. Skipped when the SDK is not installed (`pip install 'rlhfkit[tinker]'`)."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
uvicorn = pytest.importorskip("uvicorn")

from rlhfkit.models.tiny import tiny_model_and_tokenizer  # noqa: E402
from rlhfkit.serving.tinker.app import make_app  # noqa: E402
from rlhfkit.serving.tinker.host import ModelHost  # noqa: E402

KEY = "tml-test-key"
NAME = "tiny-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app over a fresh ModelHost in a uvicorn thread; `stop()` ends it (a 'restart' is a new Server)."""

    def __init__(self, root, full: bool = False, max_request_bytes: int = 8 << 20):
        model, tok = tiny_model_and_tokenizer(seed=0)
        self.host = ModelHost(model, tok, NAME, root, torch.device("cpu"), full=full)
        self.port = free_port()
        config = uvicorn.Config(make_app(self.host, KEY, max_request_bytes, poll_s=2.0), host="127.0.0.1",
                                port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key: str = KEY):
        return tinker.ServiceClient(base_url=self.url, api_key=key)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    srv = Server(tmp_path / "ckpt")
    yield srv
    srv.stop()


def datum(tokens: list[int], weights: list[float] | None = None):
    """Next-token prediction over `tokens`: input tokens[:-1], targets tokens[1:]."""
    inputs, targets = tokens[:-1], tokens[1:]
    w = weights if weights is not None else [1.0] * len(targets)
    return tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(inputs),
                              loss_fn_inputs={"target_tokens": np.asarray(targets, dtype=np.int64),
                                              "weights": np.asarray(w, dtype=np.float32)})


EXAMPLES = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35, 36]]


def sl_steps(tc, steps: int, lr: float = 1e-2) -> list[float]:
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward([datum(e) for e in EXAMPLES], "cross_entropy")
        tc.optim_step(tinker.types.AdamParams(learning_rate=lr)).result()
        losses.append(fb.result().metrics["loss:sum"])
    return losses


def test_sl_loop_loss_falls_and_outputs_logprobs(server):
    tc = server.client().create_lora_training_client(base_model=NAME, rank=8).result()
    losses = sl_steps(tc, 6)
    assert losses[-1] < 0.5 * losses[0], losses
    out = tc.forward([datum(EXAMPLES[0])], "cross_entropy").result()
    lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert lp.shape == (len(EXAMPLES[0]) - 1,) and np.all(lp <= 0)
    assert out.metrics["loss:sum"] == pytest.approx(-lp.sum(), rel=1e-5)
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 8 and info.model_data.model_name == NAME
