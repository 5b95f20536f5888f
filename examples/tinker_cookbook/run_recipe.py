"""Run a tinker-cookbook recipe unchanged against `rlhfkit serve-training`, with the datasets it would
fetch from the Hugging Face Hub read from local files instead.

    python examples/tinker_cookbook/run_recipe.py --write-data data/
    python examples/tinker_cookbook/run_recipe.py tinker_cookbook.recipes.sl_loop \\
        --data HuggingFaceH4/no_robots=data/chat.jsonl \\
        base_url=http://127.0.0.1:8000 model_name=Qwen/Qwen3-8B-Base batch_size=8 max_steps=10

Everything after the recipe's module and the `--data` pairs is the recipe's own `key=value`
configuration (chz), passed as it is. `--data HUB_ID=FILE` makes `datasets.load_dataset(HUB_ID, ...)`
return `{"train": FILE}` (json / jsonl / parquet / csv); any other dataset loads as usual.
`--write-data DIR` writes two small local files in the formats the minimal recipes read:
`chat.jsonl` (no_robots' `messages`: two-digit sums answered in `\boxed{}`, a warm start for
`rl_loop`) and `arithmetic.jsonl` (GSM8K's `question` / `answer` with `#### N`: one-digit sums).
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
from pathlib import Path

# rl_loop's question suffix, so that chat.jsonl is a warm start for it
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."


def write_data(folder: Path, rows: int = 256, seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with open(folder / "chat.jsonl", "w") as f:
        for _ in range(rows):
            a, b = rng.randint(10, 49), rng.randint(10, 49)
            messages = [{"role": "user", "content": f"What is {a} + {b}?{SUFFIX}"},
                        {"role": "assistant", "content": f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}"}]
            f.write(json.dumps({"messages": messages}) + "\n")
    with open(folder / "arithmetic.jsonl", "w") as f:
        for _ in range(rows):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            f.write(json.dumps({"question": f"What is {a} + {b}?",
                                "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"}) + "\n")


def redirect_hub_datasets(pairs: dict[str, str]) -> None:
    import datasets

    original = datasets.load_dataset
    kinds = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

    def load_dataset(path, *args, **kwargs):
        if path not in pairs:
            return original(path, *args, **kwargs)
        local = Path(pairs[path])
        if local.suffix not in kinds:
            raise SystemExit(f"--data {path}={local}: use a .json, .jsonl, .parquet or .csv file")
        return original(kinds[local.suffix], data_files={"train": str(local)})

    datasets.load_dataset = load_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", help="the recipe's module, e.g. tinker_cookbook.recipes.sl_loop")
    parser.add_argument("--data", action="append", default=[], metavar="HUB_ID=FILE")
    parser.add_argument("--write-data", type=Path, metavar="DIR")
    args, recipe_args = parser.parse_known_args(argv)
    if args.write_data:
        write_data(args.write_data)
        print(f"wrote {args.write_data}/chat.jsonl and {args.write_data}/arithmetic.jsonl")
        if not args.recipe:
            return
    if not args.recipe:
        parser.error("name the recipe's module (or give --write-data DIR)")
    pairs = {}
    for item in args.data:
        hub_id, sep, file = item.partition("=")
        if not sep or not Path(file).is_file():
            parser.error(f"--data {item!r}: give HUB_ID=FILE with an existing file")
        pairs[hub_id] = file
    redirect_hub_datasets(pairs)
    import chz

    module = importlib.import_module(args.recipe)
    sys.argv = [args.recipe, *recipe_args]
    chz.nested_entrypoint(module.main)


if __name__ == "__main__":
    main()
