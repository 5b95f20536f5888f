"""Write train and held-out sums for `openai_addition_agent.py`: disjoint problems, one JSON row a line.

    python examples/agents/make_addition_data.py runs/addition --train 2000 --heldout 64

writes runs/addition/train.jsonl and runs/addition/heldout.jsonl with rows
{"prompt": "What is 12 + 28?", "label": "40"} (a, b in 1..50, drawn from a fixed seed; no problem is in
both files). Train and evaluate with --data.input_key prompt --data.label_key label.
"""

import argparse
import json
from pathlib import Path

from rlhfkit.data.synthetic import arithmetic_problems


def write_splits(out_dir: Path, n_train: int, n_heldout: int, seed: int = 0) -> tuple[Path, Path]:
    """The two files, their problems disjoint (the same draw as `rlhfkit demo`'s splits for the same seed)."""
    train, heldout = arithmetic_problems(n_train, n_heldout, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.jsonl", out_dir / "heldout.jsonl"
    for path, records in zip(paths, (train, heldout)):
        path.write_text("".join(json.dumps({"prompt": r["input"], "label": r["label"]}) + "\n" for r in records))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train", type=int, default=2000, help="training problems (default 2000)")
    parser.add_argument("--heldout", type=int, default=64, help="held-out problems (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in write_splits(args.out_dir, args.train, args.heldout, args.seed):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
