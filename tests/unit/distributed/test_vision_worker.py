"""A rollout worker with a vision-language policy, in this process (no Ray): it builds a VisionEngine
from the model folder, generates from the prompts' image tensors the samples the trainer's own engine
draws, returns them without the tensors, and the pool's helpers cut the tensors into shards and put the
trainer's copies back on the trajectories; a frozen tower is not sent at weight syncs."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from rlhfkit.data.batch import collate
from rlhfkit.data.images import encode
from rlhfkit.distributed.worker import RolloutWorker
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import save_tiny_vision, tiny_vision_model_and_processor
from rlhfkit.models.vision import freeze_visual_encoder
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine

PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0, n=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_vision(tmp_path_factory.mktemp("vlm") / "qwen", "qwen2_vl")


def image_prompts(processor):
    """(ids, VisionInputs) of two prompts with differently coloured and sized images."""
    out = []
    for colour, size in (((230, 30, 30), (40, 40)), ((30, 30, 230), (56, 28))):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(encode(processor, text, [Image.new("RGB", size, colour)]))
    return out


@pytest.mark.parametrize("partial_tokens", [0, 2])
def test_worker_samples_from_the_images_as_the_trainers_engine_does(folder, partial_tokens):
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    batch = image_prompts(processor)
    ids, vision = [p for p, _ in batch], [v for _, v in batch]
    worker = RolloutWorker(str(folder), None, "float32", None, None, partial_tokens=partial_tokens)
    assert isinstance(worker.engine, VisionEngine)
    worker.update_weights(model.state_dict(), 0)
    got = worker.generate(ids, PARAMS, seeds=[3, 4], vision=vision)
    want = VisionEngine(model, processor.tokenizer).generate(ids, PARAMS, seeds=[3, 4], vision=vision)
    assert [t.response_ids.tolist() for t in got] == [t.response_ids.tolist() for t in want]
    assert all("vision" not in t.info for t in got)  # the pool puts the trainer's tensors back
    for k, t in enumerate(got):  # the worker's logprobs are the trainer's forward over the prompt's images
        t.info["vision"] = vision[k // PARAMS.n]
    with torch.no_grad():
        logp, _ = response_logprobs(model, collate(got, processor.tokenizer.pad_token_id))
    for i, t in enumerate(got):
        torch.testing.assert_close(logp[i, : t.response_length], t.logprobs, rtol=0, atol=2e-5)


def test_pool_helpers_shard_the_images_and_put_the_trainers_back():
    pytest.importorskip("ray")
    from rlhfkit.data.types import Trajectory
    from rlhfkit.distributed.pool import shard_images, with_images

    a, b = object(), object()
    assert shard_images(None, 0, 2) is None
    assert shard_images([a, None, b], 1, 2) is None  # no image in the shard: nothing to ship
    assert shard_images([a, None, b], 1, 3) == [None, b]
    trajs = [Trajectory(torch.tensor([1]), torch.tensor([2]), torch.ones(1, dtype=torch.bool), torch.zeros(1),
                        "stop", 0) for _ in range(4)]
    with_images(trajs, [None, b], n=2)
    assert ["vision" in t.info for t in trajs] == [False, False, True, True]
    assert trajs[2].info["vision"] is b and trajs[3].info["vision"] is b  # one object per prompt


def test_a_frozen_tower_is_not_sent_at_weight_syncs():
    pytest.importorskip("ray")
    from rlhfkit.distributed.pool import policy_state

    model, _ = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    assert policy_state(model).keys() == model.state_dict().keys()
    freeze_visual_encoder(model)
    sent = policy_state(model)
    left = set(model.state_dict()) - set(sent)
    assert left and all(k.startswith("model.visual.") for k in left)
    assert any(k.startswith("model.language_model.") for k in sent) and "lm_head.weight" in sent


def test_a_lora_worker_with_a_frozen_tower_wraps_the_trainers_adapters_and_samples_as_it_does(tmp_path):
    """LLaVA's CLIP tower has q_proj / v_proj layers too: peft's name matching would adapt them."""
    pytest.importorskip("ray")
    from rlhfkit.distributed.pool import policy_state
    from rlhfkit.models.lora import add_lora
    from rlhfkit.models.vision import language_lora_targets

    folder = save_tiny_vision(tmp_path / "llava", "llava")
    model, processor = tiny_vision_model_and_processor("llava", seed=0)
    policy = add_lora(model, 4, 8, language_lora_targets(model, ("q_proj", "v_proj")), 0.0)
    with torch.no_grad():  # adapters that moved off zero, as after training
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    worker = RolloutWorker(str(folder), None, "float32", None, None, lora=(4, 8, ("q_proj", "v_proj"), 0.0),
                           frozen_tower=True)
    assert not any("lora_" in n for n, _ in worker.engine.model.named_parameters() if "vision_tower" in n)
    worker.update_weights(policy_state(policy), 1)  # adapter weights only; an unknown key would raise
    batch = image_prompts(processor)
    ids, vision = [p for p, _ in batch], [v for _, v in batch]
    got = worker.generate(ids, PARAMS, seeds=[5, 6], vision=vision)
    want = VisionEngine(policy, processor.tokenizer).generate(ids, PARAMS, seeds=[5, 6], vision=vision)
    assert [t.response_ids.tolist() for t in got] == [t.response_ids.tolist() for t in want]
    torch.testing.assert_close(torch.cat([t.logprobs for t in got]), torch.cat([t.logprobs for t in want]),
                               rtol=0, atol=2e-5)
