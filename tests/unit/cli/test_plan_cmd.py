"""`rlhfkit plan` prints the counts and the memory estimate from flags and config.json alone."""

import json

from rlhfkit.cli.main import main
from rlhfkit.models import tiny_model_and_tokenizer


def test_plan_prints_counts_memory_and_warnings(tmp_path, capsys):
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.config.save_pretrained(tmp_path / "tiny")  # config.json only: plan must not need weights
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"input": f"q{i}"}) + "\n" for i in range(100)))
    rc = main(["plan", "--actor.model_name_or_path", str(tmp_path / "tiny"),
               "--data.prompt_dataset", str(tmp_path / "p.jsonl"), "--rollout.batch_size", "16",
               "--train.batch_size", "64", "--train.micro_batch_size", "8", "--train.max_epochs", "2",
               "--train.num_episodes", "3", "--plan.prompt_tokens", "40"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "optimizer steps in total       72" in out and "rollouts per episode           6" in out
    assert "peak" in out and "GiB" in out
    assert "4 of 100 prompts are left out" in out


def test_plan_refuses_what_train_rl_refuses(capsys):
    rc = main(["plan", "--rollout.batch_size", "3", "--rollout.n_samples_per_prompt", "2",
               "--train.batch_size", "4", "--train.micro_batch_size", "2", "--plan.num_prompts", "9"])
    assert rc == 2
    assert "must divide" in capsys.readouterr().err


def test_plan_refuses_a_label_reward_without_labels_as_train_rl_does(tmp_path, capsys):
    """builtin:math scores against each prompt's label: without --data.label_key, plan fails as train rl."""
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.config.save_pretrained(tmp_path / "tiny")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"input": f"q{i}", "answer": "1"}) + "\n" for i in range(8)))
    argv = ["plan", "--actor.model_name_or_path", str(tmp_path / "tiny"), "--data.prompt_dataset",
            str(tmp_path / "p.jsonl"), "--reward.remote_url", "builtin:math", "--rollout.batch_size", "4",
            "--train.batch_size", "4", "--train.micro_batch_size", "2"]
    assert main(argv) == 2
    assert "builtin:math scores each response" in capsys.readouterr().err
    assert main([*argv, "--data.label_key", "answer"]) == 0
