"""Process reward models and conditional SFT on the tiny model, through the CLI: `train prm` learns to
tell a wrong arithmetic step from a right one; its folder gives `train rl` per-step rewards;
`train sft --data.reward_template` follows the score asked for; bad inputs are one-line errors."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main


def one_line_error(argv, capsys, needle):
    """Exit code 2, one line `error: ...` containing `needle`, no traceback."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert rc == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def arithmetic_steps(n: int, seed: int = 0) -> list[dict]:
    """Texts of three steps "a+b=c #\\n"; a step is good (+) when c = a + b, bad (-) otherwise."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        good = [rng.random() < 0.5 for _ in range(3)]
        text = ""
        for g in good:
            a, b = rng.randint(0, 4), rng.randint(0, 4)
            text += f"{a}+{b}={a + b if g else (a + b + rng.randint(1, 4)) % 10} #\n"
        rows.append({"input": text, "label": ["+" if g else "-" for g in good]})
    return rows


def prm_argv(ws, out, *extra):
    return ["train", "prm", "--model.model_name_or_path", str(ws / "tiny"), "--data.dataset", str(ws / "steps.jsonl"),
            "--placeholder_token", "#", "--reward_tokens", "+", "-", "--ckpt.output_dir", str(out),
            "--logger.progress_bar", "false", "--train.num_threads", "1", *extra]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("prm")
    write(root / "steps.jsonl", arithmetic_steps(600))
    return root


@pytest.fixture(scope="module")
def prm_run(ws):
    out = ws / "prm_run"
    argv = prm_argv(ws, out, "--data.eval_split", "0.2", "--train.batch_size", "8", "--train.micro_batch_size", "8",
                    "--train.max_epochs", "3", "--adam.lr", "3e-3", "--train.lr_warmup_ratio", "0",
                    "--train.eval_steps", "10")
    assert main(argv) == 0
    return out


def test_prm_separates_good_from_bad_steps(ws, prm_run):
    rows = [json.loads(line) for line in (prm_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    summary = json.loads((prm_run / "summary.json").read_text())
    labels = [lab for r in arithmetic_steps(600) for lab in r["label"]]
    chance = max(labels.count("+"), labels.count("-")) / len(labels)
    # measured: 0.77 after 120 steps, 0.85 after 180 (chance ~0.5)
    assert chance < 0.55 and summary["eval/accuracy"] > 0.75 and summary["eval/accuracy"] >= evals[0]
    config = json.loads((prm_run / "final" / "config.json").read_text())
    assert config["process_reward"] == {"placeholder_token": "#", "reward_tokens": ["+", "-"]}
    assert config["architectures"][0].endswith("ForCausalLM")


def rl_argv(ws, prm_run, out, estimator):
    return ["train", "rl", "--actor.model_name_or_path", str(ws / "tiny"), "--data.prompt_dataset",
            str(ws / "prompts.jsonl"), "--data.input_key", "prompt", "--reward.model_name_or_path",
            str(prm_run / "final"), "--algo.advantage.estimator", estimator, "--rollout.batch_size", "4",
            "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "8", "--train.batch_size", "8",
            "--train.micro_batch_size", "4", "--train.max_steps", "2", "--actor.adam.lr", "1e-3",
            "--logger.progress_bar", "false", "--train.num_threads", "1", "--ckpt.output_dir", str(out)]


def test_rl_with_a_prm_gets_step_rewards_and_trains(ws, prm_run, tmp_path, capsys):
    write(ws / "prompts.jsonl", [{"prompt": f"{i % 5}+{i // 5}="} for i in range(16)])
    out = tmp_path / "rl"
    assert main(rl_argv(ws, prm_run, out, "reinforce")) == 0
    ms = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in ms if "reward_extra/prm_steps" in m]
    assert len(steps) == 2
    assert all(m["reward_extra/prm_steps"] >= 1 and 0 <= m["reward_extra/prm_step_mean"] <= 1 for m in steps)
    assert all(m["reward"] == 0.0 for m in steps)  # the rewards are per step, not one scalar
    before, after = load_file(ws / "tiny" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the policy trained


def test_a_group_baseline_and_rejection_sampling_take_the_weakest_step_as_the_reward(ws, prm_run, tmp_path, capsys):
    """group_norm and `train rs` take one reward per sample: the PRM's weakest step's P(good), not 0."""
    write(ws / "prompts.jsonl", [{"prompt": f"{i % 5}+{i // 5}="} for i in range(16)])
    capsys.readouterr()
    assert main(rl_argv(ws, prm_run, tmp_path / "grpo", "group_norm")) == 0
    assert "the process reward model's weakest step (its P(good)) is each sample's reward" in capsys.readouterr().out
    ms = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in ms if "reward_extra/prm_steps" in m]
    assert len(steps) == 2 and all(m["reward"] == m["reward_extra/prm_step_min"] > 0 for m in steps)
    write(tmp_path / "four.jsonl", [{"prompt": f"{i}+{i}="} for i in range(4)])
    rs = ["train", "rs", "--actor.model_name_or_path", str(ws / "tiny"), "--data.prompt_dataset",
          str(tmp_path / "four.jsonl"), "--data.input_key", "prompt", "--rollout.n_samples_per_prompt", "4",
          "--rollout.batch_size", "4", "--reward.model_name_or_path", str(prm_run / "final"),
          "--rollout.max_new_tokens", "8", "--ckpt.output_dir", str(tmp_path / "rs"), "--logger.progress_bar", "false",
          "--train.num_threads", "1"]
    assert main(rs) == 0
    gen = [json.loads(line) for line in (tmp_path / "rs" / "round_1" / "generations.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in (tmp_path / "rs" / "rs_dataset.jsonl").read_text().splitlines()]
    assert len(gen) == 16 and len({r["reward"] for r in gen}) > 1 and all(0 <= r["reward"] <= 1 for r in gen)
    for row in kept:  # the best of its prompt's four
        assert row["reward"] == max(r["reward"] for r in gen if r["prompt"] == row["input"])


def test_a_placeholder_of_several_tokens_trains_a_prm_that_scores_rl_steps(ws, tmp_path):
    """"#%" is two tokens for the tiny tokenizer (as Math-Shepherd's "ки" is for SmolLM2's): `train prm`
    reads each step's label at its last token and `train rl` inserts it whole at each step end."""
    rows = [{"input": r["input"].replace(" #\n", " #%\n"), "label": r["label"]} for r in arithmetic_steps(48)]
    write(tmp_path / "steps.jsonl", rows)
    prm = tmp_path / "prm"
    argv = ["train", "prm", "--model.model_name_or_path", str(ws / "tiny"), "--data.dataset",
            str(tmp_path / "steps.jsonl"), "--placeholder_token", "#%", "--reward_tokens", "+", "-",
            "--ckpt.output_dir", str(prm), "--logger.progress_bar", "false", "--train.num_threads", "1",
            "--train.batch_size", "8", "--train.micro_batch_size", "8"]
    assert main(argv) == 0  # a record whose placeholders and labels differ in number would stop it
    config = json.loads((prm / "final" / "config.json").read_text())
    assert config["process_reward"]["placeholder_token"] == "#%"
    write(ws / "prompts.jsonl", [{"prompt": f"{i % 5}+{i // 5}="} for i in range(16)])
    out = tmp_path / "rl"
    assert main(rl_argv(ws, prm, out, "reinforce")) == 0
    ms = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in ms if "reward_extra/prm_steps" in m]
    assert len(steps) == 2 and all(m["reward_extra/prm_steps"] >= 1 for m in steps)
    assert all(0 < m["reward_extra/prm_step_mean"] < 1 for m in steps)


def test_bad_step_data_is_a_one_line_error(ws, tmp_path, capsys):
    rows = [{"input": "1+1=2 #\n", "label": ["+"]}, {"input": "1+1=3", "label": ["-"]}]
    write(tmp_path / "no_placeholder.jsonl", rows)
    cases = [
        (["--data.dataset", str(tmp_path / "no_placeholder.jsonl")], "line 2: no placeholder token"),
        (["--reward_tokens", "ok", "-"], "--data.reward_tokens 'ok' is 2 tokens"),
        (["--data.placeholder_token", "+"], "must differ"),
    ]
    for extra, want in cases:
        one_line_error(prm_argv(ws, tmp_path / "bad", "--train.batch_size", "2", "--train.micro_batch_size", "2",
                                *extra), capsys, want)


def test_conditional_sft_follows_the_requested_score(tiny_ws, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tiny_ws("csft")
    rng = random.Random(0)
    rows = [{"input": f"q{rng.randint(0, 99)}", "output": "yes" if r else "no", "reward": float(r)}
            for r in (rng.random() < 0.5 for _ in range(128))]
    write(root / "csft.jsonl", rows)
    out = tmp_path / "csft"
    template = "{input} <rm_score>: {reward} "
    assert main(["train", "sft", "--model.model_name_or_path", str(root / "tiny"), "--data.dataset",
                 str(root / "csft.jsonl"), "--reward_template", template, "--train.batch_size", "8",
                 "--train.micro_batch_size", "8", "--train.max_epochs", "3", "--adam.lr", "3e-3",
                 "--train.lr_warmup_ratio", "0", "--logger.progress_bar", "false", "--train.num_threads", "1",
                 "--ckpt.output_dir", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(out / "final")
    model = AutoModelForCausalLM.from_pretrained(out / "final").eval()

    def answer(prompt: str, score: float) -> str:
        text = template.replace("{reward}", f"{score:.2f}").replace("{input}", prompt)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)

    prompts = [f"q{i}" for i in (3, 41, 77, 150)]  # 150: never seen in training
    assert [answer(p, 1.0) for p in prompts] == ["yes"] * 4
    assert [answer(p, 0.0) for p in prompts] == ["no"] * 4
    # OpenRLHF's batch_inference --enable_csft --csft_prompt: `rlhfkit generate` asks every prompt for the score
    write(root / "asks.jsonl", [{"input": p} for p in prompts])

    def generated(score: str) -> list[str]:
        run = tmp_path / f"gen{score}"
        assert main(["generate", "--actor.model_name_or_path", str(out / "final"), "--data.prompt_dataset",
                     str(root / "asks.jsonl"), "--input_template", "{} ", "--enable_csft", "--csft_prompt",
                     f"<rm_score>: {score}", "--greedy_sampling", "--best_of_n", "1", "--rollout.max_new_tokens", "4",
                     "--logger.progress_bar", "false", "--ckpt.output_dir", str(run)]) == 0
        rows = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]
        assert sorted(r["prompt"] for r in rows) == sorted(f"{p} <rm_score>: {score} " for p in prompts)
        return [r["response"].strip() for r in rows]

    assert generated("1.00") == ["yes"] * 4 and generated("0.00") == ["no"] * 4


def test_soft_labels_from_python(ws, tmp_path):
    """Math-Shepherd-style records (float labels under another key) through the public API."""
    from rlhfkit import PRMConfig, PRMTrainer

    rows = [{"input": r["input"], "value": [0.9 if lab == "+" else 0.2 for lab in r["label"]]}
            for r in arithmetic_steps(16, seed=1)]
    cfg = PRMConfig.from_args(["--model.model_name_or_path", str(ws / "tiny"), "--input_key", "input",
                               "--label_key", "value", "--data.placeholder_token", "#", "--train.batch_size", "8",
                               "--train.micro_batch_size", "4", "--data.eval_split", "0.25",
                               "--logger.progress_bar", "false", "--ckpt.output_dir", str(tmp_path / "soft")])
    trainer = PRMTrainer.from_config(cfg, train_dataset=rows)
    metrics = trainer.train()
    assert trainer.step == 1 and len(trainer.eval_items) == 4
    # the soft labels reach the loss: the eval loss is the cross-entropy against P(good) = 0.9 / 0.2, by hand
    with torch.no_grad():
        z, targets = trainer.algorithm.logits(trainer.eval_items)
    assert sorted(set(targets.tolist())) == pytest.approx([0.2, 0.9])
    logp = torch.log_softmax(z.float(), -1)
    want = -(targets * logp[:, 0] + (1 - targets) * logp[:, 1]).mean()
    assert metrics["eval/loss"] == pytest.approx(float(want), rel=1e-5)
    good = ((logp[:, 0] > logp[:, 1]) == (targets > 0.5)).float().mean()
    assert metrics["eval/accuracy"] == pytest.approx(float(good))
    assert json.loads((tmp_path / "soft" / "final" / "config.json").read_text())["process_reward"]["reward_tokens"] \
        == ["+", "-"]


def test_packed_training_follows_the_padded_run(ws, tmp_path):
    """`train prm --packing_samples` (OpenRLHF's name of --ds.packing_samples): the same losses, step by step,
    as the padded run (micro-batches of 4 samples of different lengths)."""
    rows = []
    for i, r in enumerate(arithmetic_steps(24, seed=2)):  # 1 to 3 steps: rows of different lengths
        k = i % 3 + 1
        rows.append({"input": "".join(r["input"].splitlines(keepends=True)[:k]), "label": r["label"][:k]})
    write(tmp_path / "steps.jsonl", rows)
    losses = {}
    for packing in ("false", "true"):
        out = tmp_path / packing
        argv = prm_argv(ws, out, "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_steps", "3",
                        "--adam.lr", "3e-3", "--model.autocast", "none",
                        "--data.dataset", str(tmp_path / "steps.jsonl"),
                        *(["--packing_samples"] if packing == "true" else []))
        assert main(argv) == 0
        losses[packing] = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses["true"]) == 3 and losses["true"][0] != losses["true"][-1]
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-4, abs=1e-6)
