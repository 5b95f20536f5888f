"""`rlhfkit serve` of a vision-language model (a tiny random Qwen2-VL, sharpened), called with the `openai`
SDK: a chat request with an image_url part (a data: URL) gets the HF engine's greedy reply for that
image, token for token with its logprobs, streamed or not; another image gives other logprobs; http(s)
URLs and more images than --max_images are refused (400)."""

import base64
import io

import pytest
import torch
from PIL import Image

openai = pytest.importorskip("openai")

from rlhfkit.cli.serve_model import build_server  # noqa: E402
from rlhfkit.config.parse import parse_config  # noqa: E402
from rlhfkit.config.serve_model import ServeModelConfig, validate_serve_model  # noqa: E402
from rlhfkit.data.images import encode  # noqa: E402
from rlhfkit.models.loading import load_policy  # noqa: E402
from rlhfkit.rollout.base import SamplingParams  # noqa: E402
from rlhfkit.rollout.vision import VisionEngine  # noqa: E402

RED, BLUE = (220, 40, 40), (40, 60, 220)
QUESTION = "Which colour is this?"


def png(colour, size=56) -> Image.Image:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def data_url(colour, size=56) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def ask(*colours) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(c)}} for c in colours]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, sharp_vlm):
    folder = tmp_path_factory.mktemp("serve") / "vlm"
    model, processor = sharp_vlm()
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    cfg = parse_config(ServeModelConfig, ["--model", str(folder), "--port", "0", "--max_tokens", "6",
                                          "--max_images", "2"])
    validate_serve_model(cfg)
    policy, tokenizer = load_policy(cfg.model, cfg.dtype)
    with build_server(cfg, policy, tokenizer, "sk-test") as server:
        yield server, openai.OpenAI(base_url=f"{server.base}/v1", api_key="sk-test", max_retries=0), policy, processor


def greedy(policy, processor, *colours):
    """The HF engine's greedy reply (token ids, logprobs) to the question about these images."""
    parts = [*({"type": "image"} for _ in colours), {"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": parts}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, vision = encode(processor, text, [png(c) for c in colours])
    [t] = VisionEngine(policy, processor.tokenizer).generate([ids], SamplingParams(max_new_tokens=6, temperature=0.0),
                                                            vision=[vision])
    return ids, t.response_ids.tolist(), t.logprobs


@pytest.mark.parametrize("colours", [(RED,), (BLUE, RED)])
def test_the_reply_is_the_hf_engines_greedy_reply_for_the_same_images(served, colours):
    server, client, policy, processor = served
    reply = client.chat.completions.create(model="m", messages=ask(*colours), temperature=0, logprobs=True)
    prompt_ids, tokens, logprobs = greedy(policy, processor, *colours)
    choice = reply.choices[0]
    assert choice.model_extra["token_ids"] == tokens and reply.model_extra["prompt_token_ids"] == prompt_ids
    assert choice.message.content == processor.tokenizer.decode(tokens, skip_special_tokens=True)
    served_lps = torch.tensor([c.logprob for c in choice.logprobs.content])
    torch.testing.assert_close(served_lps, logprobs, rtol=0, atol=2e-5)
    stream = client.chat.completions.create(model="m", messages=ask(*colours), temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == choice.message.content


def test_another_image_gives_other_logprobs(served):
    _, client, _, _ = served
    red, blue = (client.chat.completions.create(model="m", messages=ask(c), temperature=0, logprobs=True)
                 for c in (RED, BLUE))
    first_red, first_blue = red.choices[0].logprobs.content[0], blue.choices[0].logprobs.content[0]
    assert first_red.token == first_blue.token and abs(first_red.logprob - first_blue.logprob) > 1e-3


@pytest.mark.parametrize("content, needle", [
    ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
     "fetches no images from the network"),
    ([{"type": "image_url", "image_url": {"url": data_url(c)}} for c in (RED, BLUE, (0, 0, 0))],
     "the request would send 3 distinct images, more than --max_images 2"),
])
def test_http_urls_and_too_many_images_are_refused(served, content, needle):
    _, client, _, _ = served
    with pytest.raises(openai.BadRequestError, match=needle):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])
