"""VLLMEngine with a vision-language policy, on a fake `vllm.LLM` that does what vLLM does with a token
prompt and images (no vllm here): it expands the prompt's image placeholders with the model's HF
processor, then samples from the tiny model over those images. The engine sends each prompt's ids with
one placeholder per image and its decoded images, bans the placeholder tokens, and returns trajectories
holding the trainer's ids and image tensors: the trainer's forward over them gives the logprobs the
fake sampled with. Gemma 3, whose processor wraps the image tokens, is refused where the engine is built."""

import sys
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from rlhfkit.api.vision import vllm_image_settings
from rlhfkit.config import RLConfig
from rlhfkit.data.batch import collate
from rlhfkit.data.images import encode
from rlhfkit.errors import ConfigError
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.rollout import vllm as V
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine

PARAMS = SamplingParams(max_new_tokens=5, temperature=1.0, n=2)


class ExpandingLLM:
    """A fake `vllm.LLM`: each request's token prompt is decoded and run through the HF processor with
    its images (vLLM's own expansion of input placeholders), then one sample is drawn by the HF vision
    engine with the request's seed. Records what it was sent and what it expanded."""

    def __init__(self, model, processor):
        self.engine, self.processor = VisionEngine(model, processor.tokenizer), processor
        self.requests, self.params, self.expanded = [], [], []

    def generate(self, requests, sampling_params, use_tqdm):
        outs = []
        for request, sp in zip(requests, sampling_params):
            self.requests.append(request)
            self.params.append(sp)
            text = self.processor.tokenizer.decode(request["prompt_token_ids"])
            images = request.get("multi_modal_data", {}).get("image", [])
            ids, vision = encode(self.processor, text, images)
            self.expanded.append((ids, vision))
            [t] = self.engine.generate([ids], SamplingParams(max_new_tokens=sp["max_tokens"], temperature=1.0),
                                       seeds=[sp["seed"]], vision=[vision])
            tokens = t.response_ids.tolist()
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(
                token_ids=tokens, logprobs=[{tok: float(lp)} for tok, lp in zip(tokens, t.logprobs)],
                finish_reason="length")]))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))


def chat_prompts(processor, images_per_prompt=((40, 40),), colours=((230, 30, 30), (30, 30, 230))):
    """[(template text, expanded ids, VisionInputs)] of one prompt per colour."""
    out = []
    for colour in colours:
        content = [{"type": "image"} for _ in images_per_prompt] + [{"type": "text", "text": "colour?"}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
        images = [Image.new("RGB", size, colour) for size in images_per_prompt]
        out.append((text, *encode(processor, text, images)))
    return out


def config(*flags):
    return RLConfig.from_args(["--actor.model_name_or_path", "x", "--data.max_images_per_prompt", "2", *flags])


@pytest.mark.parametrize("family,sizes", [("qwen2_vl", ((40, 40),)), ("qwen2_vl", ((56, 28), (28, 56))),
                                          ("llava", ((40, 40),))])
def test_requests_hold_one_placeholder_per_image_and_the_images_and_trajectories_the_tensors(
        fake_vllm, family, sizes):
    model, processor = tiny_vision_model_and_processor(family, seed=0)
    settings = vllm_image_settings(config(), processor, model.config)
    assert settings["max_images"] == 2 and settings["image_token_id"] in settings["banned_ids"]
    llm = ExpandingLLM(model, processor)
    engine = V.VLLMEngine("/m", [processor.tokenizer.eos_token_id], llm=llm, **settings)
    batch = chat_prompts(processor, sizes)
    trajs = engine.generate([ids for _, ids, _ in batch], PARAMS, seeds=[3, 4], vision=[v for *_, v in batch])
    assert len(llm.requests) == 4  # n = 2 requests per prompt
    for k, request in enumerate(llm.requests):
        text, ids, vision = batch[k // 2]
        # the template's text as tokenized before the processor expanded it: one placeholder per image
        assert request["prompt_token_ids"] == processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert request["multi_modal_data"]["image"] == list(vision.images) and len(vision.images) == len(sizes)
        assert llm.params[k]["logit_bias"] == {i: -100.0 for i in settings["banned_ids"]}
        again, tensors = llm.expanded[k]  # vLLM's expansion gives back the trainer's ids and tensors
        assert again == ids and all(torch.equal(tensors.tensors[key], vision.tensors[key]) for key in vision.tensors)
    for k, t in enumerate(trajs):
        assert t.prompt_ids.tolist() == batch[k // 2][1] and t.info["vision"] is batch[k // 2][2]
    with torch.no_grad():
        logp, _ = response_logprobs(model, collate(trajs, processor.tokenizer.pad_token_id))
    for i, t in enumerate(trajs):  # the trainer's forward over the trajectories' images: what was sampled with
        torch.testing.assert_close(logp[i, : t.response_length], t.logprobs, rtol=0, atol=2e-5)


def test_a_text_prompt_beside_image_prompts_goes_as_plain_ids(fake_vllm):
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    llm = ExpandingLLM(model, processor)
    engine = V.VLLMEngine("/m", [processor.tokenizer.eos_token_id], llm=llm,
                          **vllm_image_settings(config(), processor, model.config))
    (_, ids, vision), = chat_prompts(processor, colours=((1, 2, 3),))
    plain = processor.tokenizer("user: hi", add_special_tokens=False)["input_ids"]
    trajs = engine.generate([plain, ids], SamplingParams(max_new_tokens=3, n=1), seeds=[1, 2], vision=[None, vision])
    assert llm.requests[0] == {"prompt_token_ids": plain} and "vision" not in trajs[0].info
    assert trajs[1].info["vision"] is vision


def test_collapse_image_runs_by_hand():
    assert V.collapse_image_runs([1, 9, 9, 9, 2, 9, 3, 9, 9], 9) == [1, 9, 2, 9, 3, 9]
    assert V.collapse_image_runs([1, 2], 9) == [1, 2]
    assert V.llm_kwargs("/m", "auto", 0, 0.5, False, 1, None, max_images=3)["limit_mm_per_prompt"] == {"image": 3}
    assert "limit_mm_per_prompt" not in V.llm_kwargs("/m", "auto", 0, 0.5, False, 1, None)


def test_gemma3_whose_processor_wraps_the_image_tokens_is_refused():
    model, processor = tiny_vision_model_and_processor("gemma3", seed=0)
    with pytest.raises(ConfigError, match="--rollout.engine vllm does not send the images of"):
        vllm_image_settings(config(), processor, model.config)


def test_a_prompt_with_images_without_its_decoded_images_is_refused(fake_vllm):
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    (_, ids, vision), = chat_prompts(processor, colours=((1, 2, 3),))
    engine = V.VLLMEngine("/m", [2], llm=ExpandingLLM(model, processor), image_token_id=None)
    with pytest.raises(ConfigError, match="without the image token id or its decoded images"):
        engine.generate([ids], SamplingParams(max_new_tokens=2), seeds=[0], vision=[vision])
