"""Under nohup / a batch scheduler / `| tee` (stdout not a terminal) `train rl` and `train sft`
print one plain line per step: step/total, the step's reward and KL (RL) or loss (SFT), seconds
per step. `--logger.log_level` decides which `rlhfkit` log messages reach the console."""

import json
import re

import pytest
import torch

from rlhfkit.cli.main import main
from rlhfkit.tracking.progress import set_log_level


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("console", [{"q": f"x{i}:", "a": str(i)} for i in range(8)], sevens=True)
    (root / "sft.jsonl").write_text("".join(json.dumps({"input": f"{i}=", "output": str(i % 3)}) + "\n"
                                            for i in range(8)))
    return root


@pytest.fixture(autouse=True)
def restore():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
    set_log_level("info")


def test_train_rl_prints_a_line_per_step_when_stdout_is_not_a_terminal(ws, tmp_path, capsys):
    rc = main(["train", "rl", "--actor.model_name_or_path", str(ws / "tiny"),
               "--data.prompt_dataset", str(ws / "prompts.jsonl"), "--data.input_key", "q",
               "--reward.remote_url", str(ws / "reward.py"), "--rollout.batch_size", "4",
               "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "4", "--train.batch_size", "8",
               "--train.micro_batch_size", "8", "--train.max_steps", "2", "--actor.autocast", "none",
               "--algo.kl.init_coef", "0.01", "--train.num_threads", "1", "--ckpt.output_dir", str(tmp_path / "rl"),
               "--ckpt.load_enable", "--logger.log_level", "warning"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith("train ")]
    assert len(lines) == 2, out
    assert re.fullmatch(r"train 1/2 reward=\S+ kl=\S+ \d+\.\d\ds/step \d+:\d\d left", lines[0]), lines[0]
    assert re.fullmatch(r"train 2/2 reward=\S+ kl=\S+ \d+\.\d\ds/step", lines[1]), lines[1]
    # the "no checkpoint yet" note of --ckpt.load_enable is a warning: shown at level warning
    assert "warning: --ckpt.load_enable: no checkpoint in" in err


def test_log_level_error_hides_warnings(ws, tmp_path, capsys):
    rc = main(["train", "rl", "--actor.model_name_or_path", str(ws / "tiny"),
               "--data.prompt_dataset", str(ws / "prompts.jsonl"), "--data.input_key", "q",
               "--reward.remote_url", str(ws / "reward.py"), "--rollout.batch_size", "4",
               "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "4", "--train.batch_size", "8",
               "--train.micro_batch_size", "8", "--train.max_steps", "1", "--actor.autocast", "none",
               "--train.num_threads", "1", "--ckpt.output_dir", str(tmp_path / "rl"), "--ckpt.load_enable",
               "--logger.log_level", "error", "--logger.progress_bar", "false"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "no checkpoint" not in err and not any(line.startswith("train 1/1") for line in out.splitlines())


def test_train_sft_prints_a_line_per_step_with_the_loss(ws, tmp_path, capsys):
    rc = main(["train", "sft", "--model.model_name_or_path", str(ws / "tiny"), "--data.dataset", str(ws / "sft.jsonl"),
               "--train.batch_size", "4", "--train.micro_batch_size", "4", "--train.max_steps", "2",
               "--train.num_threads", "1", "--ckpt.output_dir", str(tmp_path / "sft")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.search(r"^train 1/2 loss=\S+ \d+\.\d\ds/step", out, re.M), out
    assert re.search(r"^train 2/2 loss=\S+ \d+\.\d\ds/step", out, re.M), out
