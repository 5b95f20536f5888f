"""The first optimizer step of a model loaded from safetensors: trained parameters copied into memory of
their own (`models.host.own_memory`, what the learner does) vs left in the checkpoint's file mapping.

transformers' `from_pretrained` on a CPU hands out views of the mapped checkpoint file; AdamW writing
them in place copies every page out of the file at the first step. Each run is a fresh process: load
SmolLM2-135M-Instruct in float32, build the learner (with or without the copy), one forward and backward
under bf16 autocast, then time the learner's construction and its first two steps. The two variants
alternate; prints each run and the ratio of (construction + first step) medians.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/first_step.py [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def one_run(copy: bool, threads: int) -> dict:
    import resource

    import torch
    from transformers import AutoModelForCausalLM

    from rlhfkit.models import host, materialize_smollm2
    from rlhfkit.trainers import learner as learner_module

    host.apply_host_settings(threads, keep_freed=True)
    if not copy:
        learner_module.own_memory = lambda params: 0
    model = AutoModelForCausalLM.from_pretrained(materialize_smollm2(), dtype=torch.float32)
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # noqa: E731
    t = time.perf_counter()
    learner = learner_module.Learner(model, lr=1e-5)
    build_s = time.perf_counter() - t
    ids = torch.randint(0, 1000, (4, 109), generator=torch.Generator().manual_seed(0))
    steps = []
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids).logits[:, -1].float().logsumexp(-1).mean()
        learner.backward(loss)
        f, t = faults(), time.perf_counter()
        learner.step()
        steps.append((time.perf_counter() - t, faults() - f))
    return {"build_s": build_s, "step_s": [s for s, _ in steps], "faults": [n for _, n in steps]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=("copy", "mapped"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(args.child == "copy", args.threads)))
        return
    runs: dict[str, list[dict]] = {"copy": [], "mapped": []}
    for _ in range(args.repeats):
        for which in runs:
            out = subprocess.run([sys.executable, __file__, "--child", which, "--threads", str(args.threads)],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[which].append(r)
            print(f"{which:7s} learner built in {r['build_s']:.3f} s; step 1 {r['step_s'][0]:.3f} s "
                  f"({r['faults'][0]} page faults), step 2 {r['step_s'][1]:.3f} s ({r['faults'][1]})", flush=True)
    first = {k: statistics.median(r["build_s"] + r["step_s"][0] for r in v) for k, v in runs.items()}
    print(f"built + first step, median: copied {first['copy']:.3f} s, mapped {first['mapped']:.3f} s: "
          f"{first['mapped'] / first['copy']:.2f}x faster with the copy")


if __name__ == "__main__":
    main()
