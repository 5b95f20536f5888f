"""serving.tinker.images (image chunks -> the processor's tokens and pixel tensors) and a LoRA host over
a vision-language model: adapters on the language model only, so several clients' rows with images
share one forward (models.lora_rows)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("peft")

from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.models.tiny_vision import save_tiny_vision, tiny_vision_model_and_processor
from rlhfkit.models.vision import vision_parts
from rlhfkit.serving.tinker.host import ModelHost
from rlhfkit.serving.tinker.images import ImageInputs
from rlhfkit.serving.tinker.wire import (
    FwdBwdRequest,
    SampleOptions,
    WireDatum,
    WireImage,
)


def png(color, size=(56, 56)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def qwen():
    return tiny_vision_model_and_processor("qwen2_vl", seed=0)


def test_each_image_becomes_its_tokens_and_the_tensors_concatenate_in_order(qwen):
    model, processor = qwen
    pad = model.config.image_token_id
    images = ImageInputs(processor, model.config)
    # 56 x 56: 4 x 4 patches of 14 pixels, merged 2 x 2: 4 tokens; 28 x 28: 1 token
    tokens, vision = images.expand([5, WireImage(png((200, 0, 0)), "png", 4), 6,
                                    WireImage(png((0, 0, 200), (28, 28)), "png")], "prompt")
    assert tokens == [5, pad, pad, pad, pad, 6, pad]
    assert vision.num_images == 2 and vision.tensors["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 2]]
    assert vision.tensors["pixel_values"].shape[0] == 16 + 4  # the patches of both images, in order
    assert images.expand([5, 6], "prompt") == ([5, 6], None)


def test_refusals_name_the_chunk(qwen):
    model, processor = qwen
    images = ImageInputs(processor, model.config)
    with pytest.raises(DataError, match=r"data\[0\], image 0: expected_tokens 3, but the model's processor makes 4 "
                                        "tokens of this 56x56 image"):
        images.expand([WireImage(png((1, 2, 3)), "png", 3)], "data[0]")
    with pytest.raises(DataError, match="token 90 .at 1. is the model's image placeholder"):
        images.expand([5, model.config.image_token_id], "prompt")
    with pytest.raises(DataError, match="image format 'gif'; send png or jpeg"):
        images.expand([WireImage(png((1, 2, 3)), "gif")], "prompt")
    with pytest.raises(DataError, match="cannot be decoded"):
        images.expand([WireImage(b"not an image", "png")], "prompt")
    text, _ = tiny_model_and_tokenizer(seed=0)
    with pytest.raises(DataError, match="the served model is a text-only model"):
        ImageInputs(None, text.config).expand([WireImage(png((1, 2, 3)), "png")], "prompt")


def datum(images: ImageInputs, color) -> WireDatum:
    tokens = [5, 6, WireImage(png(color), "png"), 7, 8, 9]
    n = len(images.expand(list(tokens), "x")[0])
    return WireDatum(tokens, {"target_tokens": np.arange(n) % 50 + 3, "weights": np.ones(n, np.float32)})


def test_lora_clients_of_a_vlm_share_forwards_with_adapters_outside_the_tower(tmp_path):
    """Qwen2.5-VL's tower has layers named like the language model's MLP (gate/up/down_proj); its
    forward sees every image's patches as one sequence, not the batch's rows, so per-row adapters
    there could not run. The adapters go on the language model only; two clients' data with
    images in one forward give each the loss and gradients of its request alone."""
    model, processor = tiny_vision_model_and_processor("qwen2_5_vl", seed=0)
    host = ModelHost(model, processor.tokenizer, "vlm", tmp_path, torch.device("cpu"), processor=processor)
    for k, mid in enumerate("ab"):
        host.create_model(mid, 4, seed=k)
        host.forward_backward(mid, "cross_entropy", {}, [datum(host.images, (200, 20 * k, 0))], forward_only=False)
        host.optim_step(mid, {"learning_rate": 3e-2})
    tower = [name for name, _ in vision_parts(host.base)]
    adapted = [n for n, m in host.peft.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)]
    assert adapted and not [n for n in adapted if any(f".{t}." in n for t in tower)]

    def requests():
        return [FwdBwdRequest(mid, 0, "cross_entropy", {}, False, [datum(host.images, c)])
                for mid, c in (("a", (10, 200, 30)), ("b", (0, 0, 220)))]

    together = host.forward_backward_many(requests())
    grads = {mid: [p.grad.clone() for p in host.models[mid].learner.params] for mid in "ab"}
    for mid in "ab":
        for p in host.models[mid].learner.params:
            p.grad = None
    for k, req in enumerate(requests()):
        (alone,) = host.forward_backward_many([req])
        assert together[k][1]["loss:sum"] == pytest.approx(alone[1]["loss:sum"], rel=1e-5)
        for g, p in zip(grads[req.model_id], host.models[req.model_id].learner.params, strict=True):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
    assert together[0][1]["loss:sum"] != pytest.approx(together[1][1]["loss:sum"], rel=1e-3)


def test_serve_training_loads_a_vlm_folder_with_its_processor(tmp_path):
    from rlhfkit.cli.serve_training import build_host
    from rlhfkit.config.serve_training import ServeTrainingConfig

    folder = save_tiny_vision(tmp_path / "vlm", "qwen2_vl")
    host = build_host(ServeTrainingConfig(model=str(folder), device="cpu", output_dir=str(tmp_path / "out")))
    assert host.images.processor is not None and host.max_context_length == 512
    session = host.create_sampler(None)
    prompt = [5, 6, WireImage(png((200, 0, 0)), "png", 4), 7]
    (out,) = host.sample([session], [prompt], 2, {"max_tokens": 3, "seed": 1}, [1], [SampleOptions(True)])
    seqs, prompt_lp, _ = out
    assert len(seqs) == 2 and len(prompt_lp) == 3 + 4  # the image's 4 tokens count as prompt positions


def test_a_prefix_lm_vlm_is_refused_in_one_line(tmp_path):
    """PaliGemma's prompt attends both ways, its response causally: a Tinker datum does not say where its prompt
    ends, so its forward would let the prompt see the response; the host refuses it instead."""
    model, processor = tiny_vision_model_and_processor("paligemma", seed=0)
    with pytest.raises(ConfigError, match="pg: a paligemma model .a prefix LM.* cannot be served for training") as err:
        ModelHost(model, processor.tokenizer, "pg", tmp_path, torch.device("cpu"), processor=processor)
    assert "\n" not in str(err.value)
