"""A verl user's data and reward file, unmodified, through `rlhfkit train rl`: parquet rows with the prompt as a
chat list, the answer in reward_model.ground_truth, data_source and extra_info; a reward file defining only
`compute_score(data_source, solution_str, ground_truth, extra_info=None)` that returns verl's score dict."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhfkit.cli.main import main
from tests.integration.conftest import cli_flags, refuse

VERL_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    bonus = 0.5 if data_source == "openai/gsm8k" else 0.0
    return {"score": float(ground_truth) + bonus, "acc": extra_info["index"] % 2 == 0, "pred": solution_str}
'''

# verl's custom_reward_function.name: a file with several functions, the one to use named
NAMED_REWARD = '''

def length_score(data_source, solution_str, ground_truth, extra_info=None):
    return -float(len(solution_str)) + 10 * (extra_info["index"] == int(ground_truth) - 1)
'''


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("verl_inputs")
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i}+1="}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    (root / "verl_reward.py").write_text(VERL_REWARD)
    (root / "named.py").write_text(VERL_REWARD + NAMED_REWARD)
    return root


def flags(ws, out, **over):
    return cli_flags({"actor.model_name_or_path": ws / "tiny", "data.prompt_dataset": ws / "train.parquet",
                      "data.input_key": "prompt", "data.apply_chat_template": "true",
                      "reward.remote_url": ws / "verl_reward.py", "rollout.batch_size": 4,
                      "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 3, "train.batch_size": 8,
                      "train.micro_batch_size": 8, "train.max_steps": 1, "logger.log_samples": 8,
                      "actor.autocast": "none", "logger.progress_bar": "false", "train.num_threads": 1,
                      "ckpt.output_dir": out, **over})


@pytest.mark.parametrize("label_key", [None, "reward_model.ground_truth"])
def test_verl_parquet_and_compute_score_file_give_each_sample_its_score(ws, tmp_path, label_key):
    out = tmp_path / "run"
    assert main(["train", "rl", *flags(ws, out, **{"data.label_key": label_key})]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    index = [int(s["prompt"].split(": ")[1].split("+")[0]) for s in samples]  # "user: 5+1=<eos>assistant: "
    assert len(samples) == 8
    assert [s["reward"] for s in samples] == [i + 1 + 0.5 for i in index]  # ground truth i+1, the gsm8k bonus
    if label_key is not None:
        assert [s["label"] for s in samples] == [str(i + 1) for i in index]
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward"] == pytest.approx(sum(i + 1.5 for i in index) / 8)
    assert metrics["reward_extra/acc"] == pytest.approx(sum(i % 2 == 0 for i in index) / 8)


def test_a_nested_label_key_that_is_not_there_is_one_line_before_models_load(ws, tmp_path, capsys):
    line = refuse(["train", "rl", *flags(ws, tmp_path / "run", **{"data.label_key": "reward_model.answer"})], capsys,
                  "train.parquet, record 0: no key 'reward_model.answer' (label_key): reward_model has keys")
    assert "['ground_truth', 'style']" in line
    assert not (tmp_path / "run").exists()


def test_a_reward_function_named_in_the_file_spec_is_the_one_that_scores(ws, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "rl", *flags(ws, out, **{"reward.remote_url": f"{ws / 'named.py'}:length_score"})]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    # length_score, not the file's compute_score: minus the response's length, plus 10 (each index matches its truth)
    assert [s["reward"] for s in samples] == [10.0 - len(s["response"]) for s in samples]
    refuse(["train", "rl", *flags(ws, tmp_path / "bad", **{"reward.remote_url": f"{ws / 'named.py'}:nope"})], capsys,
           "has no function 'nope' (its functions: compute_score, length_score); give FILE.py:NAME of one of them")


def verl_overrides(ws, out) -> list[str]:
    """verl's overrides of a GRPO run on the tiny model: 4 prompts a step, 2 samples each, mini-batches of 2
    prompts (4 samples), micro-batches of 2 samples."""
    return [f"data.train_files={ws / 'train.parquet'}", "data.train_batch_size=4", "data.max_prompt_length=64",
            "data.max_response_length=3", "data.filter_overlong_prompts=True", "data.truncation='error'",
            "algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={ws / 'tiny'}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            "actor_rollout_ref.actor.fsdp_config.param_offload=False",
            "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "algorithm.use_kl_in_reward=False",
            f"custom_reward_function.path={ws / 'verl_reward.py'}", "trainer.logger=['console']",
            f"trainer.default_local_dir={out}", "trainer.total_training_steps=1", "trainer.n_gpus_per_node=1",
            "trainer.resume_mode=disable", "trainer.total_epochs=1"]


def test_verl_overrides_run_one_step_as_verl_counts_its_batches(ws, tmp_path, caplog):
    out = tmp_path / "run"
    ours = ["--actor.autocast", "none", "--logger.progress_bar", "false", "--train.num_threads", "1",
            "--logger.log_samples", "8"]
    with caplog.at_level("WARNING", logger="rlhfkit"):
        assert main(["train", "rl", *verl_overrides(ws, out), *ours]) == 0
    assert "trainer.n_gpus_per_node: ignored" in caplog.text  # noticed, one line
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    index = [int(s["prompt"].split(": ")[1].split("+")[0]) for s in samples]
    assert len(samples) == 8  # data.train_batch_size=4 prompts x rollout.n=2
    assert [s["reward"] for s in samples] == [i + 1 + 0.5 for i in index]  # compute_score with data_source
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["optimizer_steps"] == 2  # 8 samples, ppo_mini_batch_size=2 prompts x 2 = 4 samples a step
    assert row["kl_coef"] == pytest.approx(0.001)  # the KL loss of use_kl_loss=True
    assert (out / "final" / "config.json").exists()  # trainer.default_local_dir


def test_verl_overrides_name_the_reward_function(ws, tmp_path):
    out = tmp_path / "run"
    named = [o for o in verl_overrides(ws, out) if not o.startswith("custom_reward_function.path=")]
    named += [f"custom_reward_function.path={ws / 'named.py'}", "custom_reward_function.name=length_score"]
    assert main(["train", "rl", *named, "--actor.autocast", "none", "--logger.progress_bar", "false",
                 "--train.num_threads", "1", "--logger.log_samples", "8"]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["reward"] for s in samples] == [10.0 - len(s["response"]) for s in samples]  # length_score's


def test_verl_gmpo_example_keys_run_truncation_warmup_and_config_overrides(ws, tmp_path):
    """The four keys of verl's examples/gmpo_trainer/test_dapo_7b_math.sh that rlhfkit once refused, on the tiny
    model: data.truncation=left cuts the prompts, lr_warmup_steps counts optimizer steps, val_kwargs sample the
    evaluation, override_config reaches the model's config."""
    out = tmp_path / "run"
    base = [o for o in verl_overrides(ws, out) if not o.startswith(("data.max_prompt_length=", "data.filter_overlong",
                                                                  "data.truncation="))]
    gmpo = ["data.max_prompt_length=20", "data.truncation=left", "actor_rollout_ref.actor.optim.lr_warmup_steps=4",
            "actor_rollout_ref.actor.optim.lr=1e-3", f"data.val_files={ws / 'train.parquet'}",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
            "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
            "actor_rollout_ref.rollout.val_kwargs.top_p=0.7", "actor_rollout_ref.rollout.val_kwargs.top_k=5",
            "+actor_rollout_ref.model.override_config.max_position_embeddings=512",
            "+actor_rollout_ref.model.override_config.attention_dropout=0.0"]
    assert main(["train", "rl", *base, *gmpo, "--actor.autocast", "none", "--logger.progress_bar", "false",
                 "--train.num_threads", "1", "--logger.log_samples", "8"]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    # "user: 5+1=<eos>assistant: " is 22 tokens: 6 + 12 around the content leave 2 of "5+1=", its end kept
    assert {s["prompt"] for s in samples} == {"user: 1=<eos>assistant: "}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if "actor/lr" in r]
    # optimizer steps 1 and 2 of 4 warmup steps run at 1e-3 * 0/4 and 1e-3 * 1/4 (transformers' warmup from 0, as
    # verl's and OpenRLHF's schedules): their mean is logged
    # (without the warmup, verl's ratio 0: 1e-3)
    assert (row["optimizer_steps"], row["actor/lr"]) == (2, pytest.approx(1e-3 * (0 + 0.25) / 2))
    assert "eval/pass@1" in rows[0]  # data.val_files, sampled with val_kwargs
    assert json.loads((out / "final" / "config.json").read_text())["max_position_embeddings"] == 512
