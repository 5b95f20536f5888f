"""`rlhfkit eval` with a vision-language policy (a tiny random Qwen2-VL, sharpened): a plain image dataset (prompts
with images, a verifier), an agent function that sends the row's image as an image_url part, and an agent
file with its own execute() that shows the prompt's image and a screenshot. The
same prompts with red or with blue images give other answers at the same seeds: the images reach the
engine (a text-only evaluation would answer both alike)."""

import json
import os
from pathlib import Path

import pytest
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rlhfkit.cli.main import main  # noqa: E402

RED, BLUE = (220, 40, 40), (40, 60, 220)
QUESTION = "Which colour is this? Answer red, green or blue."

STARTS_WITH_LABEL = """import torch


def reward_func(queries, prompts, labels, **kwargs):
    return torch.tensor([float(q[len(p):].strip().startswith(l)) for q, p, l in zip(queries, prompts, labels)])
"""

IMAGE_URL_AGENT = """import base64, io
from PIL import Image


def data_url(path):
    buf = io.BytesIO()
    Image.open(path).convert("RGB").save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def agent(client, prompt, label, **row):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(row["picture"])}},
                                             {"type": "text", "text": prompt}]}]
    reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    text = reply.choices[0].message.content
    return {"reward": float(text.strip().startswith(label)), "extra_logs": {"chars": float(len(text))}}
"""


@pytest.fixture(scope="module")
def ws(tmp_path_factory, sharp_vlm):
    root = tmp_path_factory.mktemp("vision_eval")
    model, processor = sharp_vlm()  # its samples follow its images
    model.save_pretrained(root / "vlm")
    processor.save_pretrained(root / "vlm")
    for name, colour in (("red", RED), ("blue", BLUE)):
        Image.new("RGB", (40, 40), colour).save(root / f"{name}.png")
        # one dataset per colour: the same prompts and labels, only the images differ
        rows = [{"prompt": QUESTION, "label": "red", "images": [f"{name}.png"], "picture": str(root / f"{name}.png")}
                for _ in range(4)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "verifier.py").write_text(STARTS_WITH_LABEL)
    (root / "agent.py").write_text(IMAGE_URL_AGENT)
    return root


def evaluate(ws, out, colour, **over):
    f = {"actor.model_name_or_path": ws / "vlm", "eval.dataset": ws / f"{colour}.jsonl", "data.input_key": "prompt",
         "data.label_key": "label", "eval.n_samples": 2, "eval.temperature": 1.0, "eval.k": "1,2",
         "rollout.max_new_tokens": 6, "actor.autocast": "none", "train.num_threads": 1, "ckpt.output_dir": out}
    f.update(over)
    assert main(["eval", *[str(x) for k, v in f.items() if v is not None for x in (f"--{k}", v)]]) == 0
    result = json.loads((out / "eval.json").read_text())
    return result, [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]


def test_eval_of_a_plain_image_dataset_with_a_verifier_sees_the_images(ws, tmp_path):
    runs = {c: evaluate(ws, tmp_path / c, c, **{"eval.verifier": ws / "verifier.py"}) for c in ("red", "blue")}
    for result, rows in runs.values():
        assert result["prompts"] == 4 and len(rows) == 8 and {"eval/pass@1", "eval/pass@2"} <= set(result["metrics"])
        assert all("<|image_pad|>" in r["prompt"] and r["label"] == "red" and "correct" in r for r in rows)
    red, blue = ([r["response"] for r in rows] for _, rows in runs.values())
    assert red != blue  # the same seeds: only the images differ


def test_eval_of_an_agent_function_that_sends_image_url_parts(ws, tmp_path):
    runs = {c: evaluate(ws, tmp_path / c, c, **{"agent.func_path": ws / "agent.py"})
            for c in ("red", "blue")}
    for result, rows in runs.values():
        m = result["metrics"]
        assert result["prompts"] == 4 and len(rows) == 8 and m["eval/dropped"] == 0.0
        assert m["eval/reward"] == pytest.approx(sum(r["reward"] for r in rows) / 8)
        assert m["eval/chars"] == pytest.approx(sum(r["extra_logs"]["chars"] for r in rows) / 8)
    red, blue = ([r["response"] for r in rows] for _, rows in runs.values())
    assert red != blue


def test_eval_of_an_agent_file_with_its_own_execute_and_images(ws, tmp_path):
    """OpenRLHF 2026's form (tests/fixtures): the prompt's image and a screenshot, two calls per episode."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "openrlhf_vlm_execute_agent.py"
    over = {"agent.func_path": fixture, "agent.max_turns": 2, "agent.max_response_tokens": 80,
            "data.max_images_per_prompt": 2}
    runs = {c: evaluate(ws, tmp_path / c, c, **over) for c in ("red", "blue")}
    for result, rows in runs.values():
        m = result["metrics"]
        assert len(rows) == 8 and m["eval/turns"] == 2.0 and "eval/pass@1" in m  # the agent's score decides
    red, blue = ([r["response"] for r in rows] for _, rows in runs.values())
    assert red != blue
