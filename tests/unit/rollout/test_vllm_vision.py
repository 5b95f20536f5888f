"""VLLMEngine with a vision-language policy, on a fake `vllm.LLM` that does what vLLM does with a token
prompt and images (no vllm here): it expands the prompt's image placeholders as vLLM's multimodal processor
of the family does (Qwen2-VL, LLaVA: the HF processor's repetition of the image token; Gemma 3: vLLM's own
replacement of <start_of_image> and its newline merges, `vllm_expansion`), then samples from the tiny model
over those images. The engine sends each prompt's ids with one placeholder per image, the form the chat
template writes, and its decoded images, bans the placeholder tokens, and returns trajectories holding the
trainer's ids and image tensors: vLLM's expansion gives back the trainer's ids, and the trainer's forward
over them gives the logprobs the fake sampled with. Families whose image tokens are not mapped back
(InternVL, Gemma 3 with pan and scan or without newline tokens) are refused where the engine is built."""

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
from rlhfkit.rollout.vllm_images import (
    ImagePrompt,
    collapse_image_runs,
    vllm_prompt_ids,
)

PARAMS = SamplingParams(max_new_tokens=5, temperature=1.0, n=2)


def merge_pairs(ids: list[int], pair: tuple[int, int], into: int) -> list[int]:
    """Each non-overlapping occurrence of `pair`, left to right, replaced by `into` (vLLM's replace_token_matches)."""
    out, i = [], 0
    while i < len(ids):
        if tuple(ids[i:i + 2]) == pair:
            out.append(into)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def gemma3_expansion(tokenizer, full_image_sequence: str, ids: list[int], num_images: int) -> list[int]:
    """vLLM's Gemma 3 processor on a token prompt (vllm/model_executor/models/gemma3_mm.py: `_get_prompt_updates`,
    `_apply_token_matches`): each of the first `num_images` <start_of_image> tokens replaced by the tokens of the
    HF processor's `full_image_sequence`, then [\n, \n\n] and [\n\n, \n] merged into \n\n\n and [\n\n, \n\n]
    into \n\n\n\n, in that order, over the whole prompt."""
    boi = tokenizer.convert_tokens_to_ids("<start_of_image>")
    repl = tokenizer.encode(full_image_sequence, add_special_tokens=False)
    out = []
    for t in ids:
        out += repl if t == boi and num_images > 0 else [t]
        num_images -= t == boi
    vocab = tokenizer.get_vocab()
    n1, n2, n3, n4 = (vocab["\n" * k] for k in (1, 2, 3, 4))
    for pair, into in (((n1, n2), n3), ((n2, n1), n3), ((n2, n2), n4)):
        out = merge_pairs(out, pair, into)
    return out


def vllm_expansion(processor, model_type: str, request: dict):
    """(ids, VisionInputs) vLLM makes of a request: the image tensors are the HF processor's on the images;
    the ids are the HF processor's expansion of the decoded prompt (Qwen2-VL, LLaVA: vLLM repeats the image
    token to the image's feature count, as it does), or for Gemma 3 `gemma3_expansion`."""
    ids, images = request["prompt_token_ids"], request.get("multi_modal_data", {}).get("image", [])
    expanded, vision = encode(processor, processor.tokenizer.decode(ids), images)
    if model_type == "gemma3" and images:
        expanded = gemma3_expansion(processor.tokenizer, processor.full_image_sequence, ids, len(images))
    return expanded, vision


class ExpandingLLM:
    """A fake `vllm.LLM`: each request's token prompt is expanded as vLLM would (`vllm_expansion`), then one
    sample is drawn by the HF vision engine with the request's seed. Records what it was sent and what it
    expanded."""

    def __init__(self, model, processor):
        self.engine, self.processor, self.model_type = VisionEngine(model, processor.tokenizer), processor, \
            model.config.model_type
        self.requests, self.params, self.expanded = [], [], []

    def generate(self, requests, sampling_params, use_tqdm):
        outs = []
        for request, sp in zip(requests, sampling_params):
            self.requests.append(request)
            self.params.append(sp)
            ids, vision = vllm_expansion(self.processor, self.model_type, request)
            self.expanded.append((ids, vision))
            [t] = self.engine.generate([ids], SamplingParams(max_new_tokens=sp["max_tokens"], temperature=1.0),
                                       seeds=[sp["seed"]], vision=[vision])
            tokens = t.response_ids.tolist()
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(
                token_ids=tokens, logprobs=[{tok: float(lp)} for tok, lp in zip(tokens, t.logprobs)],
                finish_reason="length")]))
        return outs


def model_and_processor(family: str):
    """The tiny model of `family`; Gemma 3's tokenizer given single tokens of two to four newlines, as Gemma 3's
    own has and vLLM's Gemma 3 processor reads (the tiny one's newlines are one token each)."""
    model, processor = tiny_vision_model_and_processor(family, seed=0)
    if family == "gemma3":
        processor.tokenizer.add_tokens(["\n\n", "\n\n\n", "\n\n\n\n"])
        model.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
    return model, processor


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))


def chat_prompts(processor, images_per_prompt=((40, 40),), colours=((230, 30, 30), (30, 30, 230)), before="",
                 after="colour?"):
    """[(template text, expanded ids, VisionInputs)] of one prompt per colour: `before`, the images, `after`."""
    out = []
    for colour in colours:
        content = ([{"type": "text", "text": before}] if before else []) + [{"type": "image"} for _ in
                                                                               images_per_prompt]
        text = processor.apply_chat_template([{"role": "user", "content": content + [{"type": "text", "text": after}]}],
                                             tokenize=False, add_generation_prompt=True)
        images = [Image.new("RGB", size, colour) for size in images_per_prompt]
        out.append((text, *encode(processor, text, images)))
    return out


def config(*flags):
    return RLConfig.from_args(["--actor.model_name_or_path", "x", "--data.max_images_per_prompt", "2", *flags])


# Gemma 3's images beside newlines of the prompt's own text: the HF processor's "\n\n" around each image are
# tokenized together with them (\n + \n\n -> one token of three), and two images side by side share one of four
CASES = [("qwen2_vl", ((40, 40),), ""), ("qwen2_vl", ((56, 28), (28, 56)), ""), ("llava", ((40, 40),), ""),
         ("gemma3", ((40, 40),), ""), ("gemma3", ((40, 40), (30, 50)), "look\n")]


@pytest.mark.parametrize("family,sizes,before", CASES,
                         ids=["qwen2_vl", "qwen2_vl-2images", "llava", "gemma3", "gemma3-2images-newlines"])
def test_requests_hold_one_placeholder_per_image_and_the_images_and_trajectories_the_tensors(
        fake_vllm, family, sizes, before):
    model, processor = model_and_processor(family)
    settings = vllm_image_settings(config(), processor, model.config)
    assert settings["max_images"] == 2 and settings["image_prompt"].image_token_id in settings["banned_ids"]
    llm = ExpandingLLM(model, processor)
    engine = V.VLLMEngine("/m", [processor.tokenizer.eos_token_id], llm=llm, **settings)
    batch = chat_prompts(processor, sizes, before=before, after="\ncolour?" if before else "colour?")
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
    assert collapse_image_runs([1, 9, 9, 9, 2, 9, 3, 9, 9], 9) == [1, 9, 2, 9, 3, 9]
    assert collapse_image_runs([1, 2], 9) == [1, 2]
    assert vllm_prompt_ids([1, 9, 9, 2, 9, 3], ImagePrompt(9)) == ([1, 9, 2, 9, 3], 2)
    assert V.llm_kwargs("/m", "auto", 0, 0.5, False, 1, None, max_images=3)["limit_mm_per_prompt"] == {"image": 3}
    assert "limit_mm_per_prompt" not in V.llm_kwargs("/m", "auto", 0, 0.5, False, 1, None)


def test_gemma3_spans_become_start_of_image_with_their_newlines_taken_off_by_hand():
    # boi 5, soft 6, eoi 7; tokens of 1, 2, 3, 4 newlines: 10, 11, 12, 13
    gemma = ImagePrompt(6, boi_id=5, eoi_id=7, newline_ids=(10, 11, 12, 13))
    # "a\n" + image + image + "\nb": \n\n\n | boi soft soft eoi | \n\n\n\n | boi soft eoi | \n\n\n
    assert vllm_prompt_ids([1, 12, 5, 6, 6, 7, 13, 5, 6, 7, 12, 2], gemma) == ([1, 10, 5, 5, 10, 2], 2)
    # "a" + image + "b": \n\n on both sides, nothing left of them
    assert vllm_prompt_ids([1, 11, 5, 6, 7, 11, 2], gemma) == ([1, 5, 2], 1)
    assert vllm_prompt_ids([1, 5, 2], gemma) == ([1, 5, 2], 1)  # a lone <start_of_image>: vLLM takes it for an image
    # "a\n\n\n" + image: five newlines, split by the tokenizer as 4 + 1, go back as three: one token
    assert vllm_prompt_ids([1, 13, 10, 5, 6, 7, 11, 2], gemma) == ([1, 12, 5, 2], 1)
    longer = ImagePrompt(6, boi_id=5, eoi_id=7, newline_ids=(10, 11, 12, 13, 14, 15))  # tokens of 1 to 6
    assert vllm_prompt_ids([1, 14, 5, 6, 7, 11, 2], longer) == ([1, 12, 5, 2], 1)  # one token of 5 -> of 3
    assert vllm_prompt_ids([1, 15, 15, 5, 6, 7, 11, 2], longer) == ([1, 15, 13, 5, 2], 1)  # 12 -> 10: 6 + 4
    for ids in ([1, 10, 5, 6, 7, 11, 2], [11, 5, 6, 7, 2], [5, 6, 7, 11]):  # not the processor's newlines
        with pytest.raises(ConfigError, match="not expanded by its processor"):
            vllm_prompt_ids(ids, gemma)


@pytest.mark.parametrize("family", ["internvl", "gemma3", "mistral3"])
def test_families_whose_image_tokens_are_not_mapped_back_are_refused(family):
    """InternVL's tiles; the tiny Gemma 3, whose newlines are one token each (vLLM's Gemma 3 processor reads
    the tokens of two to four newlines); Mistral 3's rows of image tokens between [IMG_BREAK] tokens."""
    model, processor = tiny_vision_model_and_processor(family, seed=0)
    with pytest.raises(ConfigError, match="--rollout.engine vllm does not send the images of"):
        vllm_image_settings(config(), processor, model.config)


def test_gemma3_with_pan_and_scan_is_refused():
    model, processor = model_and_processor("gemma3")
    vllm_image_settings(config(), processor, model.config)
    processor.image_processor.do_pan_and_scan = True  # crops: more spans and text per image
    with pytest.raises(ConfigError, match="--rollout.engine vllm does not send the images of"):
        vllm_image_settings(config(), processor, model.config)


def test_a_prompt_with_images_without_its_decoded_images_or_a_placeholder_each_is_refused(fake_vllm):
    model, processor = tiny_vision_model_and_processor("llava", seed=0)
    settings = vllm_image_settings(config(), processor, model.config)
    (_, ids, vision), = chat_prompts(processor, colours=((1, 2, 3),))
    engine = V.VLLMEngine("/m", [2], llm=ExpandingLLM(model, processor), image_prompt=None)
    with pytest.raises(ConfigError, match="without the image settings or its decoded images"):
        engine.generate([ids], SamplingParams(max_new_tokens=2), seeds=[0], vision=[vision])
    (_, ids, vision), = chat_prompts(processor, ((40, 40), (40, 40)), colours=((1, 2, 3),))
    engine = V.VLLMEngine("/m", [2], llm=ExpandingLLM(model, processor), **settings)
    with pytest.raises(ConfigError, match="holds 1 image placeholder"):  # LLaVA's two runs side by side make one
        engine.generate([ids], SamplingParams(max_new_tokens=2), seeds=[0], vision=[vision])


def test_three_newlines_beside_a_gemma3_image_reach_vllm_split_otherwise_than_the_trainers_ids():
    """vLLM's limit, said in docs/vision.md: its Gemma 3 processor merges newline tokens up to four, so five
    newlines in a row (three of the prompt's, two of the image's) come out as 3 + 2 where the tokenizer wrote
    4 + 1. The request is still the template's text as tokenized; the text vLLM sees is the same."""
    model, processor = model_and_processor("gemma3")
    prompt = vllm_image_settings(config(), processor, model.config)["image_prompt"]
    (text, ids, vision), = chat_prompts(processor, colours=((1, 2, 3),), before="look\n\n\n")
    sent, found = vllm_prompt_ids(ids, prompt)
    assert found == 1 and sent == processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    expanded = gemma3_expansion(processor.tokenizer, processor.full_image_sequence, sent, 1)
    assert expanded != ids and processor.tokenizer.decode(expanded) == processor.tokenizer.decode(ids)
