"""QLoRA with vision-language models (--ds.load_in_4bit with --ds.lora.rank): the language model's linear
layers load as bitsandbytes' 4-bit NF4 weights (the vision tower, projector and LM head stay float),
only the LoRA adapters train and the 4-bit base stays as loaded, in `train rl` (the rollout samples with
the 4-bit weights the trainer differentiates, over the same images: the logprob gap stays at float
noise), in `train sft` / `train dpo` and in `train rm` (a reward model over images). Skipped where
bitsandbytes is not installed."""

import json

import pytest
import torch

from rlhfkit.api.rl import RLTrainer
from rlhfkit.api.supervised import DPOTrainer, RMTrainer, SFTTrainer
from rlhfkit.config import RLConfig
from rlhfkit.config.preference import DPOConfig, RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.data.batch import collate
from rlhfkit.data.synthetic_vision import write_colour_task
from rlhfkit.models.backbone_reward import HEAD_CONFIG
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.reward import batch_scores, load_reward_model
from rlhfkit.models.tiny_vision import save_tiny_vision
from rlhfkit.models.vision import load_processor, vision_parts
from rlhfkit.rollout.base import SamplingParams
from tests.integration.test_vision_rl import flags as rl_flags
from tests.integration.test_vision_rl import varied_reward
from tests.integration.test_vision_supervised import colour_pairs

bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision_qlora")
    save_tiny_vision(root / "vlm", "qwen2_vl")
    save_tiny_vision(root / "llava", "llava")
    colour_pairs(write_colour_task(root / "colours", n_train=16, n_test=4))
    return root


QLORA = {"ds.load_in_4bit": "true", "ds.lora.rank": "4", "ds.lora.alpha": "8"}


def four_bit(model) -> tuple[list, dict]:
    """(the Linear4bit modules, the frozen parameters by name, cloned)."""
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    return linears, {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def assert_base_unchanged(model, frozen: dict) -> None:
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_rl_samples_and_trains_with_the_same_4bit_weights_and_images(ws, tmp_path):
    over = {**QLORA, "algo.kl.init_coef": "0.01", "actor.adam.lr": "5e-2", "actor.freeze_visual_encoder": "true",
            "train.max_steps": "3"}
    cfg = RLConfig.from_args(rl_flags(ws, tmp_path / "rl", **over))
    trainer = RLTrainer.from_config(cfg, reward_fn=varied_reward)
    policy = trainer.policy
    linears, frozen = four_bit(policy)
    assert len(linears) == 2 * 7  # q k v o gate up down of the 2 language-model layers
    tower = next(m for _, m in vision_parts(policy))
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in tower.modules())  # the tower stays float
    assert any(isinstance(m, torch.nn.Linear) for m in tower.modules())
    start = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    assert start and all("lora_" in n for n in start)
    trainer.train()
    assert_base_unchanged(policy, frozen)
    assert any("lora_B" in n and not torch.equal(p, start[n]) for n, p in policy.named_parameters() if n in start)
    assert all(m.weight.dtype == torch.uint8 for m in linears)  # still packed 4-bit
    steps = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert all(s["rollout/logprob_gap_mean"] < 1e-4 for s in steps if "reward" in s)
    assert any(s["kl"] > 0 for s in steps)  # the adapters moved the policy off its 4-bit base (the reference)
    # the engine's logprobs are the trainer's forward on the 4-bit weights, over the prompt's images
    prompt = trainer.loop.data.prompts[0]
    [traj] = trainer.loop.engine.generate([prompt.ids], SamplingParams(max_new_tokens=4), seeds=[1],
                                          vision=[prompt.vision])
    batch = collate([traj], trainer.loop.tokenizer.pad_token_id)
    with torch.no_grad():
        ours, _ = response_logprobs(policy, batch)
        traj.info.pop("vision")
        blind, _ = response_logprobs(policy, collate([traj], trainer.loop.tokenizer.pad_token_id))
    torch.testing.assert_close(ours[0], traj.logprobs, rtol=0, atol=2e-5)
    assert (blind[0] - traj.logprobs).abs().max() > 1e-4  # without the images the numbers differ
    final = tmp_path / "rl" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "processor_config.json").is_file()


def supervised_args(ws, out, kind):
    keys = (["--data.dataset", str(ws / "colours" / "train.jsonl"), "--data.input_key", "prompt",
             "--data.output_key", "label"] if kind == "sft"
            else ["--data.dataset", str(ws / "colours" / "pairs.jsonl"), "--data.prompt_key", "prompt"])
    return ["--model.model_name_or_path", str(ws / "llava"), *keys, "--data.image_key", "images",
            "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_steps", "2",
            "--adam.lr", "5e-2", "--model.autocast", "none", "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--ckpt.output_dir", str(out), "--ds.load_in_4bit",
            "--ds.lora.rank", "4", "--ds.lora.alpha", "8"]


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_sft_and_dpo_train_adapters_over_a_4bit_language_model(ws, tmp_path, kind):
    config, trainer_cls = (SFTConfig, SFTTrainer) if kind == "sft" else (DPOConfig, DPOTrainer)
    trainer = trainer_cls.from_config(config.from_args(supervised_args(ws, tmp_path / kind, kind)))
    linears, frozen = four_bit(trainer.model)
    assert len(linears) == 2 * 7
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert start and all("lora_" in n for n in start)
    metrics = trainer.train()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert_base_unchanged(trainer.model, frozen)
    moved = [n for n, p in trainer.model.named_parameters() if n in start and not torch.equal(p, start[n])]
    assert any("lora_B" in n for n in moved)
    assert any("vision_tower" in n for n in moved)  # adapters in the (float) tower train through the images
    assert type(load_processor(str(tmp_path / kind / "final"))).__name__ == "LlavaProcessor"


def test_a_reward_model_over_images_trains_adapters_and_its_float_head_over_a_4bit_language_model(ws, tmp_path):
    argv = supervised_args(ws, tmp_path / "rm", "rm")
    argv[argv.index("--model.model_name_or_path") + 1] = str(ws / "vlm")
    trainer = RMTrainer.from_config(RMConfig.from_args(argv))
    linears, frozen = four_bit(trainer.model)
    assert len(linears) == 2 * 7
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any("score" in n and p.dtype == torch.float32 for n, p in start.items())  # the new head, float
    assert all("lora_" in n or "score" in n for n in start)
    assert torch.isfinite(torch.tensor(trainer.train()["loss"]))
    final = tmp_path / "rm" / "final"
    assert (final / HEAD_CONFIG).is_file()
    samples = [s for p in trainer.train_items[:2] for s in (p.chosen, p.rejected)]
    with torch.no_grad():  # the merged folder reloads with the scores the trainer ends with
        reloaded = batch_scores(load_reward_model(final), collate(samples, trainer.tokenizer.pad_token_id))
        torch.testing.assert_close(reloaded, trainer.algorithm.scores(samples), rtol=0, atol=1e-4)
