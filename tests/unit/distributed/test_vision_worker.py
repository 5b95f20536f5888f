"""A rollout worker with a vision-language policy, in this process (no Ray): it builds a VisionEngine
from the model folder, generates from the prompts' image tensors the samples the trainer's own engine
draws, returns them without the tensors, and the pool's helpers cut the tensors into shards and put the
trainer's copies back on the trajectories; a frozen tower is not sent at weight syncs. A worker holding a
vLLM engine (a fake `vllm.LLM`) gets the image settings and the prompts' decoded images alone, and samples
as the in-process vLLM engine does."""

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


def test_the_pool_ships_vllm_workers_the_decoded_images_and_hf_workers_the_tensors():
    pytest.importorskip("ray")
    from rlhfkit.distributed.pool import for_workers

    _, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    (_, vision), _ = image_prompts(processor)
    decoded, tensors = for_workers([vision, None], True), for_workers([vision, None], False)
    assert decoded[1] is None and tensors[1] is None
    assert decoded[0].tensors == {} and decoded[0].images == vision.images and decoded[0].num_images == 1
    assert tensors[0].images == () and tensors[0].tensors is vision.tensors
    assert vision.images and vision.tensors  # the trainer's own copy keeps both


def test_a_vllm_worker_samples_from_the_decoded_images_as_the_in_process_vllm_engine_does(folder, monkeypatch):
    """The worker's VLLMEngine takes the image settings from its `vllm` settings and the prompts' decoded images
    alone (the pool strips the tensors); its samples are the in-process vLLM engine's, without the images."""
    import sys
    from types import SimpleNamespace

    from rlhfkit.api.vision import vllm_image_settings
    from rlhfkit.config import RLConfig
    from rlhfkit.distributed.pool import for_workers
    from rlhfkit.rollout.vllm import VLLMEngine
    from tests.unit.rollout.test_vllm_vision import ExpandingLLM

    pytest.importorskip("ray")
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    settings = vllm_image_settings(RLConfig.from_args(["--actor.model_name_or_path", "x"]), processor, model.config)
    eos = [processor.tokenizer.eos_token_id]
    worker = RolloutWorker(str(folder), None, "float32", None, None,
                           vllm={"eos_ids": eos, "llm": ExpandingLLM(model, processor), **settings})
    batch = image_prompts(processor)
    ids, vision = [p for p, _ in batch], [v for _, v in batch]
    got = worker.generate(ids, PARAMS, seeds=[3, 4], vision=for_workers(vision, True))
    want = VLLMEngine("/m", eos, llm=ExpandingLLM(model, processor), **settings).generate(
        ids, PARAMS, seeds=[3, 4], vision=vision)
    assert [t.response_ids.tolist() for t in got] == [t.response_ids.tolist() for t in want]
    assert [t.logprobs.tolist() for t in got] == [t.logprobs.tolist() for t in want]
    assert all("vision" not in t.info for t in got)  # the pool puts the trainer's VisionInputs back


def test_vllm_workers_are_sent_no_frozen_tower():
    pytest.importorskip("ray")
    from rlhfkit.distributed.pool import engine_state

    model, _ = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    assert engine_state(model, True).keys() == model.state_dict().keys()
    freeze_visual_encoder(model)
    for full in (True, False):  # vLLM loads the tower from the same files: it never changes
        left = set(model.state_dict()) - set(engine_state(model, full))
        assert left and all(k.startswith("model.visual.") for k in left)
