"""models/vision_reward.py: a reward model over images is the VLM's base model with a bias-free `score` head
read at each row's last attended token, here computed by hand from transformers' own base model and processor;
its folder reloads with the same scores and is readable without rlhfkit (AutoModel + the head file)."""

import json

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from rlhfkit.data.batch import collate
from rlhfkit.data.images import TOKEN_KEYS, VisionInputs
from rlhfkit.data.supervised import TokenSample
from rlhfkit.errors import ModelError
from rlhfkit.models.backbone_reward import HEAD_CONFIG, HEAD_WEIGHTS, last_token_index, save_backbone_reward_model
from rlhfkit.models.critic import Critic
from rlhfkit.models.lora import add_lora
from rlhfkit.models.reward import (
    batch_scores,
    is_reward_model_folder,
    load_reward_model,
    normalization,
)
from rlhfkit.models.tiny_vision import tiny_vision_model_and_processor
from rlhfkit.models.vision import base_model, language_lora_targets
from rlhfkit.models.vision_reward import VisionRewardModel

RED, BLUE = Image.new("RGB", (28, 28), (220, 40, 40)), Image.new("RGB", (42, 28), (40, 60, 220))


def conversation(answer: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]},
            {"role": "assistant", "content": answer}]


def processed(processor, answer: str, image) -> dict:
    """transformers' processor output of the whole conversation with its image."""
    text = processor.apply_chat_template(conversation(answer), tokenize=False)
    return processor(text=[text], images=[[image]], return_tensors="pt")


def as_sample(out: dict, response_tokens: int) -> TokenSample:
    ids = out["input_ids"][0]
    p = ids.numel() - response_tokens
    return TokenSample(ids[:p], ids[p:], torch.ones(response_tokens, dtype=torch.bool),
                       vision=VisionInputs({k: v for k, v in out.items() if k not in TOKEN_KEYS}, 1))


def reward_model(family: str, seed: int = 0) -> tuple[VisionRewardModel, object]:
    vlm, processor = tiny_vision_model_and_processor(family)
    rm = VisionRewardModel(base_model(vlm))
    with torch.no_grad():
        rm.score.weight.copy_(torch.randn(rm.score.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return rm.eval(), processor


def test_the_last_token_of_right_left_and_unpadded_rows_by_hand():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [1, 3, 3]


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3", "llava"])
def test_the_score_is_the_head_on_the_base_models_hidden_state_at_the_last_token(family):
    rm, processor = reward_model(family)
    outs = [processed(processor, "red", RED), processed(processor, "blue, surely blue", BLUE)]
    with torch.no_grad():
        by_hand = [rm.model(**out).last_hidden_state[0, -1] @ rm.score.weight[0] for out in outs]
        batch = collate([as_sample(out, 3) for out in outs], processor.tokenizer.pad_token_id)
        assert batch.attention_mask[0].sum() < batch.attention_mask.shape[1]  # the first row is padded
        scores = batch_scores(rm, batch)
    assert scores.shape == (2,) and torch.allclose(scores, torch.stack(by_hand), atol=1e-5)


def test_the_saved_folder_reloads_with_the_same_scores_and_reads_without_rlhfkit(tmp_path):
    from transformers import AutoModel

    rm, processor = reward_model("qwen2_vl")
    rm.config.mean, rm.config.std = 0.25, 2.0
    folder = save_backbone_reward_model(rm, tmp_path / "rm")
    processor.save_pretrained(folder)
    out = processed(processor, "red", RED)
    sample = collate([as_sample(out, 2)], processor.tokenizer.pad_token_id)
    loaded = load_reward_model(folder)
    with torch.no_grad():
        assert torch.allclose(batch_scores(loaded, sample), batch_scores(rm, sample), atol=1e-6)
        base = AutoModel.from_pretrained(folder)  # no rlhfkit: the base model, the head file, the json
        weight = load_file(folder / HEAD_WEIGHTS)["score.weight"]
        by_hand = base(**out).last_hidden_state[0, -1] @ weight[0]
    assert type(base).__name__ == "Qwen2VLModel" and torch.allclose(batch_scores(loaded, sample), by_hand, atol=1e-6)
    head = json.loads((folder / HEAD_CONFIG).read_text())
    assert head == {"format": "rlhfkit.vision_reward_model", "version": 1, "weights": HEAD_WEIGHTS,
                    "hidden_size": 32, "read_at": "last_attended_token"}
    assert normalization(loaded) == (0.25, 2.0) and is_reward_model_folder(folder)


def test_a_head_of_another_shape_is_a_model_error_naming_the_file(tmp_path):
    rm, _ = reward_model("qwen2_vl")
    folder = save_backbone_reward_model(rm, tmp_path / "rm")
    save_file({"score.weight": torch.zeros(1, 7)}, str(folder / HEAD_WEIGHTS))
    with pytest.raises(ModelError, match=f"{HEAD_WEIGHTS}: expected one tensor score.weight of shape \\(1, 32\\)"):
        load_reward_model(folder)


def test_lora_adapts_the_base_model_and_trains_the_whole_head_never_an_adapter_on_it():
    rm, processor = reward_model("llava")
    with_tower = language_lora_targets(rm, "all-linear", tower=True)
    assert any(".vision_tower." in n for n in with_tower) and "score" not in with_tower
    assert not any(".vision_tower." in n for n in language_lora_targets(rm, "all-linear"))
    sample = collate([as_sample(processed(processor, "red", RED), 2)], processor.tokenizer.pad_token_id)
    before = batch_scores(rm, sample)
    peft_rm = add_lora(rm, 2, 4, with_tower, task_type="SEQ_CLS")
    trained = {n for n, p in peft_rm.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n or ".score." in n for n in trained) and any(".score." in n for n in trained)
    with torch.no_grad():
        assert torch.allclose(batch_scores(peft_rm, sample), before, atol=1e-6)  # adapters start at zero
    assert type(peft_rm.merge_and_unload()) is VisionRewardModel


def test_a_critic_built_from_it_takes_its_base_model_and_its_head(tmp_path):
    rm, processor = reward_model("qwen2_vl")
    folder = save_backbone_reward_model(rm, tmp_path / "rm")
    processor.save_pretrained(folder)
    critic = Critic.from_reward_model(folder)
    assert type(critic.backbone).__name__ == "Qwen2VLModel"
    assert torch.equal(critic.value_head.weight, rm.score.weight) and not critic.value_head.bias.any()
