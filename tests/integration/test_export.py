"""`rlhfkit export`: checkpoints of supervised runs (full weights, LoRA, a reward model with LoRA) become
HF folders that `from_pretrained` loads without peft, with the trained model's logits; and
--ckpt.keep_best keeps the checkpoint of the best evaluation. (FSDP-sharded checkpoints:
tests/integration/test_fsdp_resume.py.)"""

import json

import pytest
import torch

from rlhfkit.api.export import export_checkpoint
from rlhfkit.api.supervised import RMTrainer, SFTTrainer
from rlhfkit.cli.main import main
from rlhfkit.config.preference import RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import CheckpointError

ROWS = [{"input": f"{k}=", "output": v} for k, v in [("a", "cat"), ("b", "dog"), ("c", "owl"), ("d", "fox")]]
PAIRS = [{"prompt": f"q{i}:", "chosen": "77", "rejected": "11"} for i in range(8)]
IDS = torch.tensor([[5, 9, 12, 20, 7, 3]])


def sft(ws, out, *extra):
    argv = ["--model.model_name_or_path", str(ws / "tiny"), "--train.batch_size", "2", "--train.micro_batch_size",
            "2", "--train.max_steps", "3", "--adam.lr", "1e-2", "--ckpt.save_steps", "3", "--ckpt.output_dir",
            str(out), "--logger.progress_bar", "false", "--train.num_threads", "1", *extra]
    trainer = SFTTrainer.from_config(SFTConfig.from_args(argv), train_dataset=ROWS * 2)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def ws(tiny_ws):
    return tiny_ws("export", [{"q": f"x{i}y:", "a": str(i)} for i in range(8)], sevens=True)


@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpoint_exports_to_a_folder_with_the_trained_logits(ws, tmp_path, lora):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = sft(ws, tmp_path / "run", *(["--ds.lora.rank", "4", "--ds.lora.alpha", "8"] if lora else []))
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000003"
    assert (ckpt / "model.adapter" / "adapter_config.json").is_file() == lora
    out = export_checkpoint(ckpt, tmp_path / "out")
    assert not (out / "adapter_config.json").exists()  # a plain model: the adapters are merged in
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    trained = trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, trained(input_ids=IDS).logits, rtol=1e-5, atol=1e-5)
        untrained = AutoModelForCausalLM.from_pretrained(ws / "tiny")(input_ids=IDS).logits
    assert (model(input_ids=IDS).logits - untrained).abs().max() > 1e-2  # it did train
    assert AutoTokenizer.from_pretrained(out).get_vocab() == trainer.tokenizer.get_vocab()
    again = export_checkpoint(tmp_path / "run", tmp_path / "out2")  # the run folder: its latest checkpoint
    assert (again / "model.safetensors").is_file()


def test_a_reward_model_with_lora_exports_as_a_sequence_classifier(ws, tmp_path):
    from transformers import AutoModelForSequenceClassification

    argv = ["--model.model_name_or_path", str(ws / "tiny"), "--train.batch_size", "4", "--train.micro_batch_size",
            "4", "--train.max_steps", "2", "--adam.lr", "1e-2", "--ckpt.save_steps", "2", "--ds.lora.rank", "4",
            "--ckpt.output_dir", str(tmp_path / "rm"), "--logger.progress_bar", "false"]
    trainer = RMTrainer.from_config(RMConfig.from_args(argv), train_dataset=PAIRS)
    trainer.train()  # final/ merges the adapters in place, so compare against the saved final model
    out = export_checkpoint(tmp_path / "rm" / "checkpoints" / "step_00000002", tmp_path / "out")
    rm = AutoModelForSequenceClassification.from_pretrained(out).eval()
    final = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm" / "final").eval()
    with torch.no_grad():
        torch.testing.assert_close(rm(input_ids=IDS).logits, final(input_ids=IDS).logits, rtol=1e-5, atol=1e-5)


def test_keep_best_keeps_the_step_of_the_lowest_eval_loss_and_the_cli_exports_it(ws, tmp_path, capsys):
    out = tmp_path / "run"
    sft(ws, out, "--train.max_steps", "6", "--train.max_epochs", "2", "--ckpt.save_steps", "1", "--ckpt.max_num", "1",
        "--train.eval_steps", "1", "--data.eval_split", "0.25", "--adam.lr", "0.3", "--ckpt.keep_best", "eval/loss:min")
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {}
    for row in evals:
        if "eval/loss" in row:
            by_step.setdefault(row["step"], row["eval/loss"])  # the periodic one (the final repeats step 6)
    manifest = json.loads((out / "checkpoints" / "best" / "manifest.json").read_text())
    step = min(by_step, key=by_step.get)
    assert manifest["step"] == step and manifest["value"] == pytest.approx(by_step[step])
    assert manifest["metric"] == "eval/loss" and manifest["mode"] == "min"
    assert [p.name for p in (out / "checkpoints").glob("step_*")] == ["step_00000006"]  # best/ beside max_num 1
    assert main(["export", str(out / "checkpoints" / "best"), str(tmp_path / "best")]) == 0
    assert "best" in capsys.readouterr().out
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "best")
    kept = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "best" / "model")
    for (k, a), (_, b) in zip(exported.state_dict().items(), kept.state_dict().items()):
        assert torch.equal(a, b), k


def test_export_errors_are_one_line(ws, tmp_path, capsys):
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        export_checkpoint(tmp_path, tmp_path / "out")
    assert main(["export", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: usage: rlhfkit export CKPT OUT")


def test_keep_best_in_rl_judges_every_evaluation_and_keeps_the_best(ws, tmp_path):
    out = tmp_path / "rl"
    flags = {"actor.model_name_or_path": ws / "tiny", "data.prompt_dataset": ws / "prompts.jsonl",
             "eval.dataset": ws / "prompts.jsonl", "data.input_key": "q", "data.label_key": "a",
             "reward.remote_url": ws / "reward.py", "rollout.batch_size": 4, "rollout.n_samples_per_prompt": 2,
             "rollout.max_new_tokens": 6, "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_steps": 3,
             "train.num_episodes": 2,
             "algo.advantage.estimator": "group_norm", "actor.adam.lr": 5e-2, "train.num_threads": 1,
             "eval.steps": 1, "eval.temperature": 1.0, "ckpt.keep_best": "eval/reward", "ckpt.output_dir": out,
             "logger.progress_bar": "false", "actor.autocast": "none"}
    assert main(["train", "rl", *[x for k, v in flags.items() for x in (f"--{k}", str(v))]]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = {}
    for row in rows:
        if "eval/reward" in row:
            evals.setdefault(row["step"], row["eval/reward"])  # before training (0), steps 1-2, the final (3)
    assert sorted(evals) == [0, 1, 2, 3]
    manifest = json.loads((out / "checkpoints" / "best" / "manifest.json").read_text())
    step = max(evals, key=lambda s: (evals[s], -s))  # the first of equal values is kept
    assert (manifest["step"], manifest["value"]) == (step, pytest.approx(evals[step]))
    assert export_checkpoint(out / "checkpoints" / "best", tmp_path / "best").is_dir()
