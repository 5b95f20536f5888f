"""`rlhfkit demo`: GRPO on SmolLM2-135M-Instruct learns to lead its reply with the right sum.

The task: "What is a + b? Answer with only the number." with a, b in 1..50 from a fixed seed,
a training split and a disjoint held-out split. Reward = 1 when the first number of the
response is the right answer, else 0: "40" and "The answer is 40." get 1, the base model's
habit of restating the question ("12 + 28 = 40") gets 0. The base and the trained model are
scored with the same prompt and parser. Two more accuracies are reported: lenient (the right
number anywhere in the first line: arithmetic without format) and bare (the response is only
the number). A stricter bare-number reward was tried: this 135M model then found no reward in
its first 10 steps and lost its arithmetic once it dropped the restated question.

The demo is `rlhfkit train rl` with the flags in DEMO_FLAGS (any of them can be overridden on
the command line), plus the before/after evaluation.
"""

from __future__ import annotations

import json
import time

from rlhfkit.api.rl import RLTrainer
from rlhfkit.api.run_folder import prepare_run_dir
from rlhfkit.config import RLConfig
from rlhfkit.data.prompts import PromptExample, tokenize_prompts
from rlhfkit.data.synthetic import arithmetic_problems
from rlhfkit.models import load_tokenizer, materialize_smollm2
from rlhfkit.models.loading import resolve_model
from rlhfkit.models.precision import bf16_matmul_speedup
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rewards.math import lenient_correct, math_exact_reward
from rlhfkit.trainers.evaluate import Evaluator

INSTRUCTION = "{question} Answer with only the number."
DEMO_FLAGS = [
    "--actor.model_name_or_path", "smollm2",
    "--algo.advantage.estimator", "group_norm",
    "--rollout.batch_size", "16",
    "--rollout.n_samples_per_prompt", "8",
    "--rollout.max_new_tokens", "12",
    "--rollout.temperature", "0.7",
    "--algo.dynamic_filtering_enable",
    "--algo.dynamic_filtering_range", "0", "1",
    "--algo.dynamic_filtering_max_rounds", "1",  # drop only, no top-up: the demo as first measured
    "--train.batch_size", "128",
    "--train.micro_batch_size", "32",
    "--train.max_steps", "40",
    "--actor.adam.lr", "3e-5",
    "--actor.lr_scheduler", "constant",
    "--actor.autocast", "bfloat16",
    "--eval.steps", "10",
    "--ckpt.output_dir", "runs/demo",
]
N_TRAIN, N_TEST = 2000, 128


def first_number_reward(queries, prompts, labels, responses=None, **_) -> RewardOutput:
    """1.0 when the first number of the response is the right answer (what the prompt asks)."""
    return math_exact_reward(responses, labels, mode="first_integer")


def accuracy(responses: list[str], labels: list[str]) -> dict[str, float]:
    """strict: the first number of the response is the answer (the reward's rule);
    lenient: the answer appears anywhere in the first line; bare: the response is only the
    right number."""
    return {
        "eval/accuracy": float(math_exact_reward(responses, labels, mode="first_integer").scores.mean()),
        "eval/lenient_accuracy": sum(lenient_correct(r, lbl) for r, lbl in zip(responses, labels)) / len(labels),
        "eval/bare_accuracy": float(math_exact_reward(responses, labels, mode="bare_number").scores.mean()),
    }


def chat_examples(records: list[dict], tokenizer) -> list[PromptExample]:
    out = []
    for i, r in enumerate(records):
        msg = [{"role": "user", "content": INSTRUCTION.format(question=r["input"])}]
        text = tokenizer.apply_chat_template(msg, tokenize=False, add_generation_prompt=True)
        out.append(PromptExample(text=text, label=r["label"], raw=r, index=i))
    return out


def run(argv: list[str]) -> int:
    t0 = time.perf_counter()
    flags = DEMO_FLAGS + list(argv)
    if not any(a.startswith(("--actor.autocast", "--bf16")) for a in argv) and bf16_matmul_speedup() < 1.0:
        # bf16 is the demo's compute dtype where the CPU runs it natively; elsewhere it is 10-100x slower
        print("this CPU runs bf16 matmuls slower than float32: the demo computes in float32 (--actor.autocast none)")
        flags += ["--actor.autocast", "none"]
    cfg = RLConfig.from_args(flags)
    run_dir = prepare_run_dir(cfg)
    print(f"rlhfkit demo: GRPO on SmolLM2-135M-Instruct, arithmetic; run folder {run_dir}")
    model_dir = materialize_smollm2()
    t_prep = time.perf_counter() - t0
    print(f"[prepare] model ready in {t_prep:.0f}s at {model_dir}")
    train, test = arithmetic_problems(N_TRAIN, N_TEST, seed=0)
    for name, recs in (("train", train), ("test", test)):
        (run_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    tokenizer = load_tokenizer(resolve_model(cfg.actor.model_name_or_path)[0])
    test_items, _ = tokenize_prompts(chat_examples(test, tokenizer), tokenizer, cfg.data.prompt_max_len)
    evaluator = Evaluator(test_items, cfg.rollout.max_new_tokens, cfg.eval.steps,
                          score_fn=lambda responses, items: accuracy(responses, [p.label for p in items]))
    trainer = RLTrainer.from_config(cfg, reward_fn=first_number_reward,
                                    train_dataset=lambda tok: chat_examples(train, tok), callbacks=[evaluator.periodic])
    loop = trainer.loop
    before = evaluator(loop, 0, "before")
    t_train = time.perf_counter()
    loop.train()
    t_train = time.perf_counter() - t_train
    after = evaluator(loop, trainer.step, "after")
    final = trainer.save(run_dir / "final")
    trainer.tracker.close()
    total = time.perf_counter() - t0
    summary = {
        "before": before, "after": after,
        "steps": trainer.step, "train_seconds": round(t_train, 1), "total_seconds": round(total, 1),
        "examples": evaluator.examples,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    gain = after["eval/accuracy"] - before["eval/accuracy"]
    print(f"\nheld-out accuracy: {before['eval/accuracy']:.1%} -> {after['eval/accuracy']:.1%} "
          f"({gain * 100:+.1f} points); lenient {before['eval/lenient_accuracy']:.1%} -> "
          f"{after['eval/lenient_accuracy']:.1%}; only the number {before['eval/bare_accuracy']:.1%} -> "
          f"{after['eval/bare_accuracy']:.1%}")
    print(f"{trainer.step} RL steps in {t_train:.0f}s; whole demo {total:.0f}s. Final model: {final}")
    print(f"curves: {run_dir / 'curves.png'}  samples: {run_dir / 'samples.jsonl'}  "
          f"TensorBoard: {run_dir / 'tensorboard'}")
    return 0
