"""--rollout.engine vllm with --distributed.backend ray: vLLM engines in Ray rollout worker actors
(OpenRLHF's layout), on a local Ray cluster whose processes import a fake `vllm` (tests/fakes/vllm: the
model folder loaded with transformers behind rlhfkit's real weight-sync extension, so the tokens are
real). Each worker builds its own engine, the prompts reach the engines, every weight sync reaches every
engine (the last one bit for bit the trained model), and two engine actors train exactly as one vLLM
engine in the trainer's process; with QLoRA the engines sample with the dequantized base and the merged
adapters. Not checked here: real vLLM, GPUs, placement on GPUs."""

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ray = pytest.importorskip("ray")

from rlhfkit.cli.main import main  # noqa: E402 - after the Ray settings and importorskip
from tests.integration.conftest import fake_vllm_env, fake_vllm_events, rl_flags  # noqa: E402 - likewise

VOLATILE = ("time/", "rollout_tokens_per_s", "rollout/logprob_gap")
STEPS = 3


@pytest.fixture(scope="module")
def ws(tiny_ws):
    return tiny_ws("ray_vllm", [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(24)], sevens=True)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """A local Ray cluster whose every process imports the fake vllm; yields the fake's log file."""
    path = tmp_path_factory.mktemp("vllm_log") / "events.jsonl"
    ray.init(num_cpus=4, _temp_dir=str(tmp_path_factory.mktemp("ray")), include_dashboard=False,
             runtime_env={"env_vars": fake_vllm_env(path)})
    yield path
    ray.shutdown()


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "rollout.engine": "vllm", "rollout.batch_size": "4", "rollout.n_samples_per_prompt": "4",
        "rollout.max_new_tokens": "8", "train.batch_size": "16", "train.micro_batch_size": "8",
        "train.max_steps": str(STEPS), "train.num_threads": "1", "actor.adam.lr": "1e-2",
        "actor.lr_scheduler": "constant", **over})


def train(log, argv, in_ray: bool = False) -> list[dict]:
    """`rlhfkit train rl ARGV` (with `in_ray`, as a Ray task: a process that imports the fake vllm);
    returns the fake engines' records of this run."""
    log.unlink(missing_ok=True)
    code = ray.get(ray.remote(main).remote(["train", "rl", *argv])) if in_ray else main(["train", "rl", *argv])
    assert code == 0
    return fake_vllm_events(log)


def rows_of(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def gaps(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["rollout/logprob_gap_mean"] for r in rows if "rollout/logprob_gap_mean" in r]


def by_engine(events) -> dict[int, list[dict]]:
    engines: dict[int, list[dict]] = {}
    for e in events:
        engines.setdefault(e["pid"], []).append(e)
    return engines


def digest(state: dict) -> str:
    """The fake's `weights_digest` of a model whose state dict is `state`."""
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(name.encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_two_vllm_engine_actors_train_as_one_vllm_engine_in_the_trainers_process(ws, log):
    local, out = ws / "local", ws / "ray"
    one = by_engine(train(log, flags(ws, local), in_ray=True))
    two = by_engine(train(log, flags(ws, out, **{"distributed.backend": "ray", "rollout.num_workers": "2"})))
    # the same run: weights bit for bit, every metric but timings and the float-noise logprob gap
    a, b = load_file(local / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(rows_of(out)) == STEPS and rows_of(local) == rows_of(out)
    assert rows_of(out)[-1]["actor/grad_norm"] > 0 and max(gaps(out)) < 1e-4
    assert len(one) == 1 and len(two) == 2  # one engine in the trainer's process; one per worker actor
    for events in two.values():
        init = events[0]
        assert init["event"] == "init" and init["model"] == str(ws / "tiny")
        assert (init["tensor_parallel_size"], init["enable_sleep_mode"], init["seed"]) == (1, False, 42)
        assert init["gpu_memory_utilization"] == 0.5  # no GPUs of its own (a CPU machine)
    # each step the 16 requests (4 prompts x 4 samples) split 8 / 8 over the two engines, the same requests
    (local_events,) = one.values()
    asked = [e["prompts"] for e in local_events if e["event"] == "generate"]
    per_engine = [[e["prompts"] for e in events if e["event"] == "generate"] for events in two.values()]
    assert len(asked) == STEPS and all(len(p) == 16 for p in asked)
    assert all(len(p) == 8 for engine in per_engine for p in engine)
    assert all(want in (x + y, y + x) for x, y, want in zip(*per_engine, asked))  # a contiguous half each
    # the in-process engine loads the weights after every step (the last: the final model); a worker's engine
    # loads the trainer's weights when it is made, then what arrived since at the start of each generation
    local_loads = [e["digest"] for e in local_events if e["event"] == "load"]
    assert len(local_loads) == STEPS and local_loads[-1] == digest(b) and len(set(local_loads)) == STEPS
    for events in two.values():
        loads = [e for e in events if e["event"] == "load"]
        assert all(e["tensors"] == 21 for e in loads)
        assert [e["digest"] for e in loads][1:] == local_loads[:-1]  # versions 1 .. STEPS - 1, bit for bit


def test_qlora_on_vllm_engine_actors_samples_with_the_dequantized_base_and_merged_adapters(ws, log):
    pytest.importorskip("bitsandbytes")
    out = ws / "ray_qlora"
    engines = by_engine(train(log, flags(ws, out, **{
        "distributed.backend": "ray", "rollout.num_workers": "2", "ds.load_in_4bit": "true", "ds.lora.rank": "4",
        "ds.lora.alpha": "8", "ds.lora.target_modules": "q_proj,v_proj"})))
    assert len(engines) == 2
    for events in engines.values():  # the whole dequantized model first, then the attention blocks
        assert [e["tensors"] for e in events if e["event"] == "load"] == [21] + [8] * (STEPS - 1)
    assert len(gaps(out)) == STEPS and max(gaps(out)) < 1e-4, gaps(out)
    assert (out / "final" / "adapter_config.json").is_file()
