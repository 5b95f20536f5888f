"""OpenRLHF's train_ppo_ray options that mix prompt datasets and penalise truncated samples, run through
`rlhfkit train rl` with OpenRLHF's own flag names on a tiny model: --prompt_data a,b with
--prompt_data_probs, and --stop_properly_penalty_coef."""

import json

from rlhfkit.cli.main import main
from tests.integration.conftest import refuse


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_prompt_files_mixed_by_their_probabilities_and_truncated_samples_penalised(tiny_ws, tmp_path):
    ws = tiny_ws("orl_rl", sevens=True)
    (ws / "a.jsonl").write_text(json.dumps({"q": "a0:", "a": "A"}) + "\n")
    (ws / "b.jsonl").write_text("".join(json.dumps({"q": f"b{i}:", "a": "B"}) + "\n" for i in range(4)))
    out = tmp_path / "run"
    argv = ["train", "rl", "--pretrain", ws / "tiny", "--prompt_data", f"{ws / 'a.jsonl'},{ws / 'b.jsonl'}",
            "--prompt_data_probs", "0.8,0.2", "--input_key", "q", "--label_key", "a",
            "--remote_rm_url", ws / "reward.py", "--stop_properly_penalty_coef", "-0.5",
            "--rollout_batch_size", "4", "--n_samples_per_prompt", "2", "--generate_max_len", "4",
            "--train_batch_size", "8", "--micro_train_batch_size", "8", "--train.max_steps", "2",
            "--num_episodes", "1", "--logger.log_samples", "8", "--actor.autocast", "none",
            "--logger.progress_bar", "false", "--train.num_threads", "1", "--save_path", out]
    assert main([str(a) for a in argv]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["data"]["prompt_probs"] == "0.8,0.2" and cfg["reward"]["stop_properly_penalty_coef"] == -0.5
    # a.jsonl's one prompt is ~80% of the mix (concatenated, it would be 1 prompt of 5, at most 1 of 4 a batch)
    samples = lines(out / "samples.jsonl")  # every sample of both steps, with its shaped reward
    assert len(samples) == 16 and sum(s["prompt"].startswith("a0:") for s in samples) > 8
    steps = [m for m in lines(out / "metrics.jsonl") if "stop_properly_penalised" in m]
    assert len(steps) == 2
    for m in steps:  # the samples cut at 4 tokens are penalised: the count is the truncated share of 8
        assert m["stop_properly_penalised"] == round(m["truncated_frac"] * 8) and m["truncated_frac"] > 0
    # the sevens reward is >= 0: exactly the penalised samples have the reward -0.5 (coef < 0 replaces it)
    assert sum(s["reward"] == -0.5 for s in samples) == sum(m["stop_properly_penalised"] for m in steps)


def test_bad_probabilities_stop_the_cli_before_any_model_loads(tiny_ws, tmp_path, capsys):
    ws = tiny_ws("orl_rl_bad", [{"q": "x", "a": "1"}], sevens=True)
    prompts = ws / "prompts.jsonl"
    refuse(["train", "rl", "--pretrain", ws / "no_such_model", "--prompt_data", f"{prompts},{prompts}",
            "--prompt_data_probs", "0.5", "--input_key", "q", "--remote_rm_url", ws / "reward.py"], capsys,
           "--data.prompt_probs '0.5' has 1 probabilities for 2 dataset(s)")
