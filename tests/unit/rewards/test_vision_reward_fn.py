"""rewards.reward_model.VisionRewardModelFn: each sample is the prompt's messages with its images and the
response as the assistant's turn, rendered by the reward model's own processor and scored at the last token,
normalised by the mean / std of its config; here computed by hand with transformers alone."""

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from rlhfkit.data.types import PromptItem
from rlhfkit.errors import RewardError
from rlhfkit.models.backbone_reward import HEAD_WEIGHTS, save_backbone_reward_model
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.models.vision import base_model
from rlhfkit.models.vision_reward import VisionRewardModel
from rlhfkit.rewards.reward_model import VisionRewardModelFn, prompt_images

RED, BLUE = Image.new("RGB", (28, 28), (220, 40, 40)), Image.new("RGB", (42, 28), (40, 60, 220))
QUESTION = "Which colour?"
MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


def save_tiny_vision_rm(path):
    """A tiny Qwen2-VL reward model over images in `path`: a seeded head, mean 0.5 and std 2 in its config."""
    vlm, processor = tiny_vision_model_and_processor("qwen2_vl")
    rm = VisionRewardModel(base_model(vlm))
    with torch.no_grad():
        rm.score.weight.copy_(torch.randn(rm.score.weight.shape, generator=torch.Generator().manual_seed(1)))
    rm.config.mean, rm.config.std = 0.5, 2.0
    out = save_backbone_reward_model(rm, path)
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_vision_rm(tmp_path_factory.mktemp("vrm") / "rm")


def by_hand(folder, answer: str, image) -> float:
    """The raw score with transformers alone: the conversation rendered by the processor's chat template,
    the processor's ids and image tensors, AutoModel's last hidden state at the last token, the head file."""
    from transformers import AutoModel

    from rlhfkit.models.vision import load_processor

    processor = load_processor(str(folder))
    text = processor.apply_chat_template(MESSAGES + [{"role": "assistant", "content": answer}], tokenize=False)
    out = processor(text=[text], images=[[image]], return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(folder)(**out).last_hidden_state[0, -1]
    return float(hidden @ load_file(folder / HEAD_WEIGHTS)["score.weight"][0])


def score(fn, raw, responses, images):
    n = len(responses)
    return fn(["q"] * n, ["p"] * n, [None] * n, raw_prompts=raw, responses=responses, prompt_images=images)


def test_each_sample_is_its_conversation_with_its_images_through_the_rms_processor(folder):
    fn = VisionRewardModelFn(folder, micro_batch_size=2)  # 3 samples: two micro-batches, the first padded
    raw = [MESSAGES, QUESTION, MESSAGES]  # OpenRLHF's messages; TRL's string (a placeholder is put first)
    out = score(fn, raw, ["red", "blue, surely", "green"], [[RED], [BLUE], [BLUE]])
    expected = torch.tensor([by_hand(folder, "red", RED), by_hand(folder, "blue, surely", BLUE),
                             by_hand(folder, "green", BLUE)])
    assert torch.allclose(out.extra_logs["rm_score"], expected, atol=1e-5)
    assert torch.allclose(out.rewards, (expected - 0.5) / 2.0, atol=1e-5) and torch.equal(out.scores, out.rewards)


def test_changing_the_image_changes_the_score(folder):
    fn = VisionRewardModelFn(folder)
    blue = Image.new("RGB", RED.size, (40, 60, 220))  # the same size: the same ids, only the pixels differ
    out = score(fn, [MESSAGES, MESSAGES], ["red", "red"], [[RED], [blue]])
    assert abs(float(out.rewards[0] - out.rewards[1])) > 1e-4


def test_a_call_without_the_trainers_keywords_says_what_it_needs(folder):
    with pytest.raises(RewardError, match="needs the trainer's raw_prompts= and responses="):
        VisionRewardModelFn(folder)(["q"], ["p"], [None])


def test_prompt_images_are_passed_only_when_a_prompt_has_some():
    plain, pictured = PromptItem("a", [1]), PromptItem("b", [2], images=[RED])
    assert prompt_images([plain, plain]) == {}
    assert prompt_images([plain, pictured]) == {"prompt_images": [None, [RED]]}
