"""FSDP2 with vision-language models, in one process (a 1-rank gloo group), on the tiny families:
each decoder layer of the language model and each block of the vision tower is its own unit, and the
sharded model samples (the vision engine over the gathered parameters) and scores (the trainer's
forward with the images) what the unsharded model does."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from rlhfkit.data.batch import collate
from rlhfkit.distributed import fsdp
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import FAMILIES, tiny_vision_model_and_processor
from rlhfkit.models.vision import base_model, vision_parts
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine
from tests.unit.distributed.test_vision_worker import image_prompts


@pytest.fixture(scope="module", autouse=True)
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _generate(model, processor, gather):
    engine = VisionEngine(model, processor.tokenizer, inference_mode=False, gather=gather)
    batch = image_prompts(processor)
    return engine.generate([p for p, _ in batch], SamplingParams(max_new_tokens=5, temperature=1.0, n=2),
                           seeds=[1, 2], vision=[v for _, v in batch])


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_vlm_samples_and_scores_as_the_unsharded_one(family):
    model, processor = tiny_vision_model_and_processor(family, seed=0)
    plain, _ = tiny_vision_model_and_processor(family, seed=0)
    fsdp.shard_model(model, 1)
    base = base_model(model)
    towers = [m for _, m in vision_parts(model)]
    blocks = [m for t in towers for n, m in t.named_modules()
              if n.rsplit(".", 2)[-2:-1] in (["layers"], ["blocks"], ["layer"])]  # InternVL: encoder.layer
    language = getattr(base, "language_model", None) or base.text_model  # SmolVLM / Idefics3: text_model
    assert blocks and all(isinstance(m, FSDPModule) for m in [*blocks, *language.layers])
    assert not any(isinstance(m, FSDPModule) for m in towers)  # their other parameters go with the base model
    trajs = _generate(model, processor, fsdp.unsharded)
    want = _generate(plain, processor, None)
    assert [t.response_ids.tolist() for t in trajs] == [t.response_ids.tolist() for t in want]
    batch = collate(trajs, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        ours, _ = response_logprobs(model, batch)
        theirs, _ = response_logprobs(plain, batch)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    for i, t in enumerate(trajs):  # the engine's logprobs are the forward's, images included
        torch.testing.assert_close(ours[i, : t.response_length], t.logprobs, rtol=0, atol=2e-5)
