"""The data and names users bring, through the real CLI: conversational prompts (message lists) in
jsonl, parquet and `datasets` folders for `train rl`, `plan` and `eval`; SFT and DPO chat data; and
hub names for the model and the dataset, served offline from a hub cache laid out under a
temporary HF_HOME."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhfkit.cli.main import main
from tests.integration.conftest import refuse

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("prompts.jsonl", "prompts.parquet", "prompts_ds")


def conversation(i: int) -> list[dict]:
    return [{"role": "system", "content": "add"}, {"role": "user", "content": f"{i % 10}+{i // 10}="}]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    """The tiny model (its tokenizer has a chat template), the sevens reward, and 16 conversational
    prompts as jsonl, parquet and a datasets folder (a DatasetDict: train 16, test 4)."""
    root = tiny_ws("real_inputs", sevens=True)
    rows = [{"messages": conversation(i), "a": str(i)} for i in range(16)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), root / "prompts.parquet")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:4])}).save_to_disk(str(root / "prompts_ds"))
    conv = [{"role": "user", "content": "a="}, {"role": "assistant", "content": "cat"},
            {"role": "user", "content": "b="}, {"role": "assistant", "content": "dog"}]
    (root / "sft.jsonl").write_text("".join(json.dumps({"messages": conv}) + "\n" for _ in range(8)))
    pairs = [{"chosen": conv[:1] + [{"role": "assistant", "content": "7" * (1 + i % 3)}],
              "rejected": conv[:1] + [{"role": "assistant", "content": "1" * (1 + i % 3)}]} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(pairs), root / "pairs.parquet")
    return root


def rl_flags(ws, out, **over):
    f = {
        "actor.model_name_or_path": ws / "tiny", "data.prompt_dataset": ws / "prompts.jsonl",
        "data.input_key": "messages", "data.label_key": "a", "data.apply_chat_template": "true",
        "reward.remote_url": ws / "reward.py", "rollout.batch_size": 8, "rollout.n_samples_per_prompt": 2,
        "rollout.max_new_tokens": 4, "train.batch_size": 16, "train.micro_batch_size": 8, "train.max_steps": 1,
        "actor.autocast": "none", "logger.progress_bar": "false", "train.num_threads": 1, "ckpt.output_dir": out,
    }
    f.update(over)
    return [x for k, v in f.items() if v is not None for x in (f"--{k}", str(v))]


def test_the_tiny_tokenizer_has_a_chat_template(ws):
    from rlhfkit.models import load_tokenizer

    tok = load_tokenizer(ws / "tiny")
    assert tok.apply_chat_template(conversation(3), tokenize=False, add_generation_prompt=True) == (
        "system: add<eos>user: 3+0=<eos>assistant: ")


@pytest.mark.parametrize("source", SOURCES)
def test_train_rl_on_conversational_prompts(ws, tmp_path, source):
    out = tmp_path / "run"
    argv = rl_flags(ws, out, **{"data.prompt_dataset": ws / source, "eval.dataset": ws / source,
                                "eval.split": "test", "eval.max_samples": 2})
    assert main(["train", "rl", *argv]) == 0
    prompts = {json.loads(line)["prompt"] for line in (out / "samples.jsonl").read_text().splitlines()}
    assert prompts and all(p.startswith("system: add<eos>user: ") and p.endswith("=<eos>assistant: ")
                           for p in prompts), prompts
    assert (out / "final" / "config.json").is_file()


@pytest.mark.parametrize("source", SOURCES)
def test_plan_counts_conversational_prompts(ws, tmp_path, capsys, source):
    assert main(["plan", *rl_flags(ws, tmp_path / "run", **{"data.prompt_dataset": ws / source})]) == 0
    assert "dataset prompts                16" in capsys.readouterr().out


@pytest.mark.parametrize("source", SOURCES)
def test_eval_on_conversational_prompts(ws, tmp_path, source):
    out = tmp_path / "eval"
    argv = rl_flags(ws, out, **{"data.prompt_dataset": None, "eval.dataset": ws / source, "eval.split": "test"})
    assert main(["eval", *argv]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["prompts"] == (4 if source == "prompts_ds" else 16)
    rows = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert rows[0]["prompt"] == "system: add<eos>user: 0+0=<eos>assistant: "


@pytest.mark.parametrize("command", ["train rl", "plan", "eval"])
@pytest.mark.parametrize("source", SOURCES)
def test_message_lists_without_chat_template_are_refused_before_models_load(ws, tmp_path, capsys, command,
                                                                            source):
    over = {"data.apply_chat_template": None, "actor.model_name_or_path": tmp_path / "no_model",
            "data.prompt_dataset": ws / source, "eval.dataset": ws / source if command == "eval" else None}
    line = refuse([*command.split(), *rl_flags(ws, tmp_path / "run", **over)], capsys,
                  "key 'messages': a message list, which only the tokenizer's chat template can turn into a "
                  "prompt: add --data.apply_chat_template")
    assert str(ws / source) in line


def test_sft_on_conversations_through_the_cli(ws, tmp_path):
    out = tmp_path / "sft"
    argv = ["train", "sft", "--model.model_name_or_path", ws / "tiny", "--data.dataset", ws / "sft.jsonl",
            "--data.input_key", "messages", "--data.apply_chat_template", "--train.batch_size", "4",
            "--train.micro_batch_size", "4", "--train.max_steps", "2", "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--ckpt.output_dir", out]
    assert main([str(a) for a in argv]) == 0
    assert (out / "final" / "config.json").is_file()
    argv = [a for a in argv if a != "--data.apply_chat_template"]
    assert main([str(a) for a in argv]) == 2


def test_dpo_on_conversation_pairs_through_the_cli(ws, tmp_path, capsys):
    out = tmp_path / "dpo"
    argv = ["train", "dpo", "--model.model_name_or_path", ws / "tiny", "--data.dataset", ws / "pairs.parquet",
            "--data.prompt_key", "none", "--data.apply_chat_template", "--train.batch_size", "4",
            "--train.micro_batch_size", "4", "--train.max_steps", "2", "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--ckpt.output_dir", out]
    assert main([str(a) for a in argv]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("margin" in m for m in metrics)
    argv = [a for a in argv if a != "--data.apply_chat_template"]
    refuse(argv, capsys, "key 'chosen': a message list, which only the tokenizer's chat template can turn into "
                         "text: add --data.apply_chat_template")


# --------------------------------------------------------------------------- hub names


HUB_RUN = """
import sys
from rlhfkit.cli.main import main
argv = sys.argv[1:]
assert main(["train", "rl", *argv]) == 0
assert main(["plan", *argv]) == 0
assert main(["eval", *argv]) == 0
models = ["--ref.model_name_or_path", "org/tiny", "--algo.kl.init_coef", "0.01", "--algo.advantage.estimator",
          "gae", "--critic.model_name_or_path", "org/rm", "--reward.remote_url", "none",
          "--reward.model_name_or_path", "org/rm", "--eval.dataset", "none", "--ckpt.output_dir", "run_models"]
sys.exit(main(["train", "rl", *argv, *models]))
"""


def test_train_rl_plan_and_eval_with_hub_names_offline(ws, tmp_path, hub_repo):
    """org/tiny, org/rm (a reward model on it) and org/sums laid out as huggingface_hub's cache holds
    them under a fresh HF_HOME; a fresh process with HF_HUB_OFFLINE=1 (read at import, as users set
    it) runs train rl, plan and eval on the names alone, then train rl with the reference, critic
    and reward model named on the hub too."""
    from rlhfkit.models import load_tokenizer
    from rlhfkit.models.reward import init_reward_model

    home = tmp_path / "hf_home"
    hub_repo(home / "hub", "model", "org/tiny", ws / "tiny")
    tok = load_tokenizer(ws / "tiny")
    init_reward_model(ws / "tiny", tok.pad_token_id).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    hub_repo(home / "hub", "model", "org/rm", tmp_path / "rm")
    src = tmp_path / "sums"
    for split, n in (("train", 16), ("test", 4)):
        (src / "main").mkdir(parents=True, exist_ok=True)
        rows = [{"question": f"{i % 10}+{i // 10}=", "answer": str(i % 10 + i // 10)} for i in range(n)]
        pq.write_table(pa.Table.from_pylist(rows), src / "main" / f"{split}-00000-of-00001.parquet")
    (src / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n"
                                   "    path: main/train-*\n  - split: test\n    path: main/test-*\n---\n")
    hub_repo(home / "hub", "dataset", "org/sums", src)
    out = tmp_path / "run"
    argv = rl_flags(ws, out, **{"actor.model_name_or_path": "org/tiny", "data.prompt_dataset": "org/sums",
                                "data.prompt_dataset_config": "main", "data.prompt_split": "train",
                                "data.input_key": "question", "data.label_key": "answer",
                                "eval.dataset": "org/sums", "eval.dataset_config": "main", "eval.split": "test"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", HUB_RUN, *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "dataset prompts                16" in proc.stdout
    report = json.loads((out / "eval.json").read_text())
    assert report["prompts"] == 4
    assert json.loads((out / "config.json").read_text())["actor"]["model_name_or_path"] == "org/tiny"
    run = json.loads((tmp_path / "run_models" / "config.json").read_text())
    assert (run["critic"]["model_name_or_path"], run["reward"]["model_name_or_path"]) == ("org/rm", "org/rm")
    assert (tmp_path / "run_models" / "final" / "config.json").is_file()


@pytest.mark.parametrize("command", ["train rl", "plan", "eval"])
def test_missing_hub_names_are_one_line_saying_how_to_fetch_them(ws, tmp_path, capsys, command):
    name = "rlhfkit-test/no-such-thing"
    data = {"data.prompt_dataset": name, "eval.dataset": name if command == "eval" else None}
    refuse([*command.split(), *rl_flags(ws, tmp_path / "run", **data)], capsys,
           f"dataset '{name}': no local file or folder of that name, and it is not in the Hugging Face cache "
           f"(HF_HUB_OFFLINE is set, so the hub is not asked); fetch it with `hf download --repo-type dataset {name}`")
    refuse([*command.split(), *rl_flags(ws, tmp_path / "run", **{"actor.model_name_or_path": name,
                                                                  "eval.dataset": ws / "prompts.jsonl"})], capsys,
           f"model '{name}': no local folder or file of that name, and it is not in the Hugging Face cache "
           f"(HF_HUB_OFFLINE is set, so the hub is not asked); fetch it with `hf download {name}`")
