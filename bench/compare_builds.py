"""Two builds of rlhfkit, side by side, on the same short runs: identical numbers or not.

    python bench/compare_builds.py OLD_TREE NEW_TREE        # e.g. a `git worktree` of the last release

Each tree's `rlhfkit train rl` (PYTHONPATH=TREE) runs 4 RL steps of a tiny random Llama on a dense
"sevens" reward, in four configurations that cover the stages (GRPO; GAE with a critic, KL in the
reward and 2 epochs; DAPO filtering with overlong shaping and clip-higher; GSPO with bf16 autocast
and a k3 KL loss), plus a multi-turn agent run (the built-in guessing game, 3 turns), and 4 steps of
`rlhfkit train sft` and `rlhfkit train dpo` on small generated data, one thread each. Prints, per
configuration, whether every non-timing metric and every tensor of the final model are equal. A
refactor that changes no math prints "identical" seven times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {
    "grpo": [],
    "gae_kl_2epochs": ["--algo.advantage.estimator", "gae", "--algo.kl.init_coef", "0.05", "--train.max_epochs", "2"],
    "dapo": ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1",
             "--reward.overlong_buffer_len", "4", "--actor.eps_clip_low_high", "0.2", "0.28"],
    "gspo_bf16_klloss": ["--actor.policy_loss_type", "gspo", "--actor.autocast", "bfloat16", "--algo.kl.init_coef",
                         "0.01", "--algo.kl.use_loss", "--algo.kl.estimator", "k3"],
    "agent_multiturn": ["--agent.func_path", "builtin:guess", "--agent.max_turns", "3"],
}
# the supervised commands: `rlhfkit train KIND` with these flags beside the shared ones (supervised_argv)
SUPERVISED = {
    "sft": ["--data.dataset", "sft.jsonl", "--data.input_key", "q", "--data.output_key", "a"],
    "dpo": ["--data.dataset", "pairs.jsonl", "--data.prompt_key", "q", "--data.chosen_key", "good",
            "--data.rejected_key", "bad", "--model.beta", "0.1"],
}
REWARD = '''
import torch
def reward_func(queries, prompts, labels, **kwargs):
    responses = [q[len(p):] for q, p in zip(queries, prompts)]
    r = torch.tensor([sum(c == "7" for c in s) / 8.0 for s in responses])
    return {"rewards": r, "scores": r.clamp(0, 1), "extra_logs": {"sevens": r * 8}}
'''


def workspace(root: Path) -> None:
    from rlhfkit.models import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(64)]
    (root / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "reward.py").write_text(REWARD)
    sft = [{"q": f"{i} + {i % 7} =", "a": f" {i + i % 7}"} for i in range(64)]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    pairs = [{"q": r["q"], "good": r["a"], "bad": f" {i * 3 % 11}"} for i, r in enumerate(sft)]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))


def rl_argv(root: Path, out: Path, extra: list[str]) -> list[str]:
    # an agent run takes its rewards from the environment: no reward file beside it
    reward = [] if "--agent.func_path" in extra else ["--reward.remote_url", str(root / "reward.py")]
    return ["train", "rl", "--actor.model_name_or_path", str(root / "tiny"), "--data.prompt_dataset",
            str(root / "p.jsonl"), "--data.input_key", "q", "--data.label_key", "a", *reward,
            "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "4", "--rollout.max_new_tokens", "8",
            "--rollout.temperature", "1.0", "--train.batch_size", "16", "--train.micro_batch_size", "8",
            "--train.max_steps", "4", "--train.num_episodes", "2", "--actor.adam.lr", "1e-2",
            "--actor.lr_scheduler", "constant", "--logger.progress_bar", "false", "--train.num_threads", "1",
            "--ckpt.output_dir", str(out), *extra]


def supervised_argv(kind: str, root: Path, out: Path) -> list[str]:
    data = [str(root / a) if a.endswith(".jsonl") else a for a in SUPERVISED[kind]]
    return ["train", kind, "--model.model_name_or_path", str(root / "tiny"), *data, "--train.batch_size", "8",
            "--train.micro_batch_size", "4", "--train.max_steps", "4", "--adam.lr", "1e-3",
            "--train.lr_scheduler", "constant", "--train.num_threads", "1", "--logger.progress_bar", "false",
            "--ckpt.output_dir", str(out)]


def run(tree: str, root: Path, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": tree, "HF_HUB_OFFLINE": "1"}
    # cwd: `python -m` puts the working directory first on sys.path, before PYTHONPATH
    where = subprocess.run([sys.executable, "-c", "import rlhfkit; print(rlhfkit.__file__)"], env=env, cwd=root,
                           check=True, capture_output=True, text=True).stdout.strip()
    if not where.startswith(tree):
        sys.exit(f"PYTHONPATH={tree} imports rlhfkit from {where}; give the tree's root folder")
    done = subprocess.run([sys.executable, "-m", "rlhfkit.cli.main", *argv], env=env, cwd=root, check=False,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"PYTHONPATH={tree} rlhfkit {' '.join(argv[:2])} failed:\n{done.stderr[-3000:]}")


def same(a: Path, b: Path) -> str:
    import torch
    from safetensors.torch import load_file

    def rows(d):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "rollout_tokens_per_s"))}
                for line in (d / "metrics.jsonl").read_text().splitlines()]

    ra, rb = rows(a), rows(b)
    differ = sorted({k for x, y in zip(ra, rb) for k in set(x) & set(y) if x[k] != y[k]})
    metrics = len(ra) == len(rb) and not differ
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    only = sorted(set().union(*ra) ^ set().union(*rb))
    verdict = "identical" if metrics and weights else f"DIFFERENT (metrics equal: {metrics}, weights equal: {weights})"
    if differ:
        rel = max((abs(x[k] - y[k]) / max(abs(x[k]), abs(y[k]), 1e-12) for x, y in zip(ra, rb) for k in differ
                   if isinstance(x.get(k), float) and isinstance(y.get(k), float)), default=0.0)
        verdict += (f"; values differ in {differ[:8]}" + (f" (+{len(differ) - 8} more)" if len(differ) > 8 else "")
                    + f", at most {rel:.1e} relative")
    return verdict + (f"; metrics only one build logs: {only}" if only else "")


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = (str(Path(p).resolve()) for p in sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workspace(root)
        runs = {name: (lambda out, extra=extra: rl_argv(root, out, extra)) for name, extra in CONFIGS.items()}
        runs.update({kind: (lambda out, kind=kind: supervised_argv(kind, root, out)) for kind in SUPERVISED})
        for name, argv in runs.items():
            run(old, root, argv(root / f"old_{name}"))
            run(new, root, argv(root / f"new_{name}"))
            print(f"{name:18} {same(root / f'old_{name}', root / f'new_{name}')}", flush=True)


if __name__ == "__main__":
    main()
