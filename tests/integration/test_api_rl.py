"""The Python API of RL training: the same run through the CLI (a subprocess) and the API (in
process) is identical; every reward contract and dataset format a user brings works."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import rlhfkit
from rlhfkit.config.rl import ActorConfig, CkptConfig, DataConfig, LoggerConfig, RLConfig, RolloutConfig, TrainConfig
from rlhfkit.errors import RewardError
from tests.integration.conftest import rl_flags

VOLATILE = ("time/", "rollout_tokens_per_s")


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i), "level": i % 3} for i in range(32)]
    return tiny_ws("api", rows, sevens=True)


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "rollout.batch_size": "4", "rollout.n_samples_per_prompt": "4", "rollout.max_new_tokens": "6",
        "rollout.temperature": "1.0", "train.batch_size": "8", "train.micro_batch_size": "4",
        "train.max_steps": "2", "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant",
        "train.num_threads": "1", **over})


def stable(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


@pytest.fixture
def threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def train(cfg_flags, **kwargs):
    trainer = rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args(cfg_flags), **kwargs)
    return trainer, trainer.train()


def test_cli_and_api_give_identical_metrics_and_weights(ws, tmp_path, threads):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "rlhfkit.cli.main", "train", "rl", *flags(ws, tmp_path / "cli")],
                   check=True, env=env, capture_output=True)
    trainer, metrics = train(flags(ws, tmp_path / "api"))
    assert stable(tmp_path / "cli") == stable(tmp_path / "api") and len(stable(tmp_path / "api")) == 2
    a, b = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("cli", "api"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics["reward"] == stable(tmp_path / "api")[-1]["reward"] and trainer.step == 2
    saved = trainer.save(tmp_path / "again")  # another HF folder, the same weights
    c = load_file(saved / "model.safetensors")
    assert all(torch.equal(b[k], c[k]) for k in b)


def test_dataset_as_path_list_of_dicts_and_datasets_object_give_the_same_run(ws, tmp_path, threads):
    from datasets import Dataset

    rows = [json.loads(line) for line in (ws / "prompts.jsonl").read_text().splitlines()]
    runs = []
    for name, data in (("path", None), ("list", rows), ("dataset", Dataset.from_list(rows))):
        out = tmp_path / name
        train(flags(ws, out, **{"train.max_steps": "1"}), train_dataset=data)
        runs.append(stable(out))
    assert runs[0] == runs[1] == runs[2]


def test_openrlhf_file_and_callable_get_dataset_columns(ws, tmp_path, threads):
    seen = {}

    def reward_func(queries, prompts, labels, level, **kwargs):  # OpenRLHF's contract; `level` is a column
        seen.update(level=level, labels=labels, responses=kwargs["responses"])
        return [1.0 if r.startswith("7") else 0.0 for r in kwargs["responses"]]

    _, m = train(flags(ws, tmp_path / "callable", **{"train.max_steps": "1"}), reward_fn=reward_func)
    assert len(seen["level"]) == 16 and set(seen["level"]) <= {0, 1, 2}
    assert all(str(int(lbl)) == lbl for lbl in seen["labels"])
    _, m = train(flags(ws, tmp_path / "file", **{"train.max_steps": "1"}), reward_fn=str(ws / "reward.py"))
    assert "reward_extra/sevens" in m  # the file's extra_logs


def test_trl_callable_with_extra_columns(ws, tmp_path, threads):
    seen = {}

    def count_sevens(completions, a, level, completion_ids, prompts, **kwargs):  # TRL's contract
        seen.update(completions=completions, a=a, level=level, ids=completion_ids, prompts=prompts)
        return [c.count("7") / 8 for c in completions]

    _, m = train(flags(ws, tmp_path / "trl", **{"train.max_steps": "1"}), reward_fn=count_sevens)
    assert all(isinstance(c, str) for c in seen["completions"]) and len(seen["ids"]) == 16
    assert all(p.endswith(":") for p in seen["prompts"]) and len(seen["a"]) == len(seen["level"]) == 16


def test_trl_callable_on_chat_prompts_sees_message_completions(ws, tmp_path, threads):
    rows = [{"q": [{"role": "user", "content": f"say {i}"}], "a": str(i)} for i in range(8)]
    seen = {}

    def reward(completions, prompts, **kwargs):
        seen.update(completions=completions, prompts=prompts)
        return [float(len(c[0]["content"]) > 2) for c in completions]

    train(flags(ws, tmp_path / "chat", **{"train.max_steps": "1", "data.apply_chat_template": "true"}),
          reward_fn=reward, train_dataset=rows)
    c, p = seen["completions"][0], seen["prompts"][0]
    assert c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
    assert p[0]["role"] == "user" and p[0]["content"].startswith("say ")


def test_a_list_of_reward_functions_is_summed_with_weights(ws, tmp_path, threads):
    def one(completions, **kwargs):
        return [1.0] * len(completions)

    def two(queries, prompts, labels, **kwargs):
        return [2.0] * len(queries)

    _, m = train(flags(ws, tmp_path / "sum", **{"train.max_steps": "1"}), reward_fn=[one, two],
                 reward_weights=[1.0, 0.5])
    assert m["reward"] == 2.0 and m["reward_extra/one"] == 1.0 and m["reward_extra/two"] == 2.0


def test_a_callable_of_neither_contract_is_refused_in_one_line(ws, tmp_path):
    with pytest.raises(RewardError) as err:
        rlhfkit.RLTrainer.from_config(rlhfkit.RLConfig.from_args(flags(ws, tmp_path / "bad")),
                                      reward_fn=lambda x, y: 0.0)
    assert "queries" in str(err.value) and "completions" in str(err.value) and "\n" not in str(err.value)


def test_eval_dataset_metrics_are_merged_into_the_result(ws, tmp_path, threads):
    rows = [{"q": f"x{i}:", "a": str(i)} for i in range(4)]
    _, m = train(flags(ws, tmp_path / "eval", **{"train.max_steps": "1"}), eval_dataset=rows)
    assert "eval/reward" in m and "reward" in m
    lines = (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()
    assert sum("eval/reward" in json.loads(x) for x in lines) == 2  # before and after training


def test_config_built_in_python_works_like_flags(ws, tmp_path, threads):
    cfg = RLConfig(
        actor=ActorConfig(model_name_or_path=str(ws / "tiny"), autocast=None),
        data=DataConfig(input_key="q", label_key="a"),
        rollout=RolloutConfig(batch_size=4, n_samples_per_prompt=4, max_new_tokens=6),
        train=TrainConfig(batch_size=8, micro_batch_size=4, max_steps=1, num_threads=1),
        logger=LoggerConfig(progress_bar=False),
        ckpt=CkptConfig(output_dir=str(tmp_path / "py")),
    )
    rows = [json.loads(line) for line in (ws / "prompts.jsonl").read_text().splitlines()]
    trainer = rlhfkit.RLTrainer.from_config(cfg, reward_fn=str(ws / "reward.py"), train_dataset=rows)
    assert trainer.train()["optimizer_steps"] == 2.0 and (tmp_path / "py" / "final" / "config.json").exists()
