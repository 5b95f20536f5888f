"""rlhfkit vs TRL's GRPOTrainer, side by side in one invocation, on SmolLM2-135M-Instruct.

Same model, task (the demo's arithmetic), prompts, group size, max new tokens, temperature,
learning rate, loss aggregation (token mean over the step: TRL's `dapo` = our `token_mean`),
group-normalised advantages, no KL, bf16 autocast, one optimizer step per 16 x 8 rollout, and
number of steps. Each framework runs in its own subprocess so peak RSS is its own.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/grpo_vs_trl.py --steps 10

Prints per framework: step time (median, min, max), samples/s, peak RSS, mean reward of the last
3 steps; rlhfkit also reports rollout tokens/s and training tokens/s, and the model FLOPs
utilisation of training against fp32 and bf16 matmul throughput measured in the same run.
TRL needs the `bench` extra: pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PROMPTS, GROUP, MAX_NEW, LR, TEMP = 16, 8, 12, 3e-5, 0.7


def _records(n: int):
    from rlhfkit.data.synthetic import arithmetic_problems

    train, _ = arithmetic_problems(n, 0, seed=0)
    return train


def _question(r: dict) -> str:
    from rlhfkit.cli.demo import INSTRUCTION

    return INSTRUCTION.format(question=r["input"])


# rlhfkit variants: the extra flags of each (on top of the demo's, minus its DAPO filtering)
RLHFKIT_VARIANTS = {
    "rlhfkit": [],
    "rlhfkit-padded": ["--train.shared_prefix_enable", "false"],  # one prompt copy per sample (the old layout)
    "rlhfkit+filter": ["--algo.dynamic_filtering_enable", "true"],
    # bf16 parameters with float32 masters: not in the default run (learns slower at this lr: RMSNorm weights
    # near 1.0 move in bf16 steps of 2^-8; docs/performance.md)
    "rlhfkit-bf16": ["--actor.dtype", "bfloat16"],
    "rlhfkit+compile": ["--train.compile_enable", "true"],  # decoder layers under torch.compile in the update
}
DEFAULT_RUN = ["rlhfkit", "rlhfkit-padded", "rlhfkit+filter", "trl"]


def run_rlhfkit(steps: int, which: str) -> dict:
    import rlhfkit
    from rlhfkit.cli.demo import DEMO_FLAGS, chat_examples, first_number_reward

    flags = DEMO_FLAGS + ["--train.max_steps", str(steps), "--ckpt.output_dir", f"runs/bench_{which}",
                          "--logger.progress_bar", "false", "--algo.dynamic_filtering_enable", "false",
                          *RLHFKIT_VARIANTS[which]]
    cfg = rlhfkit.RLConfig.from_args(flags)
    records = _records(PROMPTS * steps)
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=first_number_reward,
                                            train_dataset=lambda tok: chat_examples(records, tok))
    history = trainer.loop.train()
    trainer.tracker.close()
    head = trainer.policy.get_output_embeddings().weight.numel()
    update_s = max(sum(m.get("time/update", 0.0) for m in history), 1e-9)
    total = {k: sum(m.get(k, 0.0) for m in history) for k in ("train_tokens", "sample_tokens", "response_tokens")}
    # Training FLOPs: 6 x (parameters besides the LM head) per token the forward/backward ran on,
    # plus 6 x LM-head parameters per response token (the head runs only there); attention ignored.
    body = sum(p.numel() for p in trainer.policy.parameters()) - head
    flops = 6 * body * total["train_tokens"] + 6 * head * total["response_tokens"]
    return {
        "step_times": [m["time/step"] for m in history],
        "rewards": [m["reward"] for m in history],
        "rollout_tok_s": statistics.median(m["rollout_tokens_per_s"] for m in history),
        "train_tok_s": total["train_tokens"] / update_s,
        "sample_tok_s": total["sample_tokens"] / update_s,
        "train_gflops": flops / update_s / 1e9,
        "update_s": statistics.median(m.get("time/update", 0.0) for m in history),
        "generate_s": statistics.median(m.get("time/generate", 0.0) for m in history),
    }


def run_trl(steps: int) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhfkit.models import materialize_smollm2
    from rlhfkit.rewards.math import math_exact_reward

    records = _records(PROMPTS * steps)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": _question(r)}], "label": r["label"]}
                            for r in records])

    def reward(completions, label, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return math_exact_reward(texts, label, mode="first_integer").rewards.tolist()

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(
        output_dir="runs/bench_trl", max_steps=steps, learning_rate=LR, lr_scheduler_type="constant",
        per_device_train_batch_size=32, gradient_accumulation_steps=PROMPTS * GROUP // 32,
        num_generations=GROUP, max_completion_length=MAX_NEW, temperature=TEMP, beta=0.0, loss_type="dapo",
        scale_rewards="group", bf16=True, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
        seed=42, warmup_steps=0, max_grad_norm=1.0, adam_beta2=0.95, weight_decay=0.0, disable_dropout=True,
    )
    trainer = GRPOTrainer(model=str(materialize_smollm2()), reward_funcs=reward, args=args, train_dataset=ds,
                          callbacks=[Timer()])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_times": times, "rewards": rewards}


def matmul_gflops(dtype_name: str, n: int = 1024, reps: int = 20) -> float:
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def child(which: str, steps: int) -> None:
    out = run_trl(steps) if which == "trl" else run_rlhfkit(steps, which)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("BENCH_RESULT " + json.dumps(out), flush=True)


def spawn(which: str, steps: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", which, "--steps", str(steps)], env=env,
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{which} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].split(" ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--child", choices=[*RLHFKIT_VARIANTS, "trl"])
    ap.add_argument("--only", default=",".join(DEFAULT_RUN), help=f"any of {', '.join([*RLHFKIT_VARIANTS, 'trl'])}")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.steps)
        return
    results = {w: spawn(w, a.steps) for w in a.only.split(",")}
    flops = {d: matmul_gflops(d) for d in ("fp32", "bf16")}
    print(f"\n{a.steps} steps of {PROMPTS} prompts x {GROUP} samples, {MAX_NEW} new tokens, lr {LR}, T {TEMP}")
    print(f"{'':16}{'step median':>12}{'min':>8}{'max':>8}{'samples/s':>11}{'peak RSS MB':>13}{'reward(last3)':>15}")
    for w, r in results.items():
        t = r["step_times"]
        print(f"{w:16}{statistics.median(t):12.2f}{min(t):8.2f}{max(t):8.2f}{PROMPTS * GROUP / statistics.median(t):11.1f}"
              f"{r['peak_rss_mb']:13.0f}{statistics.mean(r['rewards'][-3:]):15.3f}")
    if "trl" in results:
        for w in results:
            if w != "trl":
                speed = statistics.median(results["trl"]["step_times"]) / statistics.median(results[w]["step_times"])
                mem = results[w]["peak_rss_mb"] / results["trl"]["peak_rss_mb"]
                print(f"{w}/TRL: {speed:.2f}x faster per step, {mem:.2f}x the peak memory")
    for w, r in results.items():
        if "train_tok_s" in r:
            achieved = r["train_gflops"]
            print(f"{w}: median generate {r['generate_s']:.2f} s, update {r['update_s']:.2f} s; rollout "
                  f"{r['rollout_tok_s']:.0f} tok/s; training {r['train_tok_s']:.0f} computed tok/s "
                  f"({r['sample_tok_s']:.0f} prompt+response tok/s per sample) = {achieved:.1f} GFLOP/s = "
                  f"{achieved / flops['fp32']:.0%} of fp32 matmul ({flops['fp32']:.0f} GFLOP/s), "
                  f"{achieved / flops['bf16']:.0%} of bf16 ({flops['bf16']:.0f})")


if __name__ == "__main__":
    main()
