"""Distillation on the tiny model: `train kd` lowers the KL to the teacher (measured before and
after); on-policy distillation lowers the student's KL to the teacher on its own samples; the CLI
refuses a missing teacher and a teacher with another tokenizer in one line."""

import json

import pytest
import torch

from rlhfkit.api.supervised import KDTrainer
from rlhfkit.cli.main import main
from rlhfkit.config.kd import KDConfig
from rlhfkit.models import tiny_model_and_tokenizer

FACTS = [{"input": f"{k}=", "output": v} for k, v in
         [("a", "cat"), ("b", "dog"), ("c", "owl"), ("d", "fox"), ("e", "emu"), ("f", "yak"), ("g", "ant"),
          ("h", "bee")]]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    """The tiny student in tiny/, a teacher of the same shape and tokenizer with other weights in
    teacher/, one with an extra token in other_vocab/, and the SFT data."""
    root = tiny_ws("distill", rows=[{"input": f"{k['input']}"} for k in FACTS])
    teacher, tok = tiny_model_and_tokenizer(seed=1)
    teacher.save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    other, tok2 = tiny_model_and_tokenizer(seed=2)
    tok2.add_tokens(["<extra>"])
    other.resize_token_embeddings(len(tok2))
    other.save_pretrained(root / "other_vocab")
    tok2.save_pretrained(root / "other_vocab")
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in FACTS))
    return root


def kd_flags(ws, out, **kv):
    argv = ["--model.model_name_or_path", str(ws / "tiny"), "--teacher.model_name_or_path", str(ws / "teacher"),
            "--data.dataset", str(ws / "sft.jsonl"), "--ckpt.output_dir", str(out), "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--train.batch_size", "4", "--train.micro_batch_size", "2",
            "--adam.lr", "3e-3", "--train.lr_warmup_ratio", "0", "--train.lr_scheduler", "constant"]
    for k, v in kv.items():
        argv += [f"--{k.replace('__', '.')}", str(v)]
    return [str(a) for a in argv]


def test_kd_lowers_the_kl_to_the_teacher(ws, tmp_path):
    cfg = KDConfig.from_args(kd_flags(ws, tmp_path / "kd", train__max_epochs=8, kd__coef=0.9, kd__chunk_size=3))
    trainer = KDTrainer.from_config(cfg, eval_dataset=str(ws / "sft.jsonl"))
    before = trainer.algorithm.evaluate()
    result = trainer.train()
    after = trainer.final_metrics
    print(f"KD eval KL to the teacher: {before['eval/kl']:.4f} -> {after['eval/kl']:.4f}")
    assert after["eval/kl"] < 0.5 * before["eval/kl"]
    assert result["kl"] >= 0 and {"loss", "nll", "kl"} <= result.keys()
    assert (tmp_path / "kd" / "final" / "model.safetensors").exists()


def test_kd_loss_mixes_nll_and_kl_by_the_coefficient(ws, tmp_path):
    """loss = (1 - coef) NLL + coef KL, each term the token mean of the step; a teacher equal to the
    student gives KL 0 (and the same weights as SFT with the NLL scaled by 1 - coef)."""
    cfg = KDConfig.from_args(kd_flags(ws, tmp_path / "same", teacher__model_name_or_path=ws / "tiny",
                                      kd__coef=0.25, train__max_steps=1))
    trainer = KDTrainer.from_config(cfg)
    items = trainer.train_items[:4]
    loss, metrics = trainer.algorithm.micro_loss(items, items)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["loss"] == pytest.approx(0.75 * metrics["nll"], rel=1e-6)
    with torch.no_grad():
        logp, _, mask = trainer.algorithm.token_terms(items)
    assert metrics["nll"] == pytest.approx(float((-logp * mask).sum() / mask.sum()), rel=1e-6)


def test_kd_cli_runs_and_refuses_bad_teachers_in_one_line(ws, tmp_path, capsys):
    assert main(["train", "kd", *kd_flags(ws, tmp_path / "cli", train__max_steps=1, teacher_offload="true")]) == 0
    assert (tmp_path / "cli" / "summary.json").exists()
    capsys.readouterr()
    argv = kd_flags(ws, tmp_path / "none")
    i = argv.index("--teacher.model_name_or_path")
    assert main(["train", "kd", *argv[:i], *argv[i + 2:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --teacher.model_name_or_path is required")
    assert main(["train", "kd", *kd_flags(ws, tmp_path / "vocab", teacher_model=ws / "other_vocab")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after transformers' loading bars)
    assert err.startswith("error: the teacher") and "another tokenizer" in err
    assert main(["train", "kd", *kd_flags(ws, tmp_path / "coef", kd_coef=1.5)]) == 2
    assert "--kd.coef must be in [0, 1]" in capsys.readouterr().err


def opd_flags(ws, out, **kv):
    argv = ["--model.model_name_or_path", ws / "tiny", "--teacher.model_name_or_path", ws / "teacher",
            "--data.prompt_dataset", ws / "prompts.jsonl", "--ckpt.output_dir", out, "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "2",
            "--train.batch_size", "16", "--train.micro_batch_size", "8", "--generate.max_new_tokens", "8",
            "--actor.adam.lr", "1e-2", "--actor.lr_scheduler", "constant", "--actor.autocast", "none",
            "--opd.kl_estimator", "k3"]
    for k, v in kv.items():
        argv += [f"--{k.replace('__', '.')}", v]
    return [str(a) for a in argv]


def kl_curve(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["opd/kl"] for r in rows if "opd/kl" in r]


@pytest.mark.parametrize("topk", [0, 32])
def test_opd_lowers_the_students_kl_to_the_teacher_on_its_samples(ws, tmp_path, topk):
    out = tmp_path / f"opd{topk}"
    assert main(["train", "opd", *opd_flags(ws, out, train__num_episodes=16, opd__topk=topk)]) == 0
    kl = kl_curve(out)
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    print(f"OPD topk={topk}: KL to the teacher on the student's samples {first:.4f} -> {last:.4f} ({len(kl)} steps)")
    assert len(kl) == 16 and last < 0.75 * first


def test_opd_cli_refuses_a_missing_teacher_and_another_tokenizer(ws, tmp_path, capsys):
    argv = opd_flags(ws, tmp_path / "none")
    i = argv.index("--teacher.model_name_or_path")
    assert main(["train", "opd", *argv[:i], *argv[i + 2:]]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: --teacher.model_name_or_path is required")
    assert main(["train", "opd", *opd_flags(ws, tmp_path / "v", teacher__model_name_or_path=ws / "other_vocab")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: the teacher") and "another tokenizer" in err
    assert main(["train", "opd", *opd_flags(ws, tmp_path / "p", generate__top_p=0.9)]) == 2
    assert "--opd.topk 0" in capsys.readouterr().err


def test_train_rl_adds_the_teachers_per_token_reward_to_a_task_reward(tiny_ws, ws, tmp_path):
    sevens = tiny_ws("distill_rl", rows=[{"input": f["input"]} for f in FACTS], sevens=True)
    out = tmp_path / "rl"
    argv = ["train", "rl", "--actor.model_name_or_path", ws / "tiny", "--data.prompt_dataset", sevens / "prompts.jsonl",
            "--reward.remote_url", sevens / "reward.py", "--algo.teacher_model_name_or_path", ws / "teacher",
            "--algo.teacher_coef", "0.5", "--ckpt.output_dir", out, "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2",
            "--rollout.max_new_tokens", "6", "--train.batch_size", "8", "--train.micro_batch_size", "4",
            "--train.max_steps", "2"]
    assert main([str(a) for a in argv]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all({"opd/kl", "opd/reward", "reward"} <= r.keys() for r in rows if "policy_loss" in r)
