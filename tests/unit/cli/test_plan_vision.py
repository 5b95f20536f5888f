"""`rlhfkit plan` with a vision-language model: every parameter counted (vision tower and projector
included, exactly as the built model has them), the image tokens added to every prompt, and a
frozen tower dropped from gradients, optimizer state and activations; by hand on tiny models."""

import json

import pytest

from rlhfkit.cli.main import main
from rlhfkit.cli.plan_cmd import format_memory
from rlhfkit.config import RLConfig
from rlhfkit.models.memory import GiB
from rlhfkit.models.tiny_vision import FAMILIES, save_tiny_vision, tiny_vision_model_and_processor
from rlhfkit.models.vision import vision_parts, vision_sizes


def estimate(folder, *flags, image_tokens=None):
    cfg = RLConfig.from_args(["--actor.model_name_or_path", str(folder), "--actor.autocast", "none",
                              "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2",
                              "--rollout.max_new_tokens", "6", "--train.batch_size", "4",
                              "--train.micro_batch_size", "1", *flags])
    lines = format_memory(cfg, json.loads((folder / "config.json").read_text()), 10, image_tokens)
    return {line.split()[0]: line for line in lines}


@pytest.mark.parametrize("family", FAMILIES)
def test_parameters_include_the_tower_and_a_frozen_tower_has_no_gradients(tmp_path, family):
    save_tiny_vision(tmp_path, family)
    model, _ = tiny_vision_model_and_processor(family)
    total = sum(p.numel() for p in model.parameters())
    tower = sum(p.numel() for _, m in vision_parts(model) for p in m.parameters())
    trained, frozen = estimate(tmp_path), estimate(tmp_path, "--actor.freeze_visual_encoder")
    assert f"{total / 1e6:.1f}M" in trained["parameters"]
    assert f"{tower / 1e6:.2f}M params (trained)" in trained["vision"]

    def grads(lines) -> float:
        return float(lines["gradients"].split()[1])

    assert grads(trained) == pytest.approx(total * 4 / GiB, abs=1e-3)
    assert grads(frozen) == pytest.approx((total - tower) * 4 / GiB, abs=1e-3)


def test_image_tokens_are_added_to_every_prompt(tmp_path):
    """Qwen2-VL (2 layers, 2 KV heads of 8 dims, float32): the KV cache of 4 sequences of
    10 + 64 image + 6 tokens is 2 x 2 x 2 x 8 x 4 x 80 x 4 bytes; 256 tokens per image by default."""
    save_tiny_vision(tmp_path, "qwen2_vl")
    lines = estimate(tmp_path, "--data.max_images_per_prompt", "2", image_tokens=32)
    assert "image tokens per prompt        64   (2 --data.max_images_per_prompt x 32 per image" in lines["image"]
    kv = 2 * 2 * 2 * 8 * 4 * (10 + 64 + 6) * 4
    assert float(lines["kv_cache"].split()[1]) == pytest.approx(kv / GiB, abs=1e-3)
    assert "x 256 per image, assumed" in estimate(tmp_path)["image"]
    assert "x 4 per image, fixed by the model" in estimate(save_tiny_vision(tmp_path / "g", "gemma3"))["image"]


def test_plan_command_counts_a_vision_dataset(tmp_path, capsys):
    from rlhfkit.data.synthetic_vision import write_colour_task

    save_tiny_vision(tmp_path / "vlm")
    write_colour_task(tmp_path / "colours", n_train=12, n_test=3)
    assert main(["plan", "--actor.model_name_or_path", str(tmp_path / "vlm"), "--data.prompt_dataset",
                 str(tmp_path / "colours" / "train.jsonl"), "--data.input_key", "prompt", "--rollout.batch_size",
                 "4", "--train.batch_size", "8"]) == 0
    out = capsys.readouterr().out
    assert "dataset prompts                12" in out and "vision tower" in out


@pytest.mark.parametrize("family,tokens,patches,fixed", [
    ("llava", 4, 4, True),  # a 28-pixel image of 14-pixel patches, a token each
    ("gemma3", 4, 16, True),  # mm_tokens_per_image 4, pooled from 28 / 7 = 4 x 4 patches
    ("qwen2_5_vl", 10, 40, False),  # merged 2 x 2 (spatial_merge_size)
    ("qwen3_5", 10, 40, False),
    ("smolvlm", 10, 40, False),  # pixel-shuffled 2 x 2 (scale_factor), as many sub-images as the image gives
    ("internvl", 10, 40, False),  # downsample_ratio 0.5 a side, as many tiles as the image gives
    ("gemma4", 10, 40, False),  # pooled 2 x 2 (pooling_kernel_size), as many as the aspect ratio gives
    ("mistral3", 10, 40, False),  # merged 2 x 2 (the model's spatial_merge_size), as many as the image's size gives
])
def test_image_tokens_and_tower_patches_follow_each_familys_layout(tmp_path, family, tokens, patches, fixed):
    """10 tokens per image asked for (--plan.image_tokens): fixed-size families keep their own count."""
    sizes = vision_sizes(json.loads((save_tiny_vision(tmp_path, family) / "config.json").read_text()), 10)
    assert (sizes["image_tokens"], sizes["patches"], sizes["fixed_tokens"]) == (tokens, patches, fixed)
