"""`rlhfkit train sft`, `train dpo` and `train kto` on image data with a tiny vision-language model: all train
through the images (the vision tower's weights move), save the processor beside the weights, and a
bad image is one line with no run folder written."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.data.synthetic_vision import write_colour_task
from rlhfkit.models.tiny_vision import save_tiny_vision
from rlhfkit.models.vision import load_processor


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision_sup")
    save_tiny_vision(root / "vlm", "llava")
    colour_pairs(write_colour_task(root / "colours", n_train=16, n_test=4))
    return root


def colour_pairs(colours):
    """pairs.jsonl beside the colour task's train.jsonl (each prompt, its label chosen, another colour
    rejected) and kto.jsonl (each image with its colour, desirable, or another one, undesirable)."""
    rows = [json.loads(line) for line in (colours / "train.jsonl").read_text().splitlines()]
    others = {"red": "blue", "green": "red", "blue": "green"}
    pairs = [dict(r, chosen=r["label"], rejected=others[r["label"]]) for r in rows]
    (colours / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    unpaired = [dict(r, output=r["label"] if i % 2 else others[r["label"]], desirable=bool(i % 2))
                for i, r in enumerate(rows)]
    (colours / "kto.jsonl").write_text("".join(json.dumps(u) + "\n" for u in unpaired))


def run(kind, ws, out, data, *extra):
    keys = {"sft": ["--data.input_key", "prompt", "--data.output_key", "label"],
            "kto": ["--data.prompt_key", "prompt", "--data.output_key", "output", "--data.label_key", "desirable"]
            }.get(kind, ["--data.prompt_key", "prompt"])
    args = ["--model.model_name_or_path", str(ws / "vlm"), "--data.dataset", str(data), *keys,
            "--data.image_key", "images", "--train.batch_size", "8", "--train.micro_batch_size", "4",
            "--train.max_steps", "2", "--adam.lr", "1e-2", "--model.autocast", "none", "--logger.progress_bar",
            "false", "--ckpt.output_dir", str(out), *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rlhfkit.cli.main", "train", kind, *args], env=env,
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("kind,data", [("sft", "train.jsonl"), ("dpo", "pairs.jsonl"), ("kto", "kto.jsonl")])
def test_sft_dpo_and_kto_train_through_the_images(ws, tmp_path, kind, data):
    out = tmp_path / kind
    done = run(kind, ws, out, ws / "colours" / data, "--ds.packing_samples", "true")
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = load_file(ws / "vlm" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    tower = [k for k in before if "vision_tower" in k]
    assert any(not torch.equal(before[k], after[k]) for k in tower)  # the loss reached the images' encoder
    assert type(load_processor(str(out / "final"))).__name__ == "LlavaProcessor"


def test_a_missing_image_is_one_line_and_nothing_is_written(ws, tmp_path):
    rows = [json.loads(line) for line in (ws / "colours" / "train.jsonl").read_text().splitlines()]
    rows = [dict(r, images=[str(ws / "colours" / r["images"][0])]) for r in rows]
    rows[5]["images"] = [str(tmp_path / "gone.png")]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "never"
    done = run("sft", ws, out, path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "bad.jsonl, line 6, image 0: image file" in lines[0] and "gone.png" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("kind,data", [("sft", "train.jsonl"), ("dpo", "pairs.jsonl")])
def test_lora_sft_and_dpo_of_a_vlm_save_an_adapter_that_merges_into_a_vlm_folder(ws, tmp_path, kind, data):
    out = tmp_path / kind
    done = run(kind, ws, out, ws / "colours" / data, "--ds.lora.rank", "4", "--ds.lora.alpha", "8")
    assert done.returncode == 0, done.stderr[-2000:]
    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and bool(v.abs().sum() > 0) for k, v in adapter.items())  # trained
    assert type(load_processor(str(out / "final"))).__name__ == "LlavaProcessor"
    if kind != "sft":
        return
    merged = tmp_path / "merged"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "rlhfkit.cli.main", "lora", "merge", "--lora.adapter",
                           str(out / "final"), "--ckpt.output_dir", str(merged)], env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = load_file(ws / "vlm" / "model.safetensors"), load_file(merged / "model.safetensors")
    assert before.keys() == after.keys()  # the VLM's own layout, tower included
    assert any(not torch.equal(before[k], after[k]) for k in before if "language_model" in k)
    assert type(load_processor(str(merged))).__name__ == "LlavaProcessor"
