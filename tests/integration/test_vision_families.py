"""The tiny vision-language families besides Qwen2-VL, LLaVA and Gemma 3 (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE,
SmolVLM, Idefics3, Qwen3.5, Gemma 4, InternVL, LLaVA-NeXT, LLaVA-OneVision, GLM-4.1V, PaliGemma, Aya Vision,
Llama 3.2 Vision, Mistral 3)
through the CLI on OpenRLHF's jsonl + image folder: one `train rl` step whose rollout logprobs are the
trainer's (the loop's own rollout/logprob_gap_max) and whose update
moves the weights, and one `train sft` step that trains through the images (the tower moves); both
final folders load back with the family's processor; the families added last (LLaVA-NeXT, LLaVA-OneVision,
GLM-4.1V, PaliGemma, Aya Vision) also take one `train dpo` and one `train rm` step through the images and an
`eval` with a verifier. The other vision integration tests run the options on one family each
(test_vision_rl.py, test_vision_supervised.py, test_vision_reward_model.py, test_vision_eval.py): Qwen2-VL,
LLaVA, Gemma 3."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.data.synthetic_vision import write_colour_task
from rlhfkit.models.tiny_vision import FAMILIES, save_tiny_vision
from rlhfkit.models.vision import TOWER_NAMES, load_processor

# A random policy never names the colour: the parity of the response's characters varies within a group, so
# the update moves weights.
PARITY_REWARD = """def reward_func(queries, prompts, labels, **kwargs):
    return [float(sum(map(ord, q[len(p):])) % 2) for q, p in zip(queries, prompts)]
"""


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    write_colour_task(root / "colours", n_train=8, n_test=2)
    (root / "parity.py").write_text(PARITY_REWARD)
    return root


def cli(kind, *args) -> int:
    """`rlhfkit train KIND ARGS` in this process (no second interpreter start per run)."""
    return main(["train", kind, *args])


def moved(before: dict, after: dict, tower: bool) -> bool:
    """Whether some weight of the vision tower (`tower`) or of the rest changed."""

    def in_tower(k: str) -> bool:
        return any(f".{t}." in f".{k}" for t in TOWER_NAMES)

    return any(not torch.equal(before[k], after[k]) for k in before if in_tower(k) == tower)


# The families test_vision_rl.py and test_vision_supervised.py run through the CLI already.
NEW = [f for f in FAMILIES if f not in ("qwen2_vl", "llava", "gemma3")]


@pytest.mark.parametrize("family", NEW)
def test_one_rl_step_and_one_sft_step_through_the_cli(colours, tmp_path, family):
    model = save_tiny_vision(tmp_path / "vlm", family)
    data = ["--data.input_key", "prompt", "--data.image_key", "images", "--train.num_threads", "1",
            "--logger.progress_bar", "false"]
    rl = cli("rl", "--actor.model_name_or_path", str(model), "--data.prompt_dataset",
             str(colours / "colours" / "train.jsonl"), "--data.label_key", "label", *data,
             "--reward.remote_url", str(colours / "parity.py"), "--rollout.batch_size", "2",
             "--rollout.n_samples_per_prompt", "4", "--rollout.max_new_tokens", "3", "--train.batch_size", "8",
             "--train.micro_batch_size", "4", "--train.max_steps", "1", "--actor.adam.lr", "1e-2",
             "--actor.autocast", "none", "--data.prompt_max_len", "512", "--ckpt.output_dir", str(tmp_path / "rl"))
    assert rl == 0
    [step] = [r for r in map(json.loads, (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert step["rollout/logprob_gap_max"] < 1e-4, step  # the rollout's logprobs are the trainer's forward's
    before = load_file(model / "model.safetensors")
    assert moved(before, load_file(tmp_path / "rl" / "final" / "model.safetensors"), tower=False)
    sft = cli("sft", "--model.model_name_or_path", str(model), "--data.dataset",
              str(colours / "colours" / "train.jsonl"), "--data.output_key", "label", *data,
              "--train.batch_size", "4", "--train.micro_batch_size", "2", "--train.max_steps", "1",
              "--adam.lr", "1e-2", "--model.autocast", "none", "--train.lr_warmup_ratio", "0",
              "--ckpt.output_dir", str(tmp_path / "sft"))
    assert sft == 0
    assert moved(before, load_file(tmp_path / "sft" / "final" / "model.safetensors"), tower=True)  # through the images
    expected = type(load_processor(str(model))).__name__
    assert [type(load_processor(str(tmp_path / k / "final"))).__name__ for k in ("rl", "sft")] == [expected] * 2


# The families added last, whose DPO, reward model and evaluation through the CLI are checked here (the earlier
# ones' in test_vision_supervised.py, test_vision_reward_model.py and test_vision_eval.py on one family each).
LATEST = ["llava_next", "llava_onevision", "glm4v", "paligemma", "aya_vision", "mllama"]


@pytest.mark.parametrize("family", LATEST)
def test_one_dpo_step_one_rm_step_and_an_eval_through_the_cli(colours, tmp_path, family):
    model = save_tiny_vision(tmp_path / "vlm", family)
    pairs = ["--data.dataset", str(colours / "colours" / "pairs.jsonl"), "--data.prompt_key", "prompt",
             "--data.image_key", "images", "--train.batch_size", "4", "--train.micro_batch_size", "2",
             "--train.max_steps", "1", "--adam.lr", "1e-2", "--model.autocast", "none", "--train.num_threads", "1",
             "--train.lr_warmup_ratio", "0",  # one step: a warmup's first step has lr 0
             "--logger.progress_bar", "false", "--model.model_name_or_path", str(model)]
    before = load_file(model / "model.safetensors")
    assert cli("dpo", *pairs, "--ckpt.output_dir", str(tmp_path / "dpo")) == 0
    assert moved(before, load_file(tmp_path / "dpo" / "final" / "model.safetensors"), tower=True)
    assert cli("rm", *pairs, "--ckpt.output_dir", str(tmp_path / "rm")) == 0
    rm = load_file(tmp_path / "rm" / "final" / "model.safetensors")  # the base model, its score head beside it
    assert (tmp_path / "rm" / "final" / "reward_head.safetensors").is_file()
    base = {k.removeprefix("model."): v for k, v in before.items() if k.removeprefix("model.") in rm}
    assert base and moved(base, rm, tower=True)
    evaluated = main(["eval", "--actor.model_name_or_path", str(model), "--eval.dataset",
                      str(colours / "colours" / "test.jsonl"), "--data.input_key", "prompt", "--data.label_key",
                      "label", "--data.image_key", "images", "--eval.verifier", str(colours / "parity.py"),
                      "--eval.n_samples", "2", "--eval.temperature", "1.0", "--rollout.max_new_tokens", "3",
                      "--actor.autocast", "none", "--train.num_threads", "1",
                      "--ckpt.output_dir", str(tmp_path / "eval")])
    assert evaluated == 0
    rows = [json.loads(line) for line in (tmp_path / "eval" / "eval_samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["response"] is not None for r in rows)
