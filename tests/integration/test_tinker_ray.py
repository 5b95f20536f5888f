"""`rlhfkit serve-training --distributed.backend ray`: the models live in a Ray actor (a real local
cluster), the HTTP server in the test's process. Driven by the official `tinker` SDK, the actor-hosted
server answers exactly as the in-process one: the same losses over SL steps, the same samples and
logprobs, the same one-line error for a malformed datum, and the client's state stays in the actor."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray")
tinker = pytest.importorskip("tinker")

from rlhfkit.cli.serve_training import build_host, model_host  # noqa: E402 - after importorskip
from rlhfkit.config.serve_training import ServedDistributed, ServeTrainingConfig  # noqa: E402 - likewise
from rlhfkit.errors import DataError  # noqa: E402 - likewise
from rlhfkit.models.tiny import tiny_model_and_tokenizer  # noqa: E402 - likewise
from rlhfkit.serving.tinker.remote import RemoteHost  # noqa: E402 - likewise
from tests.integration.test_tinker_sdk import Server, datum, sl_steps  # noqa: E402 - likewise

PROMPT = [3, 10, 11, 12]


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return ServeTrainingConfig(model=str(tmp_path / "tiny"), device="cpu", output_dir=str(tmp_path / "ckpt"))


def session(host, root, name: str) -> dict:
    """An SL run, a sample and a malformed datum through the SDK against `host`."""
    srv = Server(root, host=host)
    try:
        tc = srv.client().create_lora_training_client(base_model=name, rank=4, seed=3).result()
        losses = sl_steps(tc, 3)
        sc = tc.save_weights_and_get_sampling_client("after-three")
        params = tinker.types.SamplingParams(max_tokens=5, temperature=1.0, seed=7)
        seqs = sc.sample(tinker.types.ModelInput.from_ints(PROMPT), num_samples=3, sampling_params=params)
        seqs = seqs.result().sequences
        wrong = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                                   loss_fn_inputs={"target_tokens": np.asarray([6, 7], dtype=np.int64),
                                                   "weights": np.asarray([1.0, 1.0], dtype=np.float32)})
        with pytest.raises(Exception) as bad:
            tc.forward_backward([wrong], "cross_entropy").result()
        after_error = tc.forward([datum([5, 6, 7, 8, 9, 10, 11, 12])], "cross_entropy").result().metrics["loss:sum"]
        return {"losses": losses, "tokens": [list(s.tokens) for s in seqs],
                "logprobs": [list(s.logprobs) for s in seqs], "error": str(bad.value).split("request_id")[0],
                "after_error": after_error, "rank": tc.get_info().lora_rank}
    finally:
        srv.stop()


def test_a_model_host_in_a_ray_actor_answers_as_the_local_one(cfg, tmp_path):
    local = session(build_host(cfg), tmp_path / "local", cfg.model)
    ray_cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "remote"),
                                  distributed=ServedDistributed(backend="ray", num_threads=1))
    with model_host(ray_cfg) as host:  # starts a local cluster (no Ray running in this process)
        assert isinstance(host, RemoteHost) and ray.is_initialized()
        assert host.device == "cpu" and host.name == cfg.model
        remote = session(host, tmp_path / "remote", cfg.model)
        with pytest.raises(AttributeError):
            host.base  # noqa: B018 - the models are in the actor, not here
        with pytest.raises(DataError, match="no such training model"):  # the actor's error, as itself
            host.info("nobody")
    assert not ray.is_initialized()  # shut down with the server
    assert remote["losses"][-1] < remote["losses"][0]
    np.testing.assert_allclose(remote["losses"], local["losses"], rtol=1e-5)
    assert remote["tokens"] == local["tokens"]
    np.testing.assert_allclose(np.asarray(remote["logprobs"]), np.asarray(local["logprobs"]), atol=1e-5)
    assert "one per input token" in remote["error"] and remote["error"] == local["error"]
    assert remote["after_error"] == pytest.approx(local["after_error"], rel=1e-5)
    assert remote["rank"] == local["rank"] == 4
    assert any((tmp_path / "remote").rglob("adapter_config.json"))  # the actor wrote the sampler checkpoint
