"""--distributed.backend ray with a vision-language policy (a tiny random Qwen2-VL) on a real local Ray
cluster: 2 rollout workers + the trainer actor give bit for bit the single-process run (the workers
get each prompt's image tensors; the trajectories carry them to the trainer's forward), with the
frozen tower left out of the weight syncs; an async run trains, and its first batch's worker logprobs
are the trainer's forward over the same images."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

pytest.importorskip("ray")

from rlhfkit.cli.main import main
from tests.integration import test_distributed_ray
from tests.integration.conftest import colour_workspace, vision_rl_flags
from tests.integration.test_distributed_ray import rows_of


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return colour_workspace(tmp_path_factory.mktemp("vision_ray"))


flags = vision_rl_flags
cluster = test_distributed_ray.cluster  # a local Ray cluster for this module
RAY = {"distributed.backend": "ray", "rollout.num_workers": 2}


def test_sync_two_workers_equal_the_single_process_run_with_a_frozen_tower(ws, cluster):
    frozen = {"actor.freeze_visual_encoder": "true"}
    assert main(["train", "rl", *flags(ws, ws / "local", **frozen)]) == 0
    assert main(["train", "rl", *flags(ws, ws / "ray", **frozen, **RAY)]) == 0
    a, b = (load_file(ws / run / "final" / "model.safetensors") for run in ("local", "ray"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(ws / "vlm" / "model.safetensors")
    assert any(not torch.equal(start[k], b[k]) for k in start if k.startswith("model.layers."))
    ra, rb = rows_of(ws / "local"), rows_of(ws / "ray")
    assert len(ra) == 2 and ra == rb
    full = [json.loads(line) for line in (ws / "ray" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/logprob_gap_max"] < 1e-4 for r in full)  # the workers' logprobs: the trainer's forward
    assert (ws / "ray" / "final" / "processor_config.json").is_file()


def test_async_run_trains_on_images_generated_ahead(ws, cluster):
    out = ws / "ray_async"
    over = {"train.async_enable": "true", "train.max_staleness": 1, "train.max_steps": 3}
    assert main(["train", "rl", *flags(ws, out, **over, **RAY)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1 for r in steps) and steps[0]["async/staleness_max"] == 0
    assert steps[0]["rollout/logprob_gap_max"] < 1e-4  # batch 1: generated at the trainer's version
    start, final = load_file(ws / "vlm" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(start[k], final[k]) for k in start if k.startswith("visual."))


def test_qlora_on_two_workers_samples_with_the_same_4bit_language_model_and_images(ws, cluster):
    """--ds.load_in_4bit: each worker loads the language model's linear layers as the trainer's 4-bit NF4
    weights (tower, projector and head float) under the same adapters: the single-process run's adapters
    bit for bit, and the workers' logprobs are the trainer's forward over the same images."""
    pytest.importorskip("bitsandbytes")
    qlora = {"ds.lora.rank": "4", "ds.lora.alpha": "8", "ds.load_in_4bit": "true",
             "actor.freeze_visual_encoder": "true"}
    assert main(["train", "rl", *flags(ws, ws / "qlora_local", **qlora)]) == 0
    assert main(["train", "rl", *flags(ws, ws / "qlora_ray", **qlora, **RAY)]) == 0
    a, b = (load_file(ws / run / "final" / "adapter_model.safetensors") for run in ("qlora_local", "qlora_ray"))
    assert a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    full = [json.loads(line) for line in (ws / "qlora_ray" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/logprob_gap_max"] for r in full if "rollout/logprob_gap_max" in r]
    assert len(gaps) == 2 and max(gaps) < 1e-4, gaps
