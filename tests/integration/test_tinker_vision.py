"""Images through the official `tinker` SDK on a vision-language base model (a tiny random
Qwen2-VL): ImageChunks in forward_backward, forward and sample give rlhfkit's own SFT loss and
trainer forward over the same tokens and image; several LoRA clients of the VLM batch as text
clients do. Skipped when the SDK is not installed."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
pytest.importorskip("uvicorn")

from PIL import Image

from rlhfkit.core.losses import sft_loss
from rlhfkit.data.batch import collate
from rlhfkit.data.supervised_images import VisionTextFormat
from rlhfkit.models import response_logprobs
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.serving.tinker.host import ModelHost
from tests.integration.test_tinker_sdk import KEY, held_queue, served

NAME = "tiny-qwen2-vl"
T = tinker.types


def png(color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> bytes:
    """A PNG of two halves: `color` on the left, its inverse on the right (56 x 56: 4 image tokens)."""
    image = Image.new("RGB", size, color)
    image.paste(Image.new("RGB", (size[0] // 2, size[1]), tuple(255 - c for c in color)), (size[0] // 2, 0))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def expected_tokens(processor, data: bytes) -> int:
    """The image's token count as tinker-cookbook's `image_to_chunk` counts it on the client."""
    w, h = Image.open(io.BytesIO(data)).size
    ip = processor.image_processor
    return ip.get_number_of_image_patches(h, w, images_kwargs={}) // ip.merge_size ** 2


@pytest.fixture(scope="module")
def vlm():
    return tiny_vision_model_and_processor("qwen2_vl", seed=0)


@pytest.fixture
def server(tmp_path, monkeypatch):
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)  # the server's own copy
    host = ModelHost(model, processor.tokenizer, NAME, tmp_path / "ckpt", torch.device("cpu"), processor=processor)
    yield from served(tmp_path, monkeypatch, host=host)


def chunks(ids: list[int], image: bytes, processor, image_token: int) -> list:
    """`ids` (the processor's expansion of a conversation with one image) as Tinker chunks: the run of
    image tokens replaced by one ImageChunk of `image`, as tinker-cookbook's Qwen-VL renderer builds it."""
    a = ids.index(image_token)
    b = a + ids[a:].count(image_token)
    assert ids[a:b] == [image_token] * (b - a)
    return [T.EncodedTextChunk(tokens=ids[:a]),
            T.ImageChunk(data=image, format="png", expected_tokens=expected_tokens(processor, image)),
            T.EncodedTextChunk(tokens=ids[b:])]


def sft_sample(processor, image: bytes, answer: str = "red"):
    """rlhfkit's SFT sample (prompt ids with the image's tokens, response ids, loss mask, pixel tensors)."""
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    return VisionTextFormat(processor).encode(prompt, answer, "test", False, {"images": [image]})


def sft_datum(sample, image: bytes, processor, image_token: int):
    full = sample.prompt_ids.tolist() + sample.response_ids.tolist()
    weights = [0.0] * len(sample.prompt_ids) + sample.loss_mask.float().tolist()
    return T.Datum(model_input=T.ModelInput(chunks=chunks(full[:-1], image, processor, image_token)),
                   loss_fn_inputs={"target_tokens": np.asarray(full[1:], dtype=np.int64),
                                   "weights": np.asarray(weights[1:], dtype=np.float32)})


def test_cross_entropy_with_an_image_equals_rlhfkits_sft_loss(server, vlm):
    model, processor = vlm
    image = png((220, 40, 40))
    sample = sft_sample(processor, image)
    tc = server.client().create_lora_training_client(base_model=NAME, rank=4, seed=1).result()
    datum = sft_datum(sample, image, processor, model.config.image_token_id)
    assert datum.model_input.length == len(sample.prompt_ids) + len(sample.response_ids) - 1
    out = tc.forward_backward([datum], "cross_entropy").result()
    # in-process: rlhfkit's SFT loss summed over the response (a fresh LoRA adapter adds zero)
    batch = collate([sample], processor.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
    want, _ = sft_loss(logp, batch.loss_mask, "token_mean", num_tokens=1.0)
    assert out.metrics["loss:sum"] == pytest.approx(float(want), rel=1e-5)
    served = out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(sample.prompt_ids) - 1:]
    np.testing.assert_allclose(served, logp[0].numpy(), atol=2e-5)
    # the image matters: another image, same size, gives another loss; the step trains through it
    other = sft_datum(sft_sample(processor, png((30, 200, 60))), png((30, 200, 60)), processor,
                      model.config.image_token_id)
    assert tc.forward([other], "cross_entropy").result().metrics["loss:sum"] != pytest.approx(
        out.metrics["loss:sum"], rel=1e-4)
    tc.optim_step(T.AdamParams(learning_rate=1e-2)).result()
    assert tc.forward([datum], "cross_entropy").result().metrics["loss:sum"] < out.metrics["loss:sum"]


def prompt_input(processor, image_token: int, image: bytes) -> T.ModelInput:
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    text = processor.apply_chat_template(prompt, add_generation_prompt=True)
    from rlhfkit.data.images import encode

    ids, _ = encode(processor, text, [Image.open(io.BytesIO(image)).convert("RGB")])
    return T.ModelInput(chunks=chunks(ids, image, processor, image_token))


def test_sampled_logprobs_equal_the_trainer_forward_with_the_image(server, vlm):
    model, processor = vlm
    image_token = model.config.image_token_id
    tc = server.client().create_lora_training_client(base_model=NAME, rank=4, seed=2).result()
    sc = tc.save_weights_and_get_sampling_client().result()
    params = T.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    answers = {}
    for color in ((220, 40, 40), (30, 200, 60)):
        image = png(color)
        prompt = prompt_input(processor, image_token, image)
        out = sc.sample(prompt, num_samples=2, sampling_params=params, include_prompt_logprobs=True,
                        topk_sample_logprobs=2).result()
        answers[color] = out
        for seq in out.sequences:
            assert image_token not in seq.tokens  # the placeholder is never sampled
            tokens = prompt.chunks + [T.EncodedTextChunk(tokens=list(seq.tokens[:-1]))]
            n_prompt = prompt.length
            targets = [0] * (n_prompt - 1) + list(seq.tokens)
            datum = T.Datum(model_input=T.ModelInput(chunks=tokens),
                            loss_fn_inputs={"target_tokens": np.asarray(targets, dtype=np.int64),
                                            "weights": np.zeros(len(targets), dtype=np.float32)})
            lp = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
            np.testing.assert_allclose(lp[n_prompt - 1:], seq.logprobs, atol=2e-5)
            assert [row[0][1] >= row[-1][1] for row in seq.topk_logprobs] == [True] * len(seq.tokens)
        assert len(out.prompt_logprobs) == prompt.length and out.prompt_logprobs[0] is None
    red, green = answers.values()
    assert not np.allclose(red.prompt_logprobs[-1], green.prompt_logprobs[-1], atol=1e-5)  # the image changes them


def test_two_lora_clients_of_the_vlm_batch_with_their_own_results(server, vlm):
    """LoRA adapters on the VLM's language model (models.lora_rows per row): two clients' forward_backward
    with images waiting together run in one call with the results each gets alone; so do their samples."""
    model, processor = vlm
    image_token = model.config.image_token_id
    svc = server.client()
    clients = [svc.create_lora_training_client(base_model=NAME, rank=r, seed=s).result() for r, s in ((4, 1), (8, 2))]
    data = [sft_datum(sft_sample(processor, png(c), a), png(c), processor, image_token)
            for c, a in (((220, 40, 40), "red"), ((30, 200, 60), "green"))]
    clients[0].forward_backward(data, "cross_entropy").result()
    clients[0].optim_step(T.AdamParams(learning_rate=5e-2)).result()  # the two adapters differ
    for tc in clients:
        tc.forward_backward(data, "cross_entropy").result()  # clear: each call accumulates
        tc.optim_step(T.AdamParams(learning_rate=0.0)).result()
    calls = server.app.state.queue.calls
    release = held_queue(server)
    futures = [tc.forward(data[k:] + data[:k], "cross_entropy") for k, tc in enumerate(clients)]
    release(2)
    together = [f.result() for f in futures]
    assert calls["fwdbwd"][-1] == 2, calls
    for k, tc in enumerate(clients):
        alone = tc.forward(data[k:] + data[:k], "cross_entropy").result()
        assert together[k].metrics["loss:sum"] == pytest.approx(alone.metrics["loss:sum"], rel=1e-5)
    assert together[0].metrics["loss:sum"] != pytest.approx(together[1].metrics["loss:sum"], rel=1e-3)
    samplers = [tc.save_weights_and_get_sampling_client().result() for tc in clients]
    prompt = prompt_input(processor, image_token, png((220, 40, 40)))
    params = T.SamplingParams(max_tokens=5, temperature=1.0, seed=7)
    release = held_queue(server)
    futures = [sc.sample(prompt, num_samples=2, sampling_params=params) for sc in samplers]
    release(2)
    got = [f.result() for f in futures]
    assert calls["sample"][-1] == 2, calls
    for sc, g in zip(samplers, got):
        alone = sc.sample(prompt, num_samples=2, sampling_params=params).result()
        assert [s.tokens for s in g.sequences] == [s.tokens for s in alone.sequences]
        for a, b in zip(alone.sequences, g.sequences):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_bad_images_are_refused_in_one_line(server, vlm):
    import httpx

    model, processor = vlm
    image_token = model.config.image_token_id
    tc = server.client().create_lora_training_client(base_model=NAME, rank=4).result()
    image = png((220, 40, 40))
    good = sft_datum(sft_sample(processor, image), image, processor, image_token)
    wrong = good.model_input.chunks[1].model_copy(update={"expected_tokens": 9})
    lying = T.Datum(model_input=T.ModelInput(chunks=[good.model_input.chunks[0], wrong,
                                                     T.EncodedTextChunk(tokens=[5] * 6)]),
                    loss_fn_inputs={"target_tokens": np.zeros(good.model_input.chunks[0].length + 15, np.int64),
                                    "weights": np.zeros(good.model_input.chunks[0].length + 15, np.float32)})
    with pytest.raises(Exception, match="expected_tokens 9, but the model's processor makes 4 tokens of this 56x56"):
        tc.forward_backward([lying], "cross_entropy").result()
    raw = T.Datum(model_input=T.ModelInput.from_ints([5, image_token, 6]),
                  loss_fn_inputs={"target_tokens": np.asarray([6, 6, 7]), "weights": np.ones(3, np.float32)})
    with pytest.raises(Exception, match="is the model's image placeholder; send the image"):
        tc.forward([raw], "cross_entropy").result()
    broken = T.ModelInput(chunks=[T.EncodedTextChunk(tokens=[5]), T.ImageChunk(data=image[:40], format="png",
                                                                                 expected_tokens=4)])
    sc = server.client().create_sampling_client(base_model=NAME).result()
    with pytest.raises(Exception, match="cannot be decoded"):
        sc.sample(broken, num_samples=1, sampling_params=T.SamplingParams(max_tokens=2)).result()
    r = httpx.post(f"{server.url}/api/v1/asample", headers={"X-API-Key": KEY}, json={
        "sampling_session_id": "x", "num_samples": 1, "sampling_params": {},
        "prompt": {"chunks": [{"type": "image_asset_pointer", "format": "png", "location": "/etc/passwd"}]}})
    assert r.status_code == 422 and "image_asset_pointer" in r.json()["detail"]
    assert tc.forward([good], "cross_entropy").result().metrics["loss:sum"] > 0  # the client still works
