"""`rlhfkit train rl` and `RLTrainer` with a vision-language policy: OpenRLHF's jsonl + image folder
through the CLI, TRL's image column of a datasets Dataset through the API, the saved folder loading
back with its processor, the frozen tower, and bad images refused in one line with nothing written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.data.synthetic_vision import COLOURS, QUESTION, write_colour_task
from rlhfkit.errors import DataError
from rlhfkit.models.tiny_vision import save_tiny_vision
from rlhfkit.models.vision import load_processor

# A random policy never names the colour: this reward varies within groups, so the updates move weights.
VARIED_REWARD = """import torch


def reward_func(queries, prompts, labels, **kwargs):
    return torch.tensor([float(len(q) % 2) for q in queries])
"""


def varied_reward(queries, prompts, labels, **kwargs):
    """VARIED_REWARD as a Python callable."""
    return torch.tensor([float(len(q) % 2) for q in queries])


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    save_tiny_vision(root / "vlm", "qwen2_vl")
    save_tiny_vision(root / "gemma", "gemma3")
    write_colour_task(root / "colours", n_train=16, n_test=6)
    (root / "varied.py").write_text(VARIED_REWARD)
    from rlhfkit.models.tiny import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(root / "text")
    tok.save_pretrained(root / "text")
    return root


def flags(ws, out, model="vlm", data="colours/train.jsonl", **over):
    f = {"actor.model_name_or_path": str(ws / model), "data.prompt_dataset": str(ws / data),
         "data.input_key": "prompt", "data.label_key": "label", "data.image_key": "images",
         "reward.remote_url": str(ws / "varied.py"), "rollout.batch_size": "4",
         "rollout.n_samples_per_prompt": "2", "rollout.max_new_tokens": "4", "train.batch_size": "8",
         "train.micro_batch_size": "4", "train.max_steps": "2", "actor.adam.lr": "1e-2",
         "actor.autocast": "none", "logger.progress_bar": "false", "train.num_threads": "1",
         "ckpt.output_dir": str(out)}
    f.update(over)
    return [x for k, v in f.items() if v is not None for x in (f"--{k}", v)]


def cli(args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rlhfkit.cli.main", "train", "rl", *args], env=env,
                          capture_output=True, text=True, check=False)


def tower(state: dict) -> dict:
    return {k: v for k, v in state.items() if ".visual." in f".{k}"}


def test_cli_on_openrlhf_jsonl_and_image_folder_with_a_frozen_tower(ws, tmp_path):
    out = tmp_path / "run"
    run = cli([*flags(ws, out, model="gemma"), "--freeze_visual_encoder", "--max_images_per_prompt", "1",
               "--eval.dataset", str(ws / "colours" / "test.jsonl")])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "shared-prefix layout cannot hold their image tensors" in run.stderr + run.stdout
    before, after = load_file(ws / "gemma" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    towers = [k for k in before if "vision_tower" in k]
    assert towers and all(torch.equal(before[k], after[k]) for k in towers)
    assert any(not torch.equal(before[k], after[k]) for k in before if "language_model" in k)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2] and "eval/accuracy" in rows[-1]
    processor = load_processor(str(out / "final"))
    assert type(processor).__name__ == "Gemma3Processor"


def test_api_on_a_datasets_dataset_with_trls_image_column(ws, tmp_path):
    import datasets
    from PIL import Image

    names = list(COLOURS)
    rows = {"prompt": [QUESTION] * 8, "label": [names[i % 3] for i in range(8)],
            "image": [Image.new("RGB", (40, 40), COLOURS[names[i % 3]]) for i in range(8)]}
    ds = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    cfg = rlhfkit.RLConfig.from_args(flags(ws, tmp_path / "api", **{"data.image_key": None, "reward.remote_url": None,
                                                                    "data.prompt_dataset": None}))
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=varied_reward, train_dataset=ds)
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    first = trainer.loop.data.prompts[0]
    assert first.vision is not None and first.vision.tensors["image_grid_thw"].tolist() == [[1, 2, 2]]
    trainer.train()
    moved = [k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, start[k])]
    assert any(".visual." in f".{k}" for k in moved)  # not frozen: the tower trains too
    folder = trainer.save(tmp_path / "saved")
    assert (folder / "processor_config.json").is_file()


# OpenRLHF's vlm_multiturn_agent.py form: the second observation is an image (its colour the label's).
LOOK_AGENT = """import torch
from PIL import Image

from rlhfkit.agents import AgentInstanceBase

COLOURS = {"red": (230, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 230)}


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.turn = 0

    async def step(self, states, **kwargs):
        self.turn += 1
        if self.turn == 1:
            image = Image.new("RGB", (56, 56), COLOURS[states["label"]])
            return {"rewards": torch.tensor(0.0), "environment_images": [image], "done": False,
                    "environment_feedback": "\\nuser: <|vision_start|><|image_pad|><|vision_end|>?\\nassistant: "}
        reward = float(len(states["action_text"]) % 2)
        return {"rewards": torch.tensor(reward), "environment_feedback": "", "done": True,
                "extra_logs": {"images_shown": 1.0}}
"""


def train_agent_file(ws, out, path, response_tokens: str) -> list[dict]:
    """`train rl` with the agent file at `path` (2 turns, room for the prompt's image and one more, held-out
    episodes too): the metrics of its steps, after checking it ran, evaluated and moved the language model."""
    run = cli(flags(ws, out, **{"reward.remote_url": None, "agent.func_path": str(path),
                                "agent.max_turns": "2", "agent.max_response_tokens": response_tokens,
                                "data.max_images_per_prompt": "2",  # the prompt's image and the feedback's
                                "eval.dataset": str(ws / "colours" / "test.jsonl")}))
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and rows[-1]["eval/turns"] == 2.0  # held-out episodes too
    before, after = load_file(ws / "vlm" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("model.layers."))
    return steps


def test_cli_trains_an_agent_whose_second_observation_is_an_image(ws, tmp_path):
    (tmp_path / "look.py").write_text(LOOK_AGENT)
    steps = train_agent_file(ws, tmp_path / "run", tmp_path / "look.py", "40")
    assert all(r["reward_extra/turns"] == 2.0 and r["reward_extra/images_shown"] == 1.0 for r in steps), steps


def test_cli_trains_an_openrlhf_agent_executor_with_its_own_execute_and_images(ws, tmp_path):
    """OpenRLHF 2026's form: execute() tokenizes the prompt with its image through hf_tokenizer (the processor),
    generates with multi_modal_data, shows a screenshot and generates again (tests/fixtures)."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "openrlhf_vlm_execute_agent.py"
    steps = train_agent_file(ws, tmp_path / "run", fixture, "80")
    assert all(r["reward_extra/images_seen"] == 2.0 and r["reward_extra/turns"] == 2.0 for r in steps), steps


def bad_dataset(ws, tmp_path, case, huge_png):
    src = [json.loads(line) for line in (ws / "colours" / "train.jsonl").read_text().splitlines()]
    rows = [dict(r, images=[str(ws / "colours" / r["images"][0])]) for r in src]
    if case == "missing":
        rows[2]["images"] = [str(tmp_path / "gone.png")]
    elif case == "truncated":
        data = (ws / "colours" / src[0]["images"][0]).read_bytes()
        (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
        rows[2]["images"] = [str(tmp_path / "cut.png")]
    elif case == "huge":
        huge_png(tmp_path / "huge.png")
        rows[2]["images"] = [str(tmp_path / "huge.png")]
    elif case == "too_many":
        rows[2]["images"] = rows[2]["images"] * 2
        rows[2]["prompt"] = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("case,model,needle", [
    ("missing", "vlm", "bad.jsonl, line 3, image 0: image file"),
    ("truncated", "vlm", "bad.jsonl, line 3, image 0: image"),
    ("huge", "vlm", "has 400,000,000 pixels, more than the 67,108,864 allowed"),
    ("too_many", "vlm", "bad.jsonl, line 3: 2 images, more than --data.max_images_per_prompt 1"),
    ("text_only", "text", "bad.jsonl, line 1: the record holds images but the model"),
])
def test_bad_images_are_one_line_errors_and_nothing_is_written(ws, tmp_path, huge_png, case, model, needle):
    path = bad_dataset(ws, tmp_path, case, huge_png)
    out = tmp_path / "never"
    run = cli(flags(ws, out, model=model, data=str(path)))
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], run.stderr
    assert not out.exists()
    cfg = rlhfkit.RLConfig.from_args(flags(ws, out, model=model, data=str(path)))
    with pytest.raises(DataError, match=needle.split(", ", 1)[-1][:30]):
        rlhfkit.RLTrainer.from_config(cfg)
    assert not out.exists()


TOOLS = '''def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b
'''

ENV = '''class Colours:
    """Asks again after each answer (reward: the parity of the answer's characters); ends after the second."""

    def reset(self, seed=None):
        self.turn = 0
        return "Look closely."

    def step(self, action):
        self.turn += 1
        return "Try again.", float(sum(map(ord, action)) % 2), self.turn >= 2, False, {}
'''

PARITY_REWARD = """def reward_func(queries, prompts, labels, **kwargs):
    return [float(sum(map(ord, q[len(p):])) % 2) for q, p in zip(queries, prompts)]
"""


@pytest.mark.parametrize("agent", ["tools", "env"])
def test_cli_trains_tool_calling_and_text_environment_episodes_with_images(ws, tmp_path, agent):
    """The rollout's logprobs match the trainer's forward in the loop (rollout/logprob_gap_max), which
    they do only when the forward gets the prompt's images; the tool schemas make the prompts long."""
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "envs.py").write_text(ENV)
    (tmp_path / "parity.py").write_text(PARITY_REWARD)
    out = tmp_path / "run"
    over = {"agent.tools": f"{tmp_path / 'tools.py'}:add", "reward.remote_url": str(tmp_path / "parity.py")} \
        if agent == "tools" else {"agent.env": f"{tmp_path / 'envs.py'}:Colours", "reward.remote_url": None}
    run = cli(flags(ws, out, **over, **{"agent.max_turns": "2", "agent.max_response_tokens": "40",
                                        "data.prompt_max_len": "2048",
                                        "logger.log_samples": "2"}))
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all("tools/valid_call_rate" in r for r in steps)
    assert all(r["rollout/logprob_gap_max"] < 1e-4 for r in steps), steps
    per_sample = steps[0]["sample_tokens"] / 8
    assert per_sample > 400 if agent == "tools" else per_sample < 200  # the tool schemas joined the prompt
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["messages"][0]["content"][0] == {"type": "image"} for s in samples)
    if agent == "env":
        assert all("Try again." in s["response"] for s in samples)  # the observation after the first answer
    before, after = load_file(ws / "vlm" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("model.layers."))


@pytest.mark.parametrize("freeze", [True, False])
def test_lora_trains_only_the_adapters_and_merges_into_a_vlm_folder(ws, tmp_path, freeze):
    """--ds.lora.rank with a VLM: only adapter weights move, the tower holds adapters unless it is frozen,
    the rollout's logprobs are the trainer's (rollout/logprob_gap_max); `lora merge` of final/ and
    `export` of a checkpoint give HF folders with the processor whose model computes what the adapted
    policy does."""
    from transformers import AutoModelForImageTextToText

    from rlhfkit.api.export import export_checkpoint
    from rlhfkit.data.batch import collate
    from rlhfkit.models.logprobs import response_logprobs
    from rlhfkit.models.lora import merge_lora
    from rlhfkit.rollout.base import SamplingParams

    over = {"ds.lora.rank": "4", "ds.lora.alpha": "8", "actor.adam.lr": "5e-2", "algo.kl.init_coef": "0.01",
            "actor.freeze_visual_encoder": "true" if freeze else "false", "ckpt.save_steps": "2"}
    cfg = rlhfkit.RLConfig.from_args(flags(ws, tmp_path / "run", **over))
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=varied_reward)
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    assert any("lora_" in k and ".visual." in k for k in start) != freeze  # no adapters in a frozen tower
    metrics = trainer.train()
    moved = {k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, start[k])}
    assert moved and all("lora_" in k for k in moved), sorted(moved)[:5]
    assert metrics["rollout/logprob_gap_max"] < 1e-4
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "processor_config.json").is_file()
    prompt = trainer.loop.data.prompts[0]
    [traj] = trainer.loop.engine.generate([prompt.ids], SamplingParams(max_new_tokens=4), seeds=[1],
                                          vision=[prompt.vision])
    batch = collate([traj], trainer.loop.tokenizer.pad_token_id)
    with torch.no_grad():
        ours, _ = response_logprobs(trainer.policy, batch)
    for folder in (merge_lora(final, None, tmp_path / "merged"), export_checkpoint(tmp_path / "run", tmp_path / "x")):
        assert type(load_processor(str(folder))).__name__ == "Qwen2VLProcessor"
        with torch.no_grad():
            theirs, _ = response_logprobs(AutoModelForImageTextToText.from_pretrained(folder).eval(), batch)
        torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)


def test_gae_builds_the_critic_from_the_vlm_and_its_values_see_the_images(ws, tmp_path):
    """--algo.advantage.estimator gae with a VLM: the critic's backbone is the VLM's base model with its
    tower (frozen with the policy's under --actor.freeze_visual_encoder), its values of the same tokens
    change with the image, and two PPO steps train it (value_loss, critic weights moved)."""
    from rlhfkit.data.batch import collate
    from rlhfkit.data.images import VisionInputs
    from rlhfkit.rollout.base import SamplingParams

    over = {"algo.advantage.estimator": "gae", "critic.adam.lr": "1e-2", "actor.freeze_visual_encoder": "true"}
    cfg = rlhfkit.RLConfig.from_args(flags(ws, tmp_path / "run", **over))
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=varied_reward)
    critic = trainer.loop.update.critic
    assert type(critic.backbone).__name__ == "Qwen2VLModel"
    assert not any(p.requires_grad for p in critic.backbone.visual.parameters())
    start = {k: v.clone() for k, v in critic.state_dict().items()}
    prompt = trainer.loop.data.prompts[0]
    [traj] = trainer.loop.engine.generate([prompt.ids], SamplingParams(max_new_tokens=4), seeds=[1],
                                          vision=[prompt.vision])
    torch.nn.init.normal_(critic.value_head.weight)  # the zero head gives 0 whatever it sees
    values, pixels = [], prompt.vision.tensors["pixel_values"]
    for vision in (prompt.vision, VisionInputs({**prompt.vision.tensors, "pixel_values": -pixels}, 1)):
        traj.info["vision"] = vision  # the same tokens, the image's pixels or their negation
        with torch.no_grad():
            values.append(critic.response_values(collate([traj], trainer.loop.tokenizer.pad_token_id)))
    assert (values[0] - values[1]).abs().max() > 1e-4
    with torch.no_grad():
        critic.value_head.weight.zero_()
    metrics = trainer.train()
    assert "value_loss" in metrics and metrics["rollout/logprob_gap_max"] < 1e-4
    moved = [k for k, v in critic.state_dict().items() if not torch.equal(v, start[k])]
    assert any(k.startswith("backbone.language_model.") for k in moved)
    assert not any(k.startswith("backbone.visual.") for k in moved)


# An agent function that sends images the OpenAI way (image_url parts with data: URLs), one per call.
IMAGE_URL_AGENT = """import base64
import io

from PIL import Image

COLOURS = {"red": (230, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 230)}


def data_url(colour, size):
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def agent(client, prompt, label, **row):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(COLOURS[label], 56)}},
                                         {"type": "text", "text": prompt}]}]
    first = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": [{"type": "text", "text": "and this? "},
                                          {"type": "image_url", "image_url": {"url": data_url(COLOURS[label], 28)}}]}]
    second = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    return {"reward": float(len(second.choices[0].message.content) % 2), "extra_logs": {"images_sent": 2.0}}
"""


def test_cli_trains_an_agent_function_that_sends_image_url_parts(ws, tmp_path):
    (tmp_path / "eyes.py").write_text(IMAGE_URL_AGENT)
    names = list(COLOURS)
    (tmp_path / "ask.jsonl").write_text("".join(json.dumps({"prompt": QUESTION, "label": names[i % 3]}) + "\n"
                                                for i in range(8)))
    out = tmp_path / "run"
    run = cli(flags(ws, out, **{"reward.remote_url": None, "agent.func_path": str(tmp_path / "eyes.py"),
                                "data.prompt_dataset": str(tmp_path / "ask.jsonl"), "data.image_key": None,
                                "agent.max_response_tokens": "40", "data.max_images_per_prompt": "2"}))
    assert run.returncode == 0, run.stderr[-2000:]
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2], steps
    assert all(r["reward_extra/images_sent"] == 2.0 and r["endpoint/calls"] == 16.0 for r in steps), steps
    assert all(r.get("endpoint/splits", 0.0) == 0.0 and "agent/dropped_error" not in r for r in steps), steps
    before, after = load_file(ws / "vlm" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("model.layers."))
