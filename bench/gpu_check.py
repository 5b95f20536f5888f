"""The GPU check: one command, ~8 minutes on one GPU, no network; a JSON report.

1. `pytest -m gpu tests/gpu`: the trainers on CUDA against the CPU in float32 (rollout tokens and
   logprobs, greedy tokens = `model.generate`, one update's gradients, one RL step, save/resume,
   gradient checkpointing, LoRA in RL, bf16 params with fp32 masters, SFT/RM/DPO/KTO).
2. The bf16 matmul rate of this device, measured here (the MFU denominator; float32 on the CPU).
3. Per model shape (random weights built from a config: SmolLM2-135M's and Qwen2-1.5B's layers with
   SmolLM2's tokenizer), each in its own process (its own peak memory), the same prompts, group
   size, new tokens, batch sizes, lr, bf16 autocast, no KL, token-mean loss:
   - rlhfkit `train rl` (GRPO): step time, rollout tokens/s, update MFU, peak memory;
   - TRL's GRPOTrainer (its model.generate path): step time, peak memory;
   - rollout alone at the same batch: rlhfkit's HF engine vs `model.generate` (tokens/s).
   Targets (reported, not asserted): a step >= 3x faster than TRL's, update MFU >= 40% on the 1.5B
   shape, rollout >= 5x model.generate.
4. What users run, each in its own process with one summary line (bench/gpu_check_paths.py):
   shared-prefix logprobs under SDPA vs padded rows (rows under and over 512 tokens), a learning
   check (reward rising over 30 steps), PPO with critic + reference + KL + --ref.offload, FSDP2 under
   `torchrun --nproc_per_node 1` (one update, a sharded save and a resume), compiled decode vs eager
   (CUDA graph recordings, memory, speed), gradient checkpointing + bf16 masters at the 1.5B shape,
   1k-4k-token responses (memory vs `plan`'s estimate), memory over 20 steps.
5. With --vllm: bench/gpu_check_vllm.py (needs vllm; the GPU machine lent here has none).

Order: the tests, the checks of 4, then the comparisons of 3 while --budget-s lasts (a part past it is
reported as skipped); the summary lines are printed again at the end and stored under "summary".

    bash bench/gpu_wheels.sh                       # here, once: gpu_wheels/ (wheels + tokenizer)
    # on the GPU machine, gpu_wheels/ carried with the tree:
    bash bench/gpu_wheels.sh install && python3 bench/gpu_check.py --out $OUT/gpu_check.json
    # here, the whole script on the CPU at tiny sizes (checks the script, not GPU numbers):
    python bench/gpu_check.py --device cpu --quick --out /tmp/gpu_check.json

The first step of each run is a warm-up: step times are the median of the later ones.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_paths import CAPS, CHECKS, SHAPE_OF  # bench/ is not a package

REPO = Path(__file__).resolve().parent.parent

RESULT = "GPU_CHECK_RESULT "
SMOLLM2_135M = ("LlamaConfig", {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                                 "num_attention_heads": 9, "num_key_value_heads": 3, "rope_theta": 100000.0,
                                 "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 2048})
QWEN2_1_5B = ("Qwen2Config", {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                              "num_attention_heads": 12, "num_key_value_heads": 2, "rope_theta": 1e6,
                              "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 2048})
TINY = ("LlamaConfig", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "tie_word_embeddings": True, "max_position_embeddings": 512})
SHAPES = {"smollm2-135m": SMOLLM2_135M, "qwen2-1.5b": QWEN2_1_5B, "tiny": TINY}
# (prompts, samples per prompt, new tokens, micro-batch, steps) of the full run and of --quick
SETTINGS = {"full": (16, 8, 128, 16, 3), "quick": (2, 4, 8, 4, 2)}
LR = 1e-6


# ------------------------------------------------------------------ the shared task
def records(n: int) -> list[dict]:
    """n chat prompts (the demo's arithmetic questions) as TRL and rlhfkit both take them."""
    from rlhfkit.cli.demo import INSTRUCTION
    from rlhfkit.data.synthetic import arithmetic_problems

    train, _ = arithmetic_problems(n, 0, seed=0)
    return [{"prompt": [{"role": "user", "content": INSTRUCTION.format(question=r["input"])}]} for r in train]


def length_reward(completions, **_) -> list[float]:
    """(characters mod 10) / 10: varies within a group for a random model, so no group's advantages vanish."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [(len(t) % 10) / 10 for t in texts]


def build_model_folder(shape: str, tokenizer: Path, folder: Path, device: str) -> dict:
    """A random-weight model of `shape` with the tokenizer's vocabulary, saved (float32) with the tokenizer."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    cls, kw = SHAPES[shape]
    vocab = -(-len(tok) // 64) * 64
    config = getattr(transformers, cls)(vocab_size=vocab, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                        pad_token_id=tok.pad_token_id, **kw)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return {"params": sum(p.numel() for p in model.parameters()), "vocab": vocab, "layers": kw["num_hidden_layers"],
            "hidden": kw["hidden_size"]}


# ------------------------------------------------------------------ children (one process each)
def peak_memory(device: str) -> dict:
    import torch

    out = {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if device == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def run_rlhfkit(a) -> dict:
    import rlhfkit

    prompts, group, new, micro, steps = SETTINGS[a.size]
    flags = ["--actor.model_name_or_path", a.model_dir, "--actor.device", a.device,
             "--algo.advantage.estimator", "group_norm", "--rollout.batch_size", prompts,
             "--rollout.n_samples_per_prompt", group, "--rollout.max_new_tokens", new, "--rollout.temperature", 1.0,
             "--train.batch_size", prompts * group, "--train.micro_batch_size", micro, "--train.max_steps", steps,
             "--actor.adam.lr", LR, "--actor.lr_scheduler", "constant", "--actor.autocast", autocast(a.device),
             "--data.input_key", "prompt", "--data.apply_chat_template", "true",
             "--ckpt.output_dir", Path(a.model_dir).parent / "rlhfkit_run",
             "--logger.progress_bar", "false", "--logger.log_samples", 0]
    cfg = rlhfkit.RLConfig.from_args([str(f) for f in flags])
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=length_reward, train_dataset=records(prompts * steps))
    history = trainer.loop.train()
    trainer.tracker.close()
    timed = history[1:] or history
    head = trainer.loop.policy.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in trainer.loop.policy.parameters()) - head
    # 6 x (parameters besides the LM head) per token the update ran on + 6 x head per response token
    flops = [6 * body * m["train_tokens"] + 6 * head * m["response_tokens"] for m in timed]
    return {
        "step_s": statistics.median(m["time/step"] for m in timed),
        "generate_s": statistics.median(m["time/generate"] for m in timed),
        "update_s": statistics.median(m["time/update"] for m in timed),
        "rollout_tokens_per_s": statistics.median(m["rollout_tokens_per_s"] for m in timed),
        "update_tflops": statistics.median(f / m["time/update"] / 1e12 for f, m in zip(flops, timed)),
        "stage_peaks_gib": {k: v for k, v in history[-1].items() if k.startswith("memory/")},
    }


def run_trl(a) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts, group, new, micro, steps = SETTINGS[a.size]
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            sync(a.device)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync(a.device)
            times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(
        output_dir=str(Path(a.model_dir).parent / "trl_run"), max_steps=steps, learning_rate=LR,
        lr_scheduler_type="constant", per_device_train_batch_size=micro,
        gradient_accumulation_steps=prompts * group // micro, num_generations=group, max_completion_length=new,
        temperature=1.0, beta=0.0, loss_type="dapo", scale_rewards="group", bf16=a.device == "cuda",
        use_cpu=a.device == "cpu", report_to="none", logging_steps=1, save_strategy="no", seed=0, warmup_steps=0,
        max_grad_norm=1.0, adam_beta2=0.95, weight_decay=0.0, disable_dropout=True,
        gradient_checkpointing=False)  # TRL's GRPO turns it on by default; rlhfkit's run has it off
    trainer = GRPOTrainer(model=a.model_dir, reward_funcs=length_reward, args=args,
                          train_dataset=Dataset.from_list(records(prompts * steps)), callbacks=[Timer()])
    trainer.train()
    return {"step_s": statistics.median(times[1:] or times), "step_times": times}


def run_rollout(a) -> dict:
    """Tokens/s of rlhfkit's HF engine and of model.generate on the same prompts and batch (bf16 autocast on
    CUDA), every row sampling all `new` tokens (random weights rarely stop)."""
    import torch

    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.rollout.base import SamplingParams
    from rlhfkit.rollout.hf import HFEngine

    prompts, group, new, _, _ = SETTINGS[a.size]
    tok = load_tokenizer(a.model_dir)
    model = load_causal_lm(a.model_dir).to(a.device).eval()
    ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
           for r in records(prompts)]
    dtype = torch.bfloat16 if a.device == "cuda" else None
    engine = HFEngine(model, tok, autocast_dtype=dtype)
    params = SamplingParams(max_new_tokens=new, temperature=1.0, n=group)

    def engine_tokens() -> int:
        return sum(t.response_length for t in engine.generate(ids, params, torch.Generator().manual_seed(0)))

    def generate_tokens() -> int:
        tok.padding_side = "left"
        enc = tok.pad({"input_ids": ids}, return_tensors="pt").to(a.device)
        ctx = torch.autocast(a.device, dtype=dtype) if dtype else torch.autocast(a.device, enabled=False)
        with torch.inference_mode(), ctx:
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                                 num_return_sequences=group, pad_token_id=tok.pad_token_id)
        return int((out[:, enc["input_ids"].shape[1]:] != tok.pad_token_id).sum())

    out = {}
    for name, fn in (("engine", engine_tokens), ("generate", generate_tokens)):
        fn()  # warm-up
        sync(a.device)
        t0 = time.perf_counter()
        tokens = fn()
        sync(a.device)
        out[f"{name}_tokens_per_s"] = tokens / (time.perf_counter() - t0)
    out["engine_vs_generate"] = out["engine_tokens_per_s"] / out["generate_tokens_per_s"]
    return out


CHILDREN = {"rlhfkit": run_rlhfkit, "trl": run_trl, "rollout": run_rollout}
CHILDREN.update({f"path_{name}": fn for name, fn in CHECKS.items()})


def autocast(device: str) -> str:
    return "bfloat16" if device == "cuda" else "none"  # bf16 on a CPU without native bf16 is 10-100x slower


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def child(a) -> None:
    import torch

    torch.manual_seed(0)
    out = CHILDREN[a.child](a)
    out.update(peak_memory(a.device))
    print(RESULT + json.dumps(out), flush=True)


# ------------------------------------------------------------------ the parent
def run_python(args: list[str], timeout: float) -> subprocess.CompletedProcess | dict:
    """This interpreter on `args` in the repository, offline; an error dict when it outlives `timeout`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=max(timeout, 1), check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}


def failed(proc: subprocess.CompletedProcess) -> dict:
    return {"error": f"exit {proc.returncode}", "log_tail": (proc.stdout + proc.stderr)[-2500:]}


def spawn(args: list[str], timeout: float) -> dict:
    """A child's RESULT line, or what went wrong."""
    t0 = time.perf_counter()
    proc = run_python(args, timeout)
    if isinstance(proc, dict):
        return proc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        return failed(proc)
    return {**json.loads(lines[-1][len(RESULT):]), "wall_s": time.perf_counter() - t0}


def run_tests(a, timeout: float) -> dict:
    """pytest on tests/gpu: `-m gpu` on CUDA; on the CPU the default (cpu) variants, under --quick a few."""
    junit = Path(a.work) / "tests.xml"
    select = ["-m", "gpu"] if a.device == "cuda" else ["-k", "greedy or gradients"] if a.quick else []
    t0 = time.perf_counter()
    proc = run_python(["-m", "pytest", "tests/gpu", "-q", "-p", "no:randomly", f"--junitxml={junit}", *select], timeout)
    if isinstance(proc, dict):
        return proc
    out = {"exit_code": proc.returncode, "wall_s": time.perf_counter() - t0,
           "summary": proc.stdout.strip().splitlines()[-1:]}
    if junit.exists():
        root = ET.parse(junit).getroot()
        out["failed"] = [c.get("name") for c in root.iter("testcase")
                         if c.find("failure") is not None or c.find("error") is not None]
        suite = next(root.iter("testsuite"))
        out.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    if proc.returncode != 0:
        out["log_tail"] = proc.stdout[-2500:]
    return out


def matmul_tflops(device: str, n: int, reps: int = 10) -> float:
    """The matmul rate in the dtype the runs compute in: bf16 on CUDA, float32 on the CPU."""
    import torch

    dtype = torch.bfloat16 if autocast(device) == "bfloat16" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def compare_shape(a, shape: str, deadline: float, peak_tflops: float) -> dict:
    folder = Path(a.work) / shape / "model"
    out = {"model": build_model_folder(shape, a.tokenizer, folder, a.device)}
    prompts, group, new, micro, steps = SETTINGS[a.size]
    out["settings"] = {"prompts": prompts, "samples_per_prompt": group, "max_new_tokens": new,
                       "micro_batch": micro, "steps": steps, "autocast": autocast(a.device), "lr": LR}
    for which in ("rollout", "rlhfkit", "trl"):
        argv = [__file__, "--child", which, "--model-dir", str(folder), "--device", a.device, "--size", a.size]
        out[which] = spawn(argv, min(a.child_timeout, deadline - time.perf_counter()))
        print(f"[{shape}] {which}: {json.dumps(out[which])[:400]}", flush=True)
    r, t, g = out["rlhfkit"], out["trl"], out["rollout"]
    if "update_tflops" in r:
        r["update_mfu"] = r["update_tflops"] / peak_tflops
    if "step_s" in r and "step_s" in t:
        out["step_speedup_vs_trl"] = t["step_s"] / r["step_s"]
    if "engine_vs_generate" in g:
        out["rollout_speedup_vs_generate"] = g["engine_vs_generate"]
    return out


def run_paths(a, deadline: float, summary: list[str]) -> dict:
    """The checks of bench/gpu_check_paths.py, each in its own process on a random-weight model of its shape
    (--quick: tiny), each capped at twice its expected time on one H200, all within the budget."""
    out, folders = {}, {}
    for name in a.checks.split(","):
        left = deadline - time.perf_counter()
        if left < 5:
            out[name] = {"error": "skipped: past --budget-s"}
            summary.append(f"{name}: SKIPPED (past --budget-s)")
            continue
        shape = "tiny" if a.quick else SHAPE_OF.get(name, "smollm2-135m")
        if shape not in folders:
            folders[shape] = Path(a.work) / "paths" / shape
            build_model_folder(shape, a.tokenizer, folders[shape], a.device)
        argv = [__file__, "--child", f"path_{name}", "--model-dir", str(folders[shape]), "--device", a.device,
                "--size", a.size, "--work", str(Path(a.work) / "paths" / name)]
        out[name] = spawn(argv, min(2 * CAPS[name] if not a.quick else a.child_timeout, left))
        summary.append(out[name].get("summary") or f"{name}: FAIL {out[name].get('error')}")
        print(f"{summary[-1]}  ({out[name].get('wall_s', 0):.0f} s)", flush=True)
    return out


def run_vllm(work: Path, timeout: float) -> dict:
    """bench/gpu_check_vllm.py on the SmolLM2-shaped model folder (SmolLM2 itself where none was built)."""
    folder, out = work / "smollm2-135m" / "model", work / "vllm.json"
    model = ["--model", str(folder)] if folder.exists() else []
    proc = run_python(["bench/gpu_check_vllm.py", *model, "--out", str(out)], timeout)
    if isinstance(proc, dict):
        return proc
    return json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else failed(proc)


def environment(device: str) -> dict:
    import torch
    import transformers

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script end to end, not speed")
    ap.add_argument("--shapes", default=None, help=f"comma-separated of {', '.join(SHAPES)} "
                    "(default: qwen2-1.5b,smollm2-135m; with --quick: tiny; none: no comparisons)")
    ap.add_argument("--out", default=None, help="the JSON report (default: $OUT/gpu_check.json, else gpu_check.json)")
    ap.add_argument("--tokenizer", type=Path, default=REPO / "gpu_wheels" / "smollm2-tokenizer")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting parts after this many seconds "
                         "(default 450; with --quick 1800: the CPU is slow)")
    ap.add_argument("--child-timeout", type=float, default=200.0)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="also run bench/gpu_check_vllm.py (needs vllm)")
    ap.add_argument("--child", choices=list(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--size", choices=list(SETTINGS), default="full", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--checks", default=",".join(CHECKS), help=f"which of {', '.join(CHECKS)} (default: all)")
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    check(a)


def check(a) -> None:
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device here; --device cpu --quick checks the script on the CPU")
    if not (a.tokenizer / "tokenizer_config.json").exists():
        raise SystemExit(f"gpu_check: no tokenizer in {a.tokenizer}; run bash bench/gpu_wheels.sh first")
    start = time.perf_counter()
    a.budget_s = a.budget_s or (1800.0 if a.quick else 450.0)
    deadline = start + a.budget_s
    a.size = "quick" if a.quick else "full"
    shapes = (a.shapes or ("tiny" if a.quick else "qwen2-1.5b,smollm2-135m")).split(",")
    shapes = [] if shapes == ["none"] else shapes
    out_path = Path(a.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    report: dict = {"environment": environment(a.device), "quick": a.quick}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work:
        a.work = work
        summary = []
        if not a.skip_tests:
            report["tests"] = run_tests(a, min(120.0, deadline - time.perf_counter()))
            t = report["tests"]
            summary.append(f"tests: {'OK' if t.get('exit_code') == 0 else 'FAIL'} {t.get('summary', t.get('error'))}")
            print(summary[-1], flush=True)
        report["paths"] = run_paths(a, deadline, summary)
        report["matmul_tflops"] = matmul_tflops(a.device, 256 if a.quick else 8192)
        report["matmul_dtype"] = "bfloat16" if a.device == "cuda" else "float32"
        for shape in shapes:
            if time.perf_counter() > deadline:
                report[shape] = {"error": "skipped: past --budget-s"}
                continue
            report[shape] = compare_shape(a, shape, deadline, report["matmul_tflops"])
            r = report[shape]
            summary.append(f"compare[{shape}]: step {r['rlhfkit'].get('step_s', float('nan')):.2f} s, "
                           f"vs TRL {r.get('step_speedup_vs_trl', float('nan')):.2f}x, rollout vs generate "
                           f"{r.get('rollout_speedup_vs_generate', float('nan')):.2f}x, update MFU "
                           f"{r['rlhfkit'].get('update_mfu', float('nan')):.1%}")
        if a.vllm:
            report["vllm"] = run_vllm(Path(work), min(300.0, deadline - time.perf_counter()))
    report["wall_s"] = time.perf_counter() - start
    report["summary"] = summary + [f"total: {report['wall_s']:.0f} s (budget {a.budget_s:.0f} s)"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n".join(report["summary"]))
    print(f"report: {out_path}")


if __name__ == "__main__":  # children are started with this interpreter and file
    main()
