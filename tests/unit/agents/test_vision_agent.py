"""Multi-turn agents with image observations on the tiny random Qwen2-VL (OpenRLHF's
`vlm_multiturn_agent.py` form): the second observation carries an image; the rollout's logprobs
equal the trainer's forward over every image of the episode, the feedback image reaches the model,
feedback (its image tokens included) is masked, and bad image feedback is refused in one line."""

import pytest
import torch
from PIL import Image

from rlhfkit.agents import AgentInstanceBase, MultiTurnExecutor, TokenBudget
from rlhfkit.data.batch import collate
from rlhfkit.data.images import encode
from rlhfkit.data.types import PromptItem
from rlhfkit.errors import RewardError
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
COLOURS = {"red": (230, 30, 30), "blue": (30, 30, 230)}


class LookAgent(AgentInstanceBase):
    """Turn 1: shows a 56x56 image of the label's colour; turn 2: done, reward 1."""

    def __init__(self):
        self.turn = 0

    async def step(self, states, **kwargs):
        self.turn += 1
        if self.turn == 1:
            return {"rewards": 0.0, "environment_feedback": f"\nuser: now {PLACEHOLDER} ?\nassistant: ",
                    "environment_images": [Image.new("RGB", (56, 56), COLOURS[states["label"]])], "done": False}
        return {"rewards": 1.0, "environment_feedback": "", "done": True}


class Broken(AgentInstanceBase):
    def __init__(self, feedback, images):
        self.feedback, self.images = feedback, images

    async def step(self, states, **kwargs):
        return {"rewards": 0.0, "environment_feedback": self.feedback, "environment_images": self.images,
                "done": True}


@pytest.fixture(scope="module")
def vlm():
    return tiny_vision_model_and_processor("qwen2_vl", seed=0)


def prompt(processor, label):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, vision = encode(processor, text, [Image.new("RGB", (40, 40), (30, 200, 30))])
    return PromptItem(text, ids, label, vision=vision)


def episodes(vlm, labels, agent=LookAgent, n=2, processor=True):
    model, proc = vlm
    executor = MultiTurnExecutor(agent)
    executor.processor = proc if processor else None
    return executor.run(VisionEngine(model, proc.tokenizer), proc.tokenizer, [prompt(proc, x) for x in labels],
                        SamplingParams(max_new_tokens=5, temperature=1.0, n=n),
                        TokenBudget(per_turn=5, total=60, max_turns=2), seeds=[7] * len(labels))


def test_rollout_logprobs_equal_the_trainers_forward_with_every_image(vlm):
    model, proc = vlm
    trajs = episodes(vlm, ["red", "blue"])
    image = model.config.image_token_id
    for t in trajs:
        assert t.info["turns"] == 2 and t.info["vision"].num_images == 2  # the prompt's image + the feedback's
        feedback = t.response_ids[~t.loss_mask]
        assert (feedback == image).sum() == 4  # a 56x56 image: 16 patches merged 2x2, all masked
        assert not (t.response_ids[t.loss_mask] == image).any()
        assert t.loss_mask[-1]  # the second action follows the feedback image
    padded = collate(trajs, proc.tokenizer.pad_token_id)
    logp, _ = response_logprobs(model, padded, temperature=1.0)
    rollout = torch.zeros_like(logp)
    for i, t in enumerate(trajs):
        rollout[i, : t.response_length] = t.logprobs
    mask = padded.loss_mask
    torch.testing.assert_close(logp[mask], rollout[mask], rtol=0, atol=2e-5)


def test_the_feedback_image_reaches_the_model(vlm):
    """Same prompt, same seeds, the feedback image red or blue: turn 1 is the same, turn 2 is not."""
    red, blue = episodes(vlm, ["red", "blue"], n=1)
    first = int((~red.loss_mask).nonzero()[0])  # where the feedback starts
    assert torch.equal(red.response_ids[:first], blue.response_ids[:first])
    assert torch.equal(red.logprobs[:first], blue.logprobs[:first])
    end = int((~red.loss_mask).nonzero()[-1]) + 1
    assert red.loss_mask[end:].all() and blue.loss_mask[end:].all()
    assert (red.logprobs[end:] - blue.logprobs[end:]).abs().max() > 1e-4
    # the trainer's forward too: the red episode with the blue feedback image gives other logprobs
    model, proc = vlm
    swapped = type(red)(**{**red.__dict__, "info": {**red.info, "vision": blue.info["vision"]}})
    a, _ = response_logprobs(model, collate([red], proc.tokenizer.pad_token_id))
    b, _ = response_logprobs(model, collate([swapped], proc.tokenizer.pad_token_id))
    assert (a[0, end:red.response_length] - b[0, end:red.response_length]).abs().max() > 1e-4


@pytest.mark.parametrize("feedback, images, processor, message", [
    (f"see {PLACEHOLDER}", [], True, "holds an image placeholder token but step"),
    ("no placeholder", [Image.new("RGB", (28, 28))], True, "do not match"),
    (f"see {PLACEHOLDER}", ["/no/such/image.png"], True, "not found"),
    (f"see {PLACEHOLDER}", [Image.new("RGB", (28, 28))], False, "need a vision-language policy"),
])
def test_bad_image_feedback_is_refused_in_one_line(vlm, feedback, images, processor, message):
    agent = type("Agent", (Broken,), {"__init__": lambda self: Broken.__init__(self, feedback, images)})
    with pytest.raises(RewardError, match=message) as err:
        episodes(vlm, ["red"], agent=agent, n=1, processor=processor)
    assert "\n" not in str(err.value)


def test_feedback_images_cut_by_the_budget_are_dropped_with_their_tokens(vlm):
    model, proc = vlm
    executor = MultiTurnExecutor(LookAgent)
    executor.processor = proc
    [t] = executor.run(VisionEngine(model, proc.tokenizer), proc.tokenizer, [prompt(proc, "red")],
                       SamplingParams(max_new_tokens=5, temperature=1.0), TokenBudget(5, 12, 2), seeds=[7])
    assert t.response_length == 12 and t.finish_reason == "length"
    assert t.info["vision"].num_images == 1  # the prompt's image alone
    assert not (t.response_ids == model.config.image_token_id).any()


def test_feedback_images_past_the_image_limit_end_the_episode_without_them(vlm):
    """--data.max_images_per_prompt bounds an episode's images, the prompt's counted: with a limit of 1
    the prompt's image fills it, the feedback's image and its tokens are dropped and the episode ends
    truncated; with 2 the feedback image is kept."""
    model, proc = vlm
    for limit, images, finish in ((1, 1, "length"), (2, 2, "stop")):
        executor = MultiTurnExecutor(LookAgent)
        executor.processor, executor.max_images = proc, limit
        [t] = executor.run(VisionEngine(model, proc.tokenizer), proc.tokenizer, [prompt(proc, "red")],
                           SamplingParams(max_new_tokens=5, temperature=1.0), TokenBudget(5, 60, 2), seeds=[7])
        assert t.info["vision"].num_images == images and t.finish_reason == finish
        assert (t.response_ids == model.config.image_token_id).any() == (images == 2)
