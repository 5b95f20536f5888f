"""`rlhfkit train rm` on preference pairs whose prompts carry images, with a vision-language model, and RL
scored by the reward model it saves (docs/vision.md).

The pairs are the colour task's: the chosen answer names the image's colour, the rejected one the next colour
in the cycle red -> blue -> green -> red, so the pairs (red > blue), (blue > green), (green > red) are cyclic:
a scorer blind to the images ranks at most 2 of each 3 right. Above 2/3 held out, the reward model reads
the images."""

import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from rlhfkit.api.supervised import RMConfig, RMTrainer, SFTConfig, SFTTrainer
from rlhfkit.data.batch import collate
from rlhfkit.data.synthetic_vision import COLOURS, QUESTION, write_colour_task
from rlhfkit.models.backbone_reward import HEAD_WEIGHTS
from rlhfkit.models.reward import batch_scores, load_reward_model, normalization
from rlhfkit.models.tiny_vision import save_tiny_vision
from rlhfkit.models.vision import (
    base_model,
    load_processor,
    load_vision_model,
    vision_parts,
)
from rlhfkit.rewards.reward_model import VisionRewardModelFn

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision_rm")
    for family in ("qwen2_vl", "gemma3"):
        save_tiny_vision(root / family, family)
    write_colour_task(root / "colours", n_train=24, n_test=12)  # pairs.jsonl, test_pairs.jsonl among them
    return root


def supervised_flags(ws, family: str, out, *extra) -> list[str]:
    return ["--model.model_name_or_path", str(ws / family), "--data.image_key", "images",
            "--train.batch_size", "8", "--train.micro_batch_size", "8", "--adam.lr", "1e-2",
            "--model.autocast", "none", "--logger.progress_bar", "false", "--train.num_threads", "1",
            "--ckpt.output_dir", str(out), *extra]


def rm_flags(ws, family: str, out, *extra) -> list[str]:
    return supervised_flags(ws, family, out, "--data.dataset", str(ws / "colours" / "pairs.jsonl"),
                            "--data.prompt_key", "prompt", *extra)


@pytest.fixture(scope="module")
def trained(ws):
    """family -> (RMTrainer after train(), its final metrics): 4 epochs of 6 steps on the 48 train pairs."""
    done = {}

    def train(family):
        if family not in done:
            cfg = RMConfig.from_args(rm_flags(ws, family, ws / f"rm_{family}", "--train.max_epochs", "4",
                                              "--data.eval_dataset", str(ws / "colours" / "test_pairs.jsonl")))
            trainer = RMTrainer.from_config(cfg)
            done[family] = trainer, trainer.train()
        return done[family]

    return train


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_training_ranks_the_held_out_pairs_by_the_images_colour(trained, family):
    trainer, metrics = trained(family)
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0]
    assert metrics["eval/accuracy"] >= 0.75  # of 24 held-out pairs; the text alone ranks at most 12 right


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_the_saved_reward_model_reloads_with_the_trained_scores(trained, family):
    trainer, metrics = trained(family)
    final = trainer.run_dir / "final"
    loaded = load_reward_model(final)
    samples = [s for p in trainer.eval_items for s in (p.chosen, p.rejected)]
    pad = trainer.tokenizer.pad_token_id
    with torch.no_grad():
        assert torch.allclose(batch_scores(loaded, collate(samples, pad)), trainer.algorithm.scores(samples),
                              atol=1e-5)
    assert normalization(loaded) == pytest.approx((metrics["reward_mean"], metrics["reward_std"]))
    assert hasattr(load_processor(str(final)), "image_processor")


def test_changing_the_image_changes_the_score_and_ranks_the_answer_naming_its_colour_first(trained):
    """Through the reward function RL uses: for each colour's image, the answer naming it scores above the two
    others (no image-blind scorer ranks all three images' answers right), and one answer's score moves with
    the image."""
    trainer, _ = trained("qwen2_vl")
    fn = VisionRewardModelFn(trainer.run_dir / "final")
    for colour, rgb in COLOURS.items():
        image = [Image.new("RGB", (40, 40), rgb)]
        out = fn(["q"] * 3, ["p"] * 3, [None] * 3, raw_prompts=[MESSAGES] * 3, responses=list(COLOURS),
                 prompt_images=[image] * 3)
        assert list(COLOURS)[int(out.rewards.argmax())] == colour, (colour, out.rewards)
    images = [[Image.new("RGB", (40, 40), rgb)] for rgb in COLOURS.values()]
    out = fn(["q"] * 3, ["p"] * 3, [None] * 3, raw_prompts=[MESSAGES] * 3, responses=["red"] * 3,
             prompt_images=images)
    assert float(out.rewards.max() - out.rewards.min()) > 0.1


class Recorder:
    """The RL loop's scorer, recording what it scored."""

    def __init__(self, scorer):
        self.scorer, self.calls = scorer, []

    def __call__(self, prompts, trajs):
        scored = self.scorer(prompts, trajs)
        self.calls.append((prompts, trajs, scored))
        return scored

    def __getattr__(self, name):
        return getattr(self.scorer, name)


def independent_score(folder, record_prompt, response: str, image) -> float:
    """The reward model's score with transformers alone (AutoModel, AutoProcessor, the head file)."""
    from transformers import AutoModel

    processor = load_processor(str(folder))
    conversation = record_prompt + [{"role": "assistant", "content": response}]
    out = processor(text=[processor.apply_chat_template(conversation, tokenize=False)], images=[[image]],
                    return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(folder)(**out).last_hidden_state[0, -1]
    return float(hidden @ load_file(folder / HEAD_WEIGHTS)["score.weight"][0])


def test_an_rl_step_is_rewarded_with_the_reward_models_scores_of_each_prompts_image(ws, trained):
    """A Qwen2-VL policy, a Gemma 3 reward model (its own processor renders each sample)."""
    import rlhfkit

    trainer, _ = trained("gemma3")
    rm = trainer.run_dir / "final"
    flags = {"actor.model_name_or_path": ws / "qwen2_vl", "data.prompt_dataset": ws / "colours" / "train.jsonl",
             "data.input_key": "prompt", "data.label_key": "label", "data.image_key": "images",
             "reward.model_name_or_path": rm, "rollout.batch_size": 4, "rollout.n_samples_per_prompt": 2,
             "rollout.max_new_tokens": 4, "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_steps": 1,
             "algo.advantage.estimator": "group_norm", "algo.kl.init_coef": 0, "actor.autocast": "none",
             "logger.progress_bar": "false", "train.num_threads": 1, "ckpt.output_dir": ws / "rl"}
    rl = rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args([str(x) for k, v in flags.items()
                                                                   for x in (f"--{k}", v)]))
    rl.loop.scorer = recorder = Recorder(rl.loop.scorer)
    rl.train()
    (prompts, trajs, scored), = recorder.calls
    mean, std = normalization(load_reward_model(rm))
    decode = rl.loop.tokenizer.decode
    expected = []
    for t in trajs:
        record = prompts[t.group_id].record
        image = Image.open(ws / "colours" / record["images"][0]).convert("RGB")
        response = decode(t.response_ids.tolist(), skip_special_tokens=True)
        expected.append((independent_score(rm, record["prompt"], response, image) - mean) / std)
    assert len(trajs) == 8 and torch.allclose(scored.rewards, torch.tensor(expected), atol=1e-4)


def tower_of(model) -> dict:
    return {n: p.detach().clone() for name, part in vision_parts(model) for n, p in part.named_parameters()}


@pytest.mark.parametrize("kind,freeze", [("rm", True), ("rm", False), ("sft", True)])
def test_freeze_visual_encoder_keeps_the_tower_as_loaded_and_trains_the_rest(ws, tmp_path, kind, freeze):
    original = base_model(load_vision_model(str(ws / "qwen2_vl")))
    data = (["--data.dataset", str(ws / "colours" / "pairs.jsonl"), "--data.prompt_key", "prompt"]
            if kind == "rm" else ["--data.dataset", str(ws / "colours" / "train.jsonl"), "--data.input_key",
                                  "prompt", "--data.output_key", "label"])
    argv = supervised_flags(ws, "qwen2_vl", tmp_path / kind, *data, "--train.max_steps", "2",
                            *(["--model.freeze_visual_encoder"] if freeze else []))
    trainer = (RMTrainer if kind == "rm" else SFTTrainer).from_config((RMConfig if kind == "rm" else SFTConfig)
                                                                     .from_args(argv))
    trainer.train()
    before, after = tower_of(original), tower_of(trainer.model)
    assert all(torch.equal(before[n], after[n]) for n in before) == freeze
    language = dict(original.language_model.named_parameters())
    assert any(not torch.equal(language[n], p) for n, p in base_model(trainer.model).language_model.named_parameters())


def test_the_cli_trains_lora_adapters_over_a_frozen_tower_and_saves_them_merged(ws, tmp_path):
    out = tmp_path / "rm"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "rlhfkit.cli.main", "train", "rm",
                           *rm_flags(ws, "qwen2_vl", out, "--train.max_steps", "2", "--ds.lora.rank", "4",
                                     "--ds.lora.alpha", "8", "--freeze_visual_encoder")],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    from transformers import AutoModel

    original = base_model(load_vision_model(str(ws / "qwen2_vl"))).state_dict()
    saved = AutoModel.from_pretrained(out / "final").state_dict()
    assert set(saved) == set(original)  # merged: the base model's own layout, no adapter left
    assert all(torch.equal(saved[k], original[k]) for k in saved if k.startswith("visual."))
    assert any(not torch.equal(saved[k], original[k]) for k in saved if k.startswith("language_model."))
    assert (out / "final" / HEAD_WEIGHTS).is_file() and hasattr(load_processor(str(out / "final")), "image_processor")
