"""Agent files whose `AgentExecutor` has its own `execute` (OpenRLHF 2026's form) with a vision-language
policy (the tiny random Qwen2-VL): `execute` gets the processor as `hf_tokenizer` and the prompt's
images, `llm_engine.generate` takes them as `multi_modal_data`; the trajectory keeps the images of its
last call, so the recorded logprobs are the trainer's forward over them. A `MultiTurnAgentExecutor`
whose `execute` wraps the base's runs `step()`'s environment_images the same way. Prompt ids whose image
tokens do not match the images are refused."""

from pathlib import Path

import pytest
import torch
from PIL import Image

from rlhfkit.agents import AgentExecutorBase, AgentInstanceBase, ExecuteRunner, MultiTurnAgentExecutor, TokenBudget
from rlhfkit.agents.loader import load_agent_file
from rlhfkit.api.vision import attach_processor
from rlhfkit.data.images import encode
from rlhfkit.data.types import PromptItem
from rlhfkit.errors import RewardError
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine
from tests.unit.agents.conftest import forward_gap

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "openrlhf_vlm_execute_agent.py"
RED, BLUE = (230, 30, 30), (30, 30, 230)
FEEDBACK = "\nuser: <|vision_start|><|image_pad|><|vision_end|>and this one?\nassistant: "


@pytest.fixture(scope="module")
def vlm():
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    return model, processor, VisionEngine(model, processor.tokenizer)


def image_prompt(processor, colour) -> PromptItem:
    """A PromptItem as data.images makes it: the rendered text, one 56x56 image."""
    image = Image.new("RGB", (56, 56), colour)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, vision = encode(processor, text, [image])
    return PromptItem(text, ids, "red", raw="colour?", vision=vision, images=[image])


def run(vlm, runner, colour=RED, n=2, total=100):
    _, processor, engine = vlm
    attach_processor(processor, 3, runner)
    return runner.run(engine, processor.tokenizer, [image_prompt(processor, colour)],
                      SamplingParams(max_new_tokens=5, temperature=1.0, n=n), TokenBudget(5, total, 2), seeds=[7])


def gap(vlm, trajs) -> torch.Tensor:
    model, processor, _ = vlm
    return forward_gap(model, processor, trajs)


def without_images(trajs):
    return [type(t)(**{**t.__dict__, "info": {k: v for k, v in t.info.items() if k != "vision"}}) for t in trajs]


def test_an_openrlhf_execute_with_images_records_the_trainers_logprobs(vlm):
    model, _, _ = vlm
    runner = load_agent_file(FIXTURE)
    assert isinstance(runner, ExecuteRunner) and runner.instance is not None
    trajs = run(vlm, runner)
    pad = model.config.image_token_id
    for t in trajs:
        assert t.info["vision"].num_images == 2 and t.info["extra_logs"]["images_seen"] == 2.0
        assert int((t.prompt_ids == pad).sum()) == 4  # 56x56: the processor's expansion
        assert int((t.response_ids[~t.loss_mask] == pad).sum()) == 1  # the screenshot, in the masked feedback
        assert t.loss_mask[-1] and t.info["turns"] == 2
    assert gap(vlm, trajs).max() < 2e-5
    assert gap(vlm, without_images(trajs)).max() > 1e-3  # the switch-off: the images matter


def test_a_cut_through_feedback_with_an_image_ends_the_trajectory_after_the_last_action_before_it(vlm):
    """A response budget of 20 tokens cuts the screenshot's feedback: its image token, which the kept
    calls never saw, leaves with it; the trajectory holds the prompt's image and trains the first action."""
    model, _, _ = vlm
    trajs = run(vlm, load_agent_file(FIXTURE), total=20)
    for t in trajs:
        assert t.finish_reason == "length" and t.info["vision"].num_images == 1 and t.loss_mask.all()
        assert not (t.response_ids == model.config.image_token_id).any()
    assert gap(vlm, trajs).max() < 2e-5


def test_the_prompts_image_reaches_the_engine(vlm):
    """The same seeds, a red or a blue prompt image: the first action's logprobs differ."""
    red, blue = (run(vlm, load_agent_file(FIXTURE), colour, n=1)[0] for colour in (RED, BLUE))
    first = int(red.loss_mask.long().argmin())  # the first action's length (the feedback follows it)
    assert (red.logprobs[:first] - blue.logprobs[:first]).abs().max() > 1e-4


class Look(AgentInstanceBase):
    """Shows a screenshot after the first action, ends after the second."""

    async def step(self, states, **kwargs):
        self.turn = getattr(self, "turn", 0) + 1
        if self.turn == 1:
            return {"rewards": 0.0, "done": False, "environment_feedback": FEEDBACK,
                    "environment_images": [Image.new("RGB", (28, 28), (40, 200, 40))]}
        return {"rewards": 1.0, "done": True, "environment_feedback": ""}


class Wrapped(MultiTurnAgentExecutor):
    def __init__(self):
        super().__init__(Look)

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        result = await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine,
                                       images=images)
        return {**result, "extra_logs": {"image_processor": float(hasattr(hf_tokenizer, "image_processor"))}}


def test_a_multi_turn_executor_wrapping_the_base_execute_shows_the_environment_images(vlm):
    trajs = run(vlm, ExecuteRunner(Wrapped, "wrapped", instance=Wrapped()))
    for t in trajs:
        assert t.info["vision"].num_images == 2 and t.info["agent_reward"] == 1.0
        assert t.info["extra_logs"] == {"image_processor": 1.0}
    assert gap(vlm, trajs).max() < 2e-5


class Swapped(AgentExecutorBase):
    """Two calls, the second with another image in the first one's place."""

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        ids = hf_tokenizer(text=[prompt], images=images, add_special_tokens=False)["input_ids"][0]
        out = (await llm_engine.generate(list(ids), sampling_params, multi_modal_data={"image": images})).outputs[0]
        other = [Image.new("RGB", (56, 56), BLUE)]
        ids = list(ids) + list(out.token_ids)
        out2 = (await llm_engine.generate(ids, sampling_params, multi_modal_data={"image": other})).outputs[0]
        start = len(ids) - len(out.token_ids)
        return {"observation_tokens": ids + list(out2.token_ids), "reward": 0.0,
                "action_ranges": [(start, len(ids)), (len(ids), len(ids) + len(out2.token_ids))]}


def test_calls_of_one_trajectory_with_other_images_are_refused(vlm):
    with pytest.raises(RewardError, match="generated with other images than the last action"):
        run(vlm, ExecuteRunner(Swapped, "swapped", instance=Swapped()), n=1)


class BadIds(AgentExecutorBase):
    """Sends the prompt's text tokenized without its images (one placeholder) with the images, or the
    processor's ids without them."""

    def __init__(self, send_images: bool):
        super().__init__()
        self.send_images = send_images

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        if self.send_images:
            ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
            await llm_engine.generate(ids, sampling_params, multi_modal_data={"image": images})
        else:
            ids = hf_tokenizer(text=[prompt], images=images, add_special_tokens=False)["input_ids"][0]
            await llm_engine.generate(list(ids), sampling_params)


@pytest.mark.parametrize("send_images, needle", [
    (True, "the prompt holds 1 image tokens, its 1 images take 4"),
    (False, "got a prompt holding 4 image tokens and no images"),
])
def test_image_tokens_that_do_not_match_the_images_are_refused(vlm, send_images, needle):
    with pytest.raises(RewardError, match=needle):
        run(vlm, ExecuteRunner(BadIds, "bad", instance=BadIds(send_images)), n=1)
