"""The Python API (rlhfkit.api.supervised) is the CLI: the same run through `rlhfkit train sft|dpo`
and through `from_config(cfg, train_dataset=records)` in-process gives the same metrics, final
weights and summary; RM and KTO train from a datasets.Dataset; misuse fails in one line."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.api.supervised import DPOTrainer, KTOTrainer, RMTrainer, SFTTrainer
from rlhfkit.cli.main import main
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.errors import ConfigError, DataError

FACTS = [("a", "cat"), ("b", "dog"), ("c", "owl"), ("d", "fox"), ("e", "emu"), ("f", "yak")]
PAIRS = [{"prompt": f"q{i}:", "chosen": "7" * (1 + i % 3), "rejected": "1" * (1 + i % 3)} for i in range(16)]
KTO = [{"prompt": f"q{i}:", "output": ("7" if i % 2 else "1") * 2, "label": bool(i % 2)} for i in range(16)]


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("api")
    for name, rows in [("sft", [{"input": f"{k}=", "output": v} for k, v in FACTS]), ("pairs", PAIRS)]:
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def flags(ws, out, **kv):
    argv = ["--model.model_name_or_path", str(ws / "tiny"), "--ckpt.output_dir", str(out),
            "--logger.progress_bar", "false", "--train.num_threads", "1"]
    for k, v in kv.items():
        argv += [f"--{k.replace('__', '.')}", str(v)]
    return argv


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_run(cli, api, result):
    """Same metrics.jsonl values (but the wall time), weights, summary; `result` = last step + final eval."""
    def drop(rows):
        return [{k: v for k, v in r.items() if k != "time/step"} for r in rows]

    rows = read_jsonl(cli / "metrics.jsonl")
    assert drop(read_jsonl(api / "metrics.jsonl")) == drop(rows)
    a, b = load_file(str(cli / "final" / "model.safetensors")), load_file(str(api / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary = json.loads((cli / "summary.json").read_text())
    assert json.loads((api / "summary.json").read_text()) == summary
    final = {k: v for k, v in summary.items() if k != "steps"}
    last_step = {k: v for k, v in drop(rows)[-1 - bool(final)].items() if k != "step"}
    assert drop([result])[0] == {**last_step, **final}
    for name in ("config.json", "curves.png", "tensorboard"):
        assert (api / name).exists()


def test_sft_through_the_api_equals_the_cli(ws, tmp_path):
    common = dict(train__batch_size=2, train__micro_batch_size=1, train__max_epochs=2, adam__lr=1e-2,
                  train__eval_steps=2)
    cli, api = tmp_path / "cli", tmp_path / "api"
    data = ["--data.dataset", str(ws / "sft.jsonl"), "--data.eval_dataset", str(ws / "sft.jsonl")]
    assert main(["train", "sft", *flags(ws, cli, **common), *data]) == 0

    records = read_jsonl(ws / "sft.jsonl")
    cfg = SFTConfig.from_args(flags(ws, api, **common))  # no --data.dataset: the records are given
    trainer = SFTTrainer.from_config(cfg, train_dataset=records, eval_dataset=records)
    result = trainer.train()
    assert_same_run(cli, api, result)
    assert trainer.step == 6 and set(trainer.final_metrics) == {"eval/loss"}
    # save() writes an HF folder that transformers loads, equal to final/
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(trainer.save(tmp_path / "saved"))
    final = load_file(str(api / "final" / "model.safetensors"))
    assert all(torch.equal(p, final[k]) for k, p in saved.state_dict().items() if k in final)


def test_dpo_through_the_api_equals_the_cli_and_given_data_wins(ws, tmp_path):
    common = dict(train__batch_size=4, train__micro_batch_size=2, train__max_epochs=1, adam__lr=3e-3,
                  data__eval_split=0.25)
    cli, api = tmp_path / "cli", tmp_path / "api"
    assert main(["train", "dpo", *flags(ws, cli, **common), "--data.dataset", str(ws / "pairs.jsonl")]) == 0

    # the records given to from_config win over --data.dataset (a file that does not exist)
    cfg = DPOConfig.from_args(flags(ws, api, **common) + ["--data.dataset", str(ws / "missing.jsonl")])
    result = DPOTrainer.from_config(cfg, train_dataset=read_jsonl(ws / "pairs.jsonl")).train()
    assert_same_run(cli, api, result)
    assert {"loss", "margin", "eval/accuracy", "eval/margin"} <= result.keys()


def test_reward_model_from_a_datasets_dataset(ws, tmp_path):
    import datasets
    from transformers import AutoModelForSequenceClassification

    cfg = RMConfig.from_args(flags(ws, tmp_path / "rm", train__batch_size=4, train__micro_batch_size=2,
                                   adam__lr=3e-3))
    trainer = RMTrainer.from_config(cfg, train_dataset=datasets.Dataset.from_list(PAIRS[:12]),
                                    eval_dataset=datasets.Dataset.from_list(PAIRS[12:]))
    result = trainer.train()
    assert trainer.step == 3 and {"loss", "accuracy", "eval/accuracy", "reward_mean", "reward_std"} <= result.keys()
    summary = json.loads((tmp_path / "rm" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["reward_std"] == result["reward_std"]
    rm = AutoModelForSequenceClassification.from_pretrained(trainer.save(tmp_path / "saved"))
    assert (rm.config.mean, rm.config.std) == pytest.approx((result["reward_mean"], result["reward_std"]))


def test_kto_from_a_datasetdict_takes_its_train_split(ws, tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(KTO[:12]),
                               "test": datasets.Dataset.from_list(KTO[12:])})
    cfg = KTOConfig.from_args(flags(ws, tmp_path / "kto", train__batch_size=4, train__micro_batch_size=4,
                                    adam__lr=3e-3))
    trainer = KTOTrainer.from_config(cfg, train_dataset=dd)
    assert len(trainer.train_items) == 12 and trainer.eval_items == []
    result = trainer.train()
    assert trainer.step == 3 and {"loss", "kl"} <= result.keys() and trainer.final_metrics == {}
    assert (tmp_path / "kto" / "final" / "model.safetensors").is_file()


def test_misuse_fails_in_one_line(ws, tmp_path):
    argv = flags(ws, tmp_path / "x")
    # config mistakes fail before any model loads; data mistakes name the record
    with pytest.raises(ConfigError, match=r"--data.dataset is required .*pass train_dataset="):
        SFTTrainer.from_config(SFTConfig.from_args(argv))
    with pytest.raises(ConfigError, match=r"DPOTrainer.from_config needs a DPOConfig .*got SFTConfig"):
        DPOTrainer.from_config(SFTConfig.from_args(argv), train_dataset=PAIRS)
    dpo_cfg = DPOConfig.from_args(argv + ["--train.batch_size", "4", "--train.micro_batch_size", "1"])
    with pytest.raises(ConfigError, match="train kto needs --train.micro_batch_size >= 2"):
        KTOTrainer.from_config(dpo_cfg, train_dataset=KTO)  # a DPOConfig is validated as KTO
    with pytest.raises(DataError, match=r"^in-memory list, record 0: no key 'output' \(--data.output_key\)"):
        KTOTrainer.from_config(KTOConfig.from_args(argv), train_dataset=PAIRS)
