"""verl's SFT command line (`torchrun -m verl.trainer.fsdp_sft_trainer KEY=VALUE ...`), its overrides unchanged, through
`rlhfkit train sft` on the tiny model: verl's GSM8K SFT layout (the question and answer inside extra_info)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from rlhfkit.cli.main import main


def test_verl_sft_overrides_train_one_step_on_nested_columns(tiny_ws, tmp_path, caplog):
    ws = tiny_ws("verl_sft")
    rows = [{"extra_info": {"question": f"{i}+1=", "answer": str(i + 1), "index": i}} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), ws / "train.parquet")
    out = tmp_path / "run"
    overrides = [f"data.train_files={ws / 'train.parquet'}", "data.prompt_key=extra_info",
                 "data.response_key=extra_info", "data.prompt_dict_keys=['question']",
                 "+data.response_dict_keys=['answer']", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=2",
                 f"model.partial_pretrain={ws / 'tiny'}", "optim.lr=1e-4", "trainer.logger=console",
                 f"trainer.default_local_dir={out}", "trainer.total_training_steps=1", "trainer.resume_mode=disable",
                 "trainer.n_gpus_per_node=1", "model.strategy=fsdp2"]
    with caplog.at_level("WARNING", logger="rlhfkit"):
        assert main(["train", "sft", *overrides, "--logger.progress_bar", "false", "--train.num_threads", "1"]) == 0
    assert "model.strategy: ignored" in caplog.text
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert (out / "final" / "config.json").exists()
    # the same step from flat columns and rlhfkit's flags: the same first loss (verl's seed 1 orders the data)
    (ws / "flat.jsonl").write_text("".join(json.dumps(r["extra_info"]) + "\n" for r in rows_of(ws)))
    flat = tmp_path / "flat"
    argv = ["--model.model_name_or_path", ws / "tiny", "--data.dataset", ws / "flat.jsonl", "--data.input_key",
            "question", "--data.output_key", "answer", "--data.apply_chat_template", "true", "--train.batch_size", 4,
            "--train.micro_batch_size", 2, "--adam.lr", 1e-4, "--train.max_steps", 1, "--train.seed", 1,
            "--ckpt.output_dir", flat, "--logger.progress_bar", "false", "--train.num_threads", 1]
    assert main(["train", "sft", *map(str, argv)]) == 0
    (ours,) = [json.loads(line) for line in (flat / "metrics.jsonl").read_text().splitlines()]
    assert row["loss"] == ours["loss"]


def rows_of(ws):
    return pq.read_table(ws / "train.parquet").to_pylist()
