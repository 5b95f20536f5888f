"""A synthetic visual task: which colour is the image? (tests, docs/vision.md's learning run).

Each record is OpenRLHF's vision format: a user message with one image placeholder and the
question, the image's file name (in an `images/` folder beside the jsonl files), and the colour's
name as the label. Images are squares of one of COLOURS, each channel shifted by up to 30 per image,
28 to 56 pixels a side, drawn from a fixed seed; train and test are drawn from different seeds.

`python -m rlhfkit.data.synthetic_vision OUT [--train N] [--test N] [--seed S]` writes
OUT/train.jsonl, OUT/test.jsonl, OUT/images/*.png, OUT/format.jsonl (the training images, each
labelled with a colour drawn at random: a supervised warm start on it teaches the answer format,
not the task), OUT/pairs.jsonl and OUT/test_pairs.jsonl (preference pairs for `train rm` and `train dpo`: two
per train or test record, `chosen` the image's colour and `rejected` each of the other two, so that a scorer
blind to the images ranks at most half of them right: each colour word is as often rejected as chosen)
and OUT/reward.py (reward 1 when the response starts with the label, OpenRLHF's reward_func contract).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (40, 60, 220)}
QUESTION = "Which colour is this? Answer red, green or blue."

REWARD = '''import torch


def reward_func(queries, prompts, labels, **kwargs):
    """1 when the response (the query after its prompt) starts with the label's colour, else 0."""
    out = []
    for query, prompt, label in zip(queries, prompts, labels):
        response = query[len(prompt):].strip().lower()
        out.append(1.0 if response.startswith(str(label)) else 0.0)
    return torch.tensor(out)
'''


def colour_records(n: int, seed: int, prefix: str) -> list[tuple[dict, tuple[int, int, int], int]]:
    """(record, RGB, side) of n images; the colours cycle so each split is balanced."""
    rng = random.Random(seed)
    names = list(COLOURS)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        rgb = tuple(max(0, min(255, c + rng.randint(-30, 30))) for c in COLOURS[name])
        record = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
                  "images": [f"images/{prefix}{i:04d}.png"], "label": name}
        out.append((record, rgb, rng.randint(28, 56)))
    rng.shuffle(out)
    return out


def write_colour_task(out: str | Path, n_train: int = 240, n_test: int = 60, seed: int = 0) -> Path:
    """Write the task's files into folder `out` (module docstring); returns it."""
    from PIL import Image

    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    for split, n, offset in (("train", n_train, 0), ("test", n_test, 1)):
        rows = colour_records(n, seed * 2 + offset, split)
        for record, rgb, side in rows:
            Image.new("RGB", (side, side), rgb).save(out / record["images"][0])
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r, _, _ in rows))
        pairs = [dict(r, chosen=r["label"], rejected=other) for r, _, _ in rows for other in COLOURS
                 if other != r["label"]]
        (out / ("pairs.jsonl" if split == "train" else "test_pairs.jsonl")).write_text(
            "".join(json.dumps(p) + "\n" for p in pairs))
        if split == "train":  # the answer format without the task: each image with a colour drawn at random
            rng = random.Random(seed + 7)
            fmt = [dict(r, label=rng.choice(list(COLOURS))) for r, _, _ in rows]
            (out / "format.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fmt))
    (out / "reward.py").write_text(REWARD)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--train", type=int, default=240)
    parser.add_argument("--test", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_colour_task(args.out, args.train, args.test, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
