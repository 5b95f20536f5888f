"""A script users bring: OpenRLHF's examples/scripts/train_sft_mixtral_lora.sh (its flags as the script
passes them to `openrlhf.cli.train_sft`; the model and dataset paths swapped for a tiny Mixtral and a
local file) parses into the config it means and runs its step: LoRA on a bf16 Mixtral, packed samples,
gradient checkpointing and the router's load-balancing loss (--model.aux_loss_coef)."""

import json
import logging

import torch

from rlhfkit.cli.main import main
from rlhfkit.config.sft import SFTConfig
from rlhfkit.models.tiny import tiny_model_and_tokenizer
from rlhfkit.trainers.supervised.loop import planned_steps


def mixtral_lora_flags(model: str, data: str, out: str) -> list[str]:
    return ["--data.max_len", "2048", "--data.dataset", data, "--data.input_key", "question",
            "--data.output_key", "response", "--train.batch_size", "128", "--train.micro_batch_size", "4",
            "--data.max_samples", "500000", "--model.model_name_or_path", model, "--ckpt.output_dir", out,
            "--ckpt.save_steps", "-1", "--logger.logging_steps", "1", "--eval.steps", "-1", "--ds.zero_stage", "3",
            "--train.max_epochs", "1", "--ds.param_dtype", "bf16", "--model.gradient_checkpointing_enable",
            "--ds.attn_implementation", "flash_attention_2", "--adam.lr", "5e-6", "--ds.lora.rank", "64",
            "--ds.lora.alpha", "64", "--ds.packing_samples", "--model.aux_loss_coef", "0.001"]


def test_openrlhfs_mixtral_lora_sft_script_plans_and_runs_its_step(tmp_path, caplog):
    model, tok = tiny_model_and_tokenizer(seed=0, arch="mixtral")
    model.save_pretrained(tmp_path / "mixtral")
    tok.save_pretrained(tmp_path / "mixtral")
    rows = [{"question": f"what is {i} + {i}?", "response": str(2 * i)} for i in range(128)]
    (tmp_path / "orca.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = mixtral_lora_flags(str(tmp_path / "mixtral"), str(tmp_path / "orca.jsonl"), str(tmp_path / "run"))

    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        cfg = SFTConfig.from_args(flags)
    noticed = {r.getMessage().split(":")[0] for r in caplog.records}
    assert noticed == {"--logger.logging_steps", "--ds.zero_stage", "--ds.attn_implementation"}
    m, lora = cfg.model, cfg.ds.lora
    assert (m.dtype, m.gradient_checkpointing_enable, m.aux_loss_coef) == ("bfloat16", True, 0.001)
    assert (lora.rank, lora.alpha, cfg.ds.packing_samples, cfg.data.max_len) == (64, 64, True, 2048)
    assert planned_steps(len(rows), cfg.train) == 1  # 128 samples, batch 128, one epoch: one step

    assert main(["train", "sft", *flags, "--logger.progress_bar", "false", "--train.num_threads", "1"]) == 0
    (step,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert step["moe/aux_loss"] > 1.0 and 1.0 <= step["moe/load_max"] <= 4.0  # k = 2 is the balanced value
    assert torch.isfinite(torch.tensor(step["loss"]))
    assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()  # a LoRA adapter of the Mixtral
    assert main(["lora", "merge", "--lora.adapter", str(tmp_path / "run" / "final"), "--ckpt.output_dir",
                 str(tmp_path / "merged")]) == 0
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert type(merged).__name__ == "MixtralForCausalLM"
