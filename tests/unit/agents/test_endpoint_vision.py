"""The OpenAI-compatible endpoint with a vision-language policy (the tiny random Qwen2-VL), driven by
the official `openai` SDK: image_url parts with data: URLs reach the engine and are recorded with
each call; an agent that sends an image in each of two calls gives one trajectory with both images,
whose recorded logprobs equal the trainer's forward over them (LLaVA and Gemma 3 too); a rewritten history splits into
segments with their own images; requests with `tools` are rendered with the schemas and their tool calls parsed;
http URLs, bad data, too many images are refused (400) and counted."""

import asyncio
import base64
import io
import json

import pytest
import torch
from PIL import Image

openai = pytest.importorskip("openai")

from rlhfkit.agents.endpoint import (
    EndpointExecutor,
    EndpointLimits,
    EndpointServer,
    Settings,
)
from rlhfkit.agents.executor import TokenBudget
from rlhfkit.data.batch import collate
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine
from tests.unit.agents.conftest import FirstTurnCalls

PARAMS = SamplingParams(max_new_tokens=5, temperature=1.0)
RED, BLUE = (230, 30, 30), (30, 30, 230)


def data_url(colour, size: int, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


@pytest.fixture(scope="module")
def vlm():
    torch.set_num_threads(1)
    model, proc = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    return model, proc, VisionEngine(model, proc.tokenizer)


class P:
    def __init__(self, text, label=None):
        self.text, self.raw, self.label, self.record = text, text, label, {}


def two_images(second=BLUE):
    """An agent that shows a 56x56 red image, then (its history kept) a 28x28 image of `second`."""

    async def agent(client, prompt, label, **row):
        msgs = [{"role": "user", "content": [image(data_url(RED, 56)), text(prompt)]}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": [text("and "), image(data_url(second, 28, "JPEG"))]}]
        await client.chat.completions.create(model="policy", messages=msgs)
        return 1.0

    return agent


def run(vlm, agent, max_images=3, prompts=("colour?",), n=1, budget=TokenBudget(5, 60, 2)):
    _, proc, engine = vlm
    executor = EndpointExecutor(agent)
    executor.processor, executor.max_images = proc, max_images
    trajs = executor.run(engine, proc.tokenizer, [P(p) for p in prompts], SamplingParams(max_new_tokens=5,
                         temperature=1.0, n=n), budget, seeds=[7] * len(prompts))
    return trajs, executor.pop_metrics()


def forward(vlm, trajs):
    model, proc, _ = vlm
    logp, _ = response_logprobs(model, collate(trajs, proc.tokenizer.pad_token_id), temperature=1.0)
    return logp


def test_two_calls_with_an_image_each_are_one_trajectory_whose_logprobs_are_the_trainers(vlm):
    model, proc, _ = vlm
    trajs, metrics = run(vlm, two_images(), prompts=("colour?", "which?"), n=2)
    assert len(trajs) == 4 and metrics["endpoint/splits"] == 0 and metrics["endpoint/calls"] == 8
    pad = model.config.image_token_id
    for t in trajs:
        vision = t.info["vision"]
        assert vision.num_images == 2 and vision.tensors["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 2]]
        assert (t.prompt_ids == pad).sum() == 4  # 56x56: 16 patches merged 2x2
        assert (t.response_ids[~t.loss_mask] == pad).sum() == 1  # the second image, in the masked gap
        assert not (t.response_ids[t.loss_mask] == pad).any() and t.loss_mask[-1]
    logp = forward(vlm, trajs)
    rollout = torch.zeros_like(logp)
    for i, t in enumerate(trajs):
        rollout[i, : t.response_length] = t.logprobs
    mask = collate(trajs, proc.tokenizer.pad_token_id).loss_mask
    torch.testing.assert_close(logp[mask], rollout[mask], rtol=0, atol=2e-5)
    # switch-off: the same trajectories without their images give other logprobs
    bare = [type(t)(**{**t.__dict__, "info": {k: v for k, v in t.info.items() if k != "vision"}}) for t in trajs]
    assert (forward(vlm, bare)[mask] - rollout[mask]).abs().max() > 1e-3


def test_n_samples_of_an_image_call_share_its_images_and_the_chosen_one_goes_on(vlm):
    """n=2 on the first call: two segments with the first image; the second call continues choice 1,
    whose segment then holds both images."""

    async def agent(client, prompt, label, **row):
        msgs = [{"role": "user", "content": [image(data_url(RED, 56)), text(prompt)]}]
        r = await client.chat.completions.create(model="policy", messages=msgs, n=2)
        msgs += [{"role": "assistant", "content": r.choices[1].message.content},
                 {"role": "user", "content": [image(data_url(BLUE, 28))]}]
        await client.chat.completions.create(model="policy", messages=msgs)
        return 1.0

    trajs, metrics = run(vlm, agent)
    assert len(trajs) == 2 and metrics["endpoint/splits"] == 1
    assert [t.info["vision"].num_images for t in trajs] == [1, 2] and trajs[0].loss_mask.all()
    assert torch.equal(trajs[0].prompt_ids, trajs[1].prompt_ids)
    logp = forward(vlm, trajs)
    for i, t in enumerate(trajs):
        torch.testing.assert_close(logp[i, : t.response_length][t.loss_mask], t.logprobs[t.loss_mask], rtol=0,
                                   atol=2e-5)


@pytest.mark.parametrize("family", ["llava", "gemma3", "llava_next", "llava_onevision", "glm4v", "aya_vision",
                                    "mistral3"])
def test_other_families_record_the_trainers_logprobs_over_both_images(family):
    """LLaVA (a fixed number of tokens per image), Gemma 3 (image tokens attend both ways), LLaVA-NeXT and
    LLaVA-OneVision (anyres tiles, `image_sizes`), GLM-4.1V (3-D positions), Aya Vision (tiles), Mistral 3 (images of
    two sizes padded into one pixel tensor, rows of tokens closed by [IMG_BREAK])."""
    model, proc = tiny_vision_model_and_processor(family, seed=0)
    family_vlm = (model, proc, VisionEngine(model, proc.tokenizer))
    [t], _ = run(family_vlm, two_images())
    assert t.info["vision"].num_images == 2 and not t.loss_mask.all() and t.loss_mask[-1]
    logp = forward(family_vlm, [t])[0, : t.response_length]
    torch.testing.assert_close(logp[t.loss_mask], t.logprobs[t.loss_mask], rtol=0, atol=2e-5)


def test_the_second_image_reaches_the_engine(vlm):
    """Same seeds, the second image blue or red: the first call samples the same, the second does not."""
    [blue], _ = run(vlm, two_images(BLUE))
    [red], _ = run(vlm, two_images(RED))
    first = int((~blue.loss_mask).nonzero()[0])
    assert torch.equal(blue.response_ids[:first], red.response_ids[:first])
    assert torch.equal(blue.logprobs[:first], red.logprobs[:first])
    end = int((~blue.loss_mask).nonzero()[-1]) + 1
    assert torch.equal(blue.response_ids[:end], red.response_ids[:end])  # the same tokens, other image tensors
    assert not torch.equal(blue.info["vision"].tensors["pixel_values"], red.info["vision"].tensors["pixel_values"])
    assert (blue.logprobs[end:] - red.logprobs[end:]).abs().max() > 1e-4


def test_a_call_with_other_images_so_far_starts_a_segment_with_its_own_images(vlm):
    """The second call sends the first's conversation with its image swapped: its token ids extend
    the first call's (Qwen2-VL's image tokens are one id whatever the image), its images do not,
    so it starts a segment of its own, with its own image."""

    async def agent(client, prompt, label, **row):
        msgs = [{"role": "user", "content": [image(data_url(RED, 56)), text(prompt)]}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs[0]["content"][0] = image(data_url(BLUE, 56))
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "more"}]
        await client.chat.completions.create(model="policy", messages=msgs)
        return 0.5

    trajs, metrics = run(vlm, agent)
    assert len(trajs) == 2 and metrics["endpoint/splits"] == 1
    red, blue = trajs
    red_ids = torch.cat([red.prompt_ids, red.response_ids])
    assert torch.equal(blue.prompt_ids[: len(red_ids)], red_ids)  # the ids alone would extend the red segment
    assert red.loss_mask.all() and blue.loss_mask.all()  # each trains what its call sampled
    assert red.info["vision"].num_images == blue.info["vision"].num_images == 1
    assert not torch.equal(red.info["vision"].tensors["pixel_values"], blue.info["vision"].tensors["pixel_values"])
    logp = forward(vlm, trajs)
    for i, t in enumerate(trajs):
        torch.testing.assert_close(logp[i, : t.response_length][t.loss_mask], t.logprobs[t.loss_mask], rtol=0,
                                   atol=2e-5)


def status_of(coro) -> tuple[int | None, str]:
    async def go():
        try:
            await coro
        except openai.APIStatusError as exc:
            return exc.status_code, str(exc)
        return None, ""

    return asyncio.run(go())


@pytest.mark.parametrize("content, needle, counter", [
    ([image("http://example.com/cat.png"), text("hi")], "fetches no images from the network", "refused_image_url"),
    ([image("https://example.com/cat.png")], "fetches no images from the network", "refused_image_url"),
    ([image("data:image/png;base64,!!!")], "not valid base64", "refused_image"),
    ([image("data:image/png;base64," + base64.b64encode(b"not a png").decode())], "cannot be decoded",
     "refused_image"),
    ([image("file:///etc/passwd")], "give a data:image/<format>;base64", "refused_image"),
    ([image(data_url(RED, 28)), image(data_url(BLUE, 28)), image(data_url((0, 0, 0), 28))],
     "3 distinct images, more than --data.max_images_per_prompt 2", "refused_images"),
    ([text("see <|image_pad|>")], "text holds the model's image token", "bad_request"),
    ([{"type": "input_audio", "input_audio": {}}], "give text or image_url parts", "bad_request"),
])
def test_bad_image_parts_are_refused_with_400_and_counted(vlm, content, needle, counter):
    _, proc, engine = vlm
    with EndpointServer(proc.tokenizer, Settings(PARAMS, processor=proc, max_images=2)) as server:
        server.engine = engine
        e = server.open_episode(0, seed=1, limits=EndpointLimits())
        client = openai.AsyncOpenAI(base_url=server.url(e), api_key=e.key, max_retries=0)
        status, message = status_of(client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": content}]))
        metrics = server.registry.pop_metrics()
        assert status == 400 and needle in message, message
        assert metrics[f"endpoint/{counter}"] == 1.0 and not e.calls


def test_an_image_to_a_text_policy_and_images_in_a_tool_message_are_refused(vlm):
    _, proc, engine = vlm
    ask = [{"role": "user", "content": [image(data_url(RED, 28))]}]
    to_tool = [{"role": "user", "content": "add"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [image(data_url(RED, 28))]}]
    for settings, messages, needle in ((Settings(PARAMS), ask, "image_url parts need a vision-language one"),
                                       (Settings(PARAMS, processor=proc), to_tool, "a tool message holds images")):
        with EndpointServer(proc.tokenizer, settings) as server:
            server.engine = engine
            e = server.open_episode(0, seed=1, limits=EndpointLimits())
            client = openai.AsyncOpenAI(base_url=server.url(e), api_key=e.key, max_retries=0)
            status, message = status_of(client.chat.completions.create(model="policy", messages=messages,
                                                                       tools=TOOLS))
            assert status == 400 and needle in message, message


TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def tool_agent(seen: list):
    """Shows an image with the `add` tool, answers the call it gets with the tool's result, asks again."""

    async def agent(client, prompt, label, **row):
        msgs = [{"role": "user", "content": [image(data_url(RED, 56)), text(prompt)]}]
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        seen.append((r.choices[0].finish_reason, [(c.function.name, json.loads(c.function.arguments))
                                                  for c in m.tool_calls or ()]))
        msgs += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "5"}]
        await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        return 1.0

    return agent


def test_tools_in_requests_with_images_are_rendered_parsed_and_recorded_as_the_trainer_computes(json_vlm):
    """The first call writes a tool call (teacher-forced with the model's own logprobs over the image):
    the reply carries it parsed; the tool result and the second call make one trajectory whose prompt
    holds the tool schemas and the processor's image tokens, whose logprobs are the trainer's forward."""
    model, proc = json_vlm("qwen2_vl")
    tok = proc.tokenizer
    engine = FirstTurnCalls(VisionEngine(model, tok), tok(CALL, add_special_tokens=False)["input_ids"] +
                            [tok.eos_token_id], tok.pad_token_id)
    seen: list = []
    [t], metrics = run((model, proc, engine), tool_agent(seen), budget=TokenBudget(5, 80, 2))
    assert seen == [("tool_calls", [("add", {"a": 2, "b": 3})])]
    assert metrics["endpoint/calls"] == 2 and metrics.get("endpoint/splits", 0.0) == 0.0
    assert engine.calls[1] is not None and t.info["vision"].num_images == 1  # the second call had the image too
    rendered = tok.decode(t.prompt_ids, skip_special_tokens=False)
    assert "<tools>" in rendered and '"name": "add"' in rendered  # the schemas joined the prompt
    assert int((t.prompt_ids == model.config.image_token_id).sum()) == 4  # 56x56: the processor's expansion
    assert "<tool_response>\n5\n</tool_response>" in tok.decode(t.response_ids[~t.loss_mask])
    assert t.loss_mask[-1]  # the second call's reply trains
    logp = forward((model, proc, engine), [t])[0, : t.response_length]
    torch.testing.assert_close(logp[t.loss_mask], t.logprobs[t.loss_mask], rtol=0, atol=2e-5)
    bare = type(t)(**{**t.__dict__, "info": {k: v for k, v in t.info.items() if k != "vision"}})
    assert (forward((model, proc, engine), [bare])[0, : t.response_length] - t.logprobs)[t.loss_mask].abs().max() > 1e-3


def test_too_large_images_and_bodies_are_refused(vlm, huge_png, tmp_path):
    """An image whose header says 20000x20000 pixels (never decoded): 400; a body past the limit: 413."""
    _, proc, engine = vlm
    huge = "data:image/png;base64," + base64.b64encode(huge_png(tmp_path / "huge.png").read_bytes()).decode()
    buf = io.BytesIO()
    noise = torch.randint(0, 256, (48 * 48 * 3,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    Image.frombytes("RGB", (48, 48), noise.numpy().tobytes()).save(buf, "PNG")  # ~7 KiB: past the 4 KiB limit
    big = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with EndpointServer(proc.tokenizer, Settings(PARAMS, processor=proc)) as server:
        server.engine = engine
        e = server.open_episode(0, seed=1, limits=EndpointLimits(max_request_bytes=4096))
        for url, status, needle in ((huge, 400, "more than the 67,108,864 allowed"), (big, 413, "")):
            client = openai.AsyncOpenAI(base_url=server.url(e), api_key=e.key, max_retries=0)
            got, message = status_of(client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": [image(url)]}]))
            assert got == status and needle in message, message
        metrics = server.registry.pop_metrics()
        assert metrics["endpoint/refused_image"] == 1.0 and metrics["endpoint/refused_too_large"] == 1.0


def test_an_episodes_distinct_images_are_counted_across_its_calls():
    """Limit 2: calls sending (a, b) then (a, b) again are served; a third image c is refused."""
    from rlhfkit.agents.endpoint.episodes import Refused, Registry

    reg = Registry()
    e = reg.open(0, seed=0, limits=EndpointLimits())
    reg.take_images(e, ["a", "b"], 2)
    reg.take_images(e, ["a", "b", "a"], 2)
    with pytest.raises(Refused, match="3 distinct images, more than --data.max_images_per_prompt 2"):
        reg.take_images(e, ["b", "c"], 2)
    reg.take_images(e, ["a", "b", "c"], None)  # no limit
    assert reg.pop_metrics() == {"endpoint/refused_images": 1.0} and e.image_keys == {"a", "b", "c"}
