"""Time per RL step and reward after N steps: one process vs Ray sync (N workers + trainer actor)
vs Ray async with a staleness bound of 1, of 2 with TIS correction, and of 1 with partial rollouts.

Runs `rlhfkit train rl` once per mode on the same data and flags and prints, per mode, the mean
`time/step` of the steps after the first (warm-up), the mean reward of the first and of the last
two steps, the total wall time (Ray start included), the largest `staleness_max` reached and the
share of samples whose tokens mix policy versions. The reward counts "7" characters (as the tests).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/ray_sync_vs_async.py --model smollm2 [--steps 4 --workers 2]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/ray_sync_vs_async.py --model tiny --steps 12 --lr 1e-2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rlhfkit.cli.main import main as cli
from rlhfkit.models import tiny_model_and_tokenizer

REWARD = ("def reward_func(queries, prompts, labels, **kw):\n"
          "    return [sum(c == '7' for c in q[len(p):]) / 8.0 for q, p in zip(queries, prompts)]\n")


def run(root: Path, name: str, model: str, args, extra: list[str]) -> dict:
    out = root / name
    argv = ["train", "rl", "--actor.model_name_or_path", model, "--data.prompt_dataset", str(root / "p.jsonl"),
            "--data.input_key", "q", "--reward.remote_url", str(root / "reward.py"),
            "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "4",
            "--rollout.max_new_tokens", str(args.max_new_tokens), "--train.batch_size", "32",
            "--train.micro_batch_size", "8", "--train.max_steps", str(args.steps), "--train.num_threads", "1",
            "--actor.adam.lr", str(args.lr), "--logger.progress_bar", "false", "--ckpt.output_dir", str(out), *extra]
    t0 = time.perf_counter()
    assert cli(argv) == 0
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    return {"mode": name, "step_s": mean(r["time/step"] for r in later), "wall_s": wall,
            "generate_s": mean(r.get("time/generate", 0.0) for r in later),
            "reward_first": rows[0]["reward"], "reward_last": mean(r["reward"] for r in rows[-2:]),
            "staleness_max": max(r["staleness_max"] for r in rows),
            "mixed": mean(r.get("async/mixed_version_frac", 0.0) for r in rows)}


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny, smollm2 or an HF folder")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--modes", default="local,ray_sync,async_k1,async_k2_tis,async_k1_partial",
                    help="comma-separated subset of the modes")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rb"))
    (root / "p.jsonl").write_text("".join(json.dumps({"q": f"What is {i}+{i % 7}?"}) + "\n" for i in range(64)))
    (root / "reward.py").write_text(REWARD)
    model = args.model
    if model == "tiny":
        m, tok = tiny_model_and_tokenizer(seed=0)
        m.save_pretrained(root / "tiny")
        tok.save_pretrained(root / "tiny")
        model = str(root / "tiny")
    ray = ["--distributed.backend", "ray", "--rollout.num_workers", str(args.workers)]
    k1 = [*ray, "--train.async_enable", "--train.max_staleness", "1"]
    modes = {"local": [], "ray_sync": ray, "async_k1": k1,
             "async_k2_tis": [*ray, "--train.async_enable", "--train.max_staleness", "2",
                              "--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type", "tis"],
             "async_k1_partial": [*k1, "--train.partial_rollout_enable", "--train.partial_rollout_tokens", "4"]}
    for name in args.modes.split(","):
        r = run(root, name, model, args, modes[name])
        print(f"{r['mode']:16s} time/step {r['step_s']:6.2f}s (generate {r['generate_s']:5.2f}s)  "
              f"reward {r['reward_first']:.3f} -> {r['reward_last']:.3f}  wall {r['wall_s']:6.1f}s  "
              f"staleness_max {r['staleness_max']:.0f}  mixed-version samples {r['mixed']:.2f}", flush=True)


if __name__ == "__main__":
    main()
