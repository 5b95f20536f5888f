"""--rollout.engine vllm with --distributed.backend ray: vLLM engines in Ray rollout worker actors
(OpenRLHF's layout), on a local Ray cluster whose processes import a fake `vllm` (tests/fakes/vllm: the
model folder loaded with transformers behind rlhfkit's real weight-sync extension, so the tokens are
real). Each worker builds its own engine, the prompts reach the engines, every weight sync reaches every
engine (the last one bit for bit the trained model), and two engine actors train exactly as one vLLM
engine in the trainer's process; with QLoRA the engines sample with the dequantized base and the merged
adapters; with a vision-language policy (a tiny Qwen2-VL, frozen tower) the engines get each prompt's decoded
images (the fake expands them as vLLM would and samples over the HF processor's pixel tensors) and train as
the in-process engine does, the tower left out of their weight syncs. Not checked here: real vLLM, GPUs,
placement on GPUs."""

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ray = pytest.importorskip("ray")

from rlhfkit.cli.main import main  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.distributed.launch import ray_temp_dir  # noqa: E402 - likewise
from tests.integration.conftest import (  # noqa: E402 - likewise
    colour_workspace,
    fake_vllm_env,
    fake_vllm_events,
    rl_flags,
    vision_rl_flags,
)

VOLATILE = ("time/", "rollout_tokens_per_s", "rollout/logprob_gap")
STEPS = 3


@pytest.fixture(scope="module")
def ws(tiny_ws):
    return tiny_ws("ray_vllm", [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(24)], sevens=True)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """A local Ray cluster whose every process imports the fake vllm; yields the fake's log file."""
    path = tmp_path_factory.mktemp("vllm_log") / "events.jsonl"
    ray.init(num_cpus=4, _temp_dir=ray_temp_dir(tmp_path_factory.mktemp("ray")), include_dashboard=False,
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


# Reward: the vowels of the response (varies within every group of the tiny random model's samples: both steps train)
VOWELS_REWARD = """
import torch

def reward_func(queries, prompts, labels, **kwargs):
    return torch.tensor([float(sum(c in "aeiou" for c in q[len(p):])) for q, p in zip(queries, prompts)])
"""


@pytest.fixture(scope="module")
def vlm_ws(tmp_path_factory):
    ws = colour_workspace(tmp_path_factory.mktemp("ray_vllm_vision"))
    (ws / "vowels.py").write_text(VOWELS_REWARD)
    return ws


def test_two_vllm_engine_actors_with_a_vision_language_policy_train_as_one_vllm_engine_in_the_trainers_process(
        vlm_ws, log):
    ws = vlm_ws
    vllm_frozen = {"rollout.engine": "vllm", "actor.freeze_visual_encoder": "true",
                   "reward.remote_url": ws / "vowels.py"}
    one = by_engine(train(log, vision_rl_flags(ws, ws / "local", **vllm_frozen), in_ray=True))
    two = by_engine(train(log, vision_rl_flags(ws, ws / "ray", **vllm_frozen, **{
        "distributed.backend": "ray", "rollout.num_workers": "2"})))
    a, b = (load_file(ws / run / "final" / "model.safetensors") for run in ("local", "ray"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(ws / "vlm" / "model.safetensors")
    assert any(not torch.equal(start[k], b[k]) for k in start if k.startswith("model.layers."))
    assert rows_of(ws / "local") == rows_of(ws / "ray") and len(rows_of(ws / "ray")) == 2
    full = [json.loads(line) for line in (ws / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/logprob_gap_max"] < 1e-4 for r in full)  # the engines' logprobs: the trainer's forward
    assert all(r["actor/grad_norm"] > 0 for r in full)  # both steps train: the second samples with synced weights
    assert len(one) == 1 and len(two) == 2
    (local_events,) = one.values()
    image = json.loads((ws / "vlm" / "config.json").read_text())["image_token_id"]
    asked = [e for e in local_events if e["event"] == "generate"]
    for events in two.values():
        assert events[0]["limit_mm_per_prompt"] == {"image": 1}  # --data.max_images_per_prompt
        calls = [e for e in events if e["event"] == "generate"]
        assert len(calls) == 2 and all(len(c["prompts"]) == 4 for c in calls)  # 8 requests a step, 4 each
        for call, whole in zip(calls, asked):  # one image and one placeholder a request, the in-process requests
            assert call["images"] == [1] * 4 and all(p.count(image) == 1 for p in call["prompts"])
            assert all(p in whole["prompts"] for p in call["prompts"])
    # the tower is not sent to the engine actors (it stays as loaded), the rest bit for bit the in-process engine's
    local_loads = [e for e in local_events if e["event"] == "load"]
    tower = sum(k.startswith("visual.") for k in start)  # the folder's names (model.visual.* in memory)
    assert tower and all(e["tensors"] == len(start) for e in local_loads)
    for events in two.values():
        loads = [e for e in events if e["event"] == "load"]
        assert all(e["tensors"] == len(start) - tower for e in loads)
        assert [e["digest"] for e in loads][1:] == [e["digest"] for e in local_loads][:-1]
