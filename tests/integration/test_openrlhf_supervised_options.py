"""OpenRLHF's supervised options, run through the CLI with its own flag names on a tiny model:
continued pretraining on a mix of two datasets, a reward model with margins, DPO + NLL."""

import json

import pytest
import torch

from rlhfkit.cli.main import main


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


COMMON = ["--logger.progress_bar", "false", "--train.num_threads", "1", "--lr_warmup_ratio", "0"]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("orl_sup")
    write(root / "a.jsonl", [{"text": "abab abab abab"} for _ in range(4)])
    write(root / "b.jsonl", [{"text": "xyz xyz"} for _ in range(2)])
    pairs = [{"prompt": f"q{i}:", "chosen": "77", "rejected": "11", "margin": float(i % 3)} for i in range(8)]
    write(root / "pairs.jsonl", pairs)
    return root


def test_pretrain_mode_on_a_mix_of_two_datasets_learns_the_texts(ws, tmp_path):
    out = tmp_path / "pt"
    argv = ["train", "sft", "--pretrain", str(ws / "tiny"), "--dataset", f"{ws / 'a.jsonl'},{ws / 'b.jsonl'}",
            "--dataset_probs", "0.5,0.5", "--input_key", "text", "--pretrain_mode", "--train_batch_size", "4",
            "--micro_train_batch_size", "2", "--max_epochs", "8", "--learning_rate", "1e-2", "--lr_scheduler",
            "constant", "--save_path", str(out), *COMMON]
    assert main(argv) == 0
    losses = [m["loss"] for m in metrics(out) if "loss" in m]
    assert losses[-1] < 0.5 * losses[0]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"]["pretrain_mode_enable"] and cfg["data"]["dataset_probs"] == "0.5,0.5"


def test_reward_model_with_margins_and_dpo_with_nll_run(ws, tmp_path):
    rm = tmp_path / "rm"
    assert main(["train", "rm", "--pretrain", str(ws / "tiny"), "--dataset", str(ws / "pairs.jsonl"),
                 "--margin_loss", "--train_batch_size", "4", "--micro_train_batch_size", "2", "--max_epochs", "2",
                 "--save_path", str(rm), *COMMON]) == 0
    assert json.loads((rm / "config.json").read_text())["model"]["margin_loss_enable"] is True
    dpo = tmp_path / "dpo"
    assert main(["train", "dpo", "--pretrain", str(ws / "tiny"), "--dataset", str(ws / "pairs.jsonl"),
                 "--nll_loss_coef", "0.5", "--train_batch_size", "4", "--micro_train_batch_size", "2",
                 "--max_epochs", "2", "--learning_rate", "3e-3", "--save_path", str(dpo), *COMMON]) == 0
    ms = [m for m in metrics(dpo) if "nll_loss" in m]
    assert len(ms) == 4 and ms[-1]["nll_loss"] < ms[0]["nll_loss"]  # the chosen answers grow likelier
    assert torch.isfinite(torch.tensor([m["loss"] for m in ms])).all()
