"""rlhfkit vs TRL's GRPOTrainer, side by side in one invocation, on SmolLM2-135M-Instruct.

Same model, task (the demo's arithmetic), prompts, group size, max new tokens, temperature,
learning rate, loss aggregation (token mean over the step: TRL's `dapo` = our `token_mean`),
group-normalised advantages, no KL, compute dtype, one optimizer step per rollout, and number of
steps. Each framework runs in its own subprocess so peak RSS is its own.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/grpo_vs_trl.py --steps 10
    HF_HUB_OFFLINE=1 .venv/bin/python bench/grpo_vs_trl.py --size small,demo,large --dtype fp32,bf16 --steps 5
    HF_HUB_OFFLINE=1 .venv/bin/python bench/grpo_vs_trl.py --lengths 32,128,512 --steps 3 --only rlhfkit

Sizes (prompts x samples, new tokens): small 4 x 4, 16 (a first quick experiment); demo 16 x 8, 12
(the demo's); large 32 x 16, 64. Dtypes: fp32 (no autocast on either side) and bf16 (autocast on
both). Every (size, dtype) runs each framework; a row per framework and setting.

Prints per framework and setting: step time (median, min, max), samples/s, peak RSS, mean reward of
the last 3 steps; rlhfkit also its step per stage (generate, reward, experience, update, other =
the rest: sync, metrics, logs), rollout tokens/s and the update's model FLOPs utilisation against
fp32 and bf16 matmul throughput measured in the same run (over all steps, and the median step after the
first, which alone also allocates the optimizer's moments). `--lengths` adds the length rows:
rlhfkit at 4 x 4 with a prompt asking for a step-by-step explanation and each max new tokens,
the last step's update seconds per response token and rollout tokens/s.
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
from dataclasses import asdict, dataclass

LR, TEMP = 3e-5, 0.7
SIZES = {"small": (4, 4, 16), "demo": (16, 8, 12), "large": (32, 16, 64)}  # prompts, samples, new tokens
STAGES = ("generate", "reward", "experience", "update")
EXPLAIN = "{question} Explain step by step, then give the number."  # the length rows' prompt


@dataclass(frozen=True)
class Setting:
    """One bench setting: `prompts` x `samples` per step, `max_new` tokens, `dtype` fp32 or bf16,
    `explain`: the step-by-step prompt (long answers) instead of the demo's."""

    prompts: int
    samples: int
    max_new: int
    dtype: str
    explain: bool = False

    @property
    def batch(self) -> int:
        return self.prompts * self.samples

    @property
    def micro(self) -> int:
        return min(32, self.batch)

    def label(self) -> str:
        kind = "explain" if self.explain else "arith"
        return f"{self.prompts}x{self.samples} {self.max_new}tok {self.dtype} {kind}"


def _records(n: int):
    from rlhfkit.data.synthetic import arithmetic_problems

    train, _ = arithmetic_problems(n, 0, seed=0)
    return train


def _question(r: dict, s: Setting) -> str:
    from rlhfkit.cli.demo import INSTRUCTION

    return (EXPLAIN if s.explain else INSTRUCTION).format(question=r["input"])


def _examples(records: list[dict], s: Setting, tokenizer):
    from rlhfkit.data.prompts import PromptExample

    texts = [tokenizer.apply_chat_template([{"role": "user", "content": _question(r, s)}], tokenize=False,
                                           add_generation_prompt=True) for r in records]
    return [PromptExample(text=t, label=r["label"], raw=r, index=i) for i, (t, r) in enumerate(zip(texts, records))]


# rlhfkit variants: the extra flags of each (on top of the demo's, minus its DAPO filtering)
RLHFKIT_VARIANTS = {
    "rlhfkit": [],
    "rlhfkit-padded": ["--train.shared_prefix_enable", "false"],  # one prompt copy per sample (the old layout)
    "rlhfkit+filter": ["--algo.dynamic_filtering_enable", "true"],
    # bf16 matrices with float32 masters (norms and the residual stream float32 under bf16 autocast)
    "rlhfkit-bf16": ["--actor.dtype", "bfloat16"],
    # the same with micro-batches cut by 2,048 tokens instead of 32 samples (larger matmuls for bf16)
    "rlhfkit-bf16+tokens": ["--actor.dtype", "bfloat16", "--train.dynamic_batch_enable", "true",
                            "--train.max_tokens_per_micro_batch", "2048"],
    "rlhfkit+compile": ["--train.compile_enable", "true"],  # decoder layers under torch.compile in the update
    "rlhfkit-nokeep": ["--train.keep_freed_memory", "false"],  # freed memory handed back to the OS (glibc's default)
}
DEFAULT_RUN = ["rlhfkit", "rlhfkit-padded", "rlhfkit+filter", "trl"]


def rlhfkit_flags(steps: int, which: str, s: Setting) -> list[str]:
    from rlhfkit.cli.demo import DEMO_FLAGS

    return DEMO_FLAGS + [
        "--train.max_steps", str(steps), "--ckpt.output_dir", f"runs/bench_{which}", "--logger.progress_bar", "false",
        "--algo.dynamic_filtering_enable", "false", "--rollout.batch_size", str(s.prompts),
        "--rollout.n_samples_per_prompt", str(s.samples), "--rollout.max_new_tokens", str(s.max_new),
        "--train.batch_size", str(s.batch), "--train.micro_batch_size", str(s.micro),
        "--actor.autocast", "bfloat16" if s.dtype == "bf16" else "none",
        *([] if s.dtype == "bf16" else ["--actor.dtype", "float32"]),  # fp32: float32 parameters, no autocast
        *(RLHFKIT_VARIANTS[which] if s.dtype == "bf16" or "dtype" not in " ".join(RLHFKIT_VARIANTS[which]) else [])]


def run_rlhfkit(steps: int, which: str, s: Setting) -> dict:
    import rlhfkit
    from rlhfkit.cli.demo import first_number_reward

    cfg = rlhfkit.RLConfig.from_args(rlhfkit_flags(steps, which, s))
    records = _records(s.prompts * steps)
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=first_number_reward,
                                            train_dataset=lambda tok: _examples(records, s, tok))
    history = trainer.loop.train()
    trainer.tracker.close()
    head = trainer.policy.get_output_embeddings().weight.numel()
    update_s = max(sum(m.get("time/update", 0.0) for m in history), 1e-9)
    total = {k: sum(m.get(k, 0.0) for m in history) for k in ("train_tokens", "sample_tokens", "response_tokens")}
    # Training FLOPs: 6 x (parameters besides the LM head) per token the forward/backward ran on,
    # plus 6 x LM-head parameters per response token (the head runs only there); attention ignored.
    body = sum(p.numel() for p in trainer.policy.parameters()) - head
    step_flops = [6 * body * m.get("train_tokens", 0.0) + 6 * head * m.get("response_tokens", 0.0) for m in history]
    flops = sum(step_flops)
    # per step, the median over the steps after the first (which alone also allocates the Adam moments)
    step_gflops = [f / max(m.get("time/update", 0.0), 1e-9) / 1e9 for f, m in zip(step_flops, history, strict=True)]
    stages = {k: statistics.median(m.get(f"time/{k}", 0.0) for m in history) for k in STAGES}
    steps_s = [m["time/step"] for m in history]
    stages["other"] = statistics.median(
        m["time/step"] - sum(m.get(f"time/{k}", 0.0) for k in STAGES) for m in history)
    last = history[-1]
    return {
        "step_times": steps_s,
        "rewards": [m["reward"] for m in history],
        "rollout_tok_s": statistics.median(m["rollout_tokens_per_s"] for m in history),
        # |rollout - trainer| logprob gap per token (each step's mean), the mean over the steps
        "logprob_gap": statistics.mean(m.get("rollout/logprob_gap_mean", float("nan")) for m in history),
        "train_tok_s": total["train_tokens"] / update_s,
        "sample_tok_s": total["sample_tokens"] / update_s,
        "train_gflops": flops / update_s / 1e9,
        "train_gflops_later": statistics.median(step_gflops[1:] or step_gflops),
        "stages": stages,
        "last": {"step": last["time/step"], "generate": last.get("time/generate", 0.0),
                 "update": last.get("time/update", 0.0), "response_tokens": last.get("response_tokens", 0.0),
                 "response_length": last.get("response_length", 0.0), "rollout_tok_s": last["rollout_tokens_per_s"]},
    }


def run_trl(steps: int, s: Setting) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhfkit.models import materialize_smollm2
    from rlhfkit.rewards.math import math_exact_reward

    records = _records(s.prompts * steps)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": _question(r, s)}], "label": r["label"]}
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
        per_device_train_batch_size=s.micro, gradient_accumulation_steps=s.batch // s.micro,
        num_generations=s.samples, max_completion_length=s.max_new, temperature=TEMP, beta=0.0, loss_type="dapo",
        scale_rewards="group", bf16=s.dtype == "bf16", use_cpu=True, report_to="none", logging_steps=1,
        save_strategy="no", seed=42, warmup_steps=0, max_grad_norm=1.0, adam_beta2=0.95, weight_decay=0.0,
        disable_dropout=True,
        gradient_checkpointing=False,  # TRL's GRPO turns it on by default; rlhfkit's run has it off
    )
    trainer = GRPOTrainer(model=str(materialize_smollm2()), reward_funcs=reward, args=args, train_dataset=ds,
                          callbacks=[Timer()])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_times": times, "rewards": rewards}


def matmul_gflops(dtype_name: str, n: int = 1024, seconds: float = 0.3, rounds: int = 3) -> float:
    """A 1024^2 matmul's GFLOP/s in `dtype_name` (fp32, bf16): the best of `rounds` timed loops of about
    `seconds` each (a CPU without native bf16 runs a bf16 matmul ~100x slower: a loop then holds one)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = 0.0
    for _ in range(rounds):
        reps, t0 = 0, time.perf_counter()
        while reps == 0 or time.perf_counter() - t0 < seconds:
            a @ b
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def child(which: str, steps: int, s: Setting) -> None:
    out = run_trl(steps, s) if which == "trl" else run_rlhfkit(steps, which, s)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("BENCH_RESULT " + json.dumps(out), flush=True)


def spawn(which: str, steps: int, s: Setting) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", which, "--steps", str(steps),
                           "--setting", json.dumps(asdict(s))], env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{which} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].split(" ", 1)[1])


def report(s: Setting, results: dict[str, dict], flops: dict[str, float]) -> None:
    """The rows of one setting: each framework's step, then each rlhfkit variant against TRL and per stage."""
    print(f"\n{s.label()}: {s.batch} samples per step, lr {LR}, T {TEMP}")
    print(f"{'':16}{'step median':>12}{'min':>8}{'max':>8}{'samples/s':>11}{'peak RSS MB':>13}{'reward(last3)':>15}")
    for w, r in results.items():
        t = r["step_times"]
        print(f"{w:16}{statistics.median(t):12.2f}{min(t):8.2f}{max(t):8.2f}{s.batch / statistics.median(t):11.1f}"
              f"{r['peak_rss_mb']:13.0f}{statistics.mean(r['rewards'][-3:]):15.3f}")
    for w, r in results.items():
        if "stages" not in r:
            continue
        if "trl" in results:
            speed = statistics.median(results["trl"]["step_times"]) / statistics.median(r["step_times"])
            mem = r["peak_rss_mb"] / results["trl"]["peak_rss_mb"]
            print(f"{w}/TRL: {speed:.2f}x faster per step, {mem:.2f}x the peak memory")
        stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
        achieved = r["train_gflops"]
        print(f"{w}: median s per stage: {stages}; rollout {r['rollout_tok_s']:.0f} tok/s, logprob gap to the "
              f"trainer {r.get('logprob_gap', float('nan')):.5f} per token; update "
              f"{r['train_tok_s']:.0f} computed tok/s ({r['sample_tok_s']:.0f} prompt+response tok/s per sample) = "
              f"{achieved:.1f} GFLOP/s = {achieved / flops['fp32']:.0%} of fp32 matmul ({flops['fp32']:.0f} GFLOP/s), "
              f"{achieved / flops['bf16']:.0%} of bf16 ({flops['bf16']:.1f}); median step after the first "
              f"{r['train_gflops_later']:.1f} GFLOP/s = {r['train_gflops_later'] / flops['bf16']:.0%} of bf16")


def length_rows(lengths: list[int], dtype: str, steps: int) -> None:
    """rlhfkit at 4 x 4 with the step-by-step prompt at each max new tokens: the last step's cost."""
    rows = {n: spawn("rlhfkit", steps, Setting(4, 4, n, dtype, explain=True))["last"] for n in lengths}
    print(f"\nlength rows: 4 prompts x 4 samples, step-by-step prompt, {dtype}, last of {steps} steps")
    print(f"{'max new':>8}{'mean len':>10}{'step s':>8}{'generate s':>12}{'update s':>10}"
          f"{'update ms/resp tok':>20}{'rollout tok/s':>15}")
    for n, r in rows.items():
        per_tok = 1000 * r["update"] / max(r["response_tokens"], 1)
        print(f"{n:8d}{r['response_length']:10.0f}{r['step']:8.2f}{r['generate']:12.2f}{r['update']:10.2f}"
              f"{per_tok:20.2f}{r['rollout_tok_s']:15.0f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--size", help=f"comma-separated: {', '.join(SIZES)} (default demo; none with --lengths)")
    ap.add_argument("--dtype", default="bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--lengths", default="", help="max new tokens of the length rows, e.g. 32,128,512 (rlhfkit only)")
    ap.add_argument("--only", default=",".join(DEFAULT_RUN), help=f"any of {', '.join([*RLHFKIT_VARIANTS, 'trl'])}")
    ap.add_argument("--child", choices=[*RLHFKIT_VARIANTS, "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.steps, Setting(**json.loads(a.setting)))
        return
    dtypes = a.dtype.split(",")
    sizes = (a.size or ("" if a.lengths else "demo")).split(",")
    settings = [Setting(*SIZES[size], dtype) for size in sizes if size for dtype in dtypes]
    results = {s: {w: spawn(w, a.steps, s) for w in a.only.split(",")} for s in settings}
    flops = {d: matmul_gflops(d) for d in ("fp32", "bf16")}
    for s, r in results.items():
        report(s, r, flops)
    for dtype in dtypes if a.lengths else ():
        length_rows([int(n) for n in a.lengths.split(",")], dtype, a.steps)


if __name__ == "__main__":
    main()
