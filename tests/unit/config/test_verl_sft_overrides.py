"""verl's SFT overrides on `rlhfkit train sft`: verl's GSM8K LoRA example worked out by hand, every key of verl's
sft_trainer.yaml and of its SFT example scripts has a rule (docs/migration.md's table: test_verl_overrides.py)."""

from pathlib import Path

import pytest
import torch

from rlhfkit.config.sft import SFTConfig
from rlhfkit.config.verl_names import VERL_SFT_KEYS
from rlhfkit.config.verl_sft import verl_sft_rule
from rlhfkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]

# verl's examples/sft/gsm8k/run_qwen_05_peft.sh, as the shell hands it over.
GSM8K_LORA = """data.train_files=/d/train.parquet data.val_files=/d/test.parquet data.prompt_key=extra_info
data.response_key=extra_info optim.lr=1e-4 data.prompt_dict_keys=['question'] +data.response_dict_keys=['answer']
data.micro_batch_size_per_gpu=4 model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct trainer.default_local_dir=/tmp/save
trainer.project_name=gsm8k-sft trainer.experiment_name=gsm8k-sft-qwen-2.5-0.5b-instruct trainer.logger=console
trainer.total_epochs=1 model.lora_rank=32 model.lora_alpha=16 model.target_modules=all-linear""".split()


def test_verl_gsm8k_lora_sft_example_is_the_rlhfkit_config_worked_out_by_hand():
    cfg = SFTConfig.from_args(GSM8K_LORA)
    assert (cfg.data.dataset, cfg.data.eval_dataset) == ("/d/train.parquet", "/d/test.parquet")
    assert (cfg.data.input_key, cfg.data.output_key, cfg.data.apply_chat_template) == (
        "extra_info.question", "extra_info.answer", True)
    assert (cfg.train.batch_size, cfg.train.micro_batch_size) == (256, 4)  # verl's default global batch
    assert (cfg.adam.lr, cfg.adam.weight_decay, cfg.adam.betas) == (1e-4, 0.01, (0.9, 0.95))
    assert (cfg.train.lr_scheduler, cfg.train.lr_warmup_ratio, cfg.train.min_lr_ratio) == ("cosine_with_min_lr", 0.1,
                                                                                          0.0)
    assert (cfg.train.max_epochs, cfg.train.seed, cfg.data.max_len, cfg.data.truncation) == (1, 1, 1024, "error")
    assert (cfg.ds.lora.rank, cfg.ds.lora.alpha, cfg.ds.lora.target_modules) == (32, 16, "all-linear")
    assert (cfg.model.model_name_or_path, cfg.model.gradient_checkpointing_enable) == ("Qwen/Qwen2.5-0.5B-Instruct",
                                                                                       True)
    assert (cfg.ckpt.output_dir, cfg.ckpt.load_enable, cfg.logger.wandb.project) == ("/tmp/save", True, None)


def test_multiturn_global_micro_batch_and_flags_that_win():
    cfg = SFTConfig.from_args(["data.multiturn.enable=true", "data.multiturn.messages_key=messages",
                               "data.micro_batch_size=16", "trainer.n_gpus_per_node=8", "data.train_batch_size=32",
                               "--train.batch_size", "16"])
    assert (cfg.data.input_key, cfg.data.output_key) == ("messages", None)  # every assistant turn a target
    assert (cfg.train.micro_batch_size, cfg.train.batch_size) == (2, 16)  # 16 / 8 GPUs; rlhfkit's flag wins


@pytest.mark.parametrize("argv, needle", [
    (["data.custom_cls.path=my_data.py"], "data.custom_cls.path: rlhfkit reads its own SFT dataset"),
    (["data.max_lenght=8"], "unknown verl override data.max_lenght; did you mean data.max_length?"),
])
def test_refused_and_unknown_are_one_line(argv, needle):
    with pytest.raises(ConfigError) as e:
        SFTConfig.from_args(argv)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_warmup_steps_map_onto_train_sft_and_its_learner():
    from rlhfkit.trainers.supervised.loop import build_learner

    assert SFTConfig.from_args(["optim.lr_warmup_steps=10"]).train.lr_warmup_steps == 10
    assert SFTConfig.from_args(["optim.lr_warmup_steps=null"]).train.lr_warmup_steps == -1  # the ratio
    cfg = SFTConfig.from_args(["optim.lr_warmup_steps=4", "optim.lr_warmup_steps_ratio=0.5", "optim.lr=1.0",
                               "optim.lr_scheduler=constant"])
    learner = build_learner(torch.nn.Linear(1, 1), cfg.adam, cfg.train, total_steps=100)
    lrs = [learner.scheduler.lr_lambdas[0](s) for s in (0, 3, 4, 50)]
    assert lrs == [0.0, 0.75, 1.0, 1.0]  # 4 steps up, not 50 (the ratio's)
    ratio = SFTConfig.from_args(["optim.lr_warmup_steps_ratio=0.5", "optim.lr_scheduler=constant"])
    assert build_learner(torch.nn.Linear(1, 1), ratio.adam, ratio.train, total_steps=100).scheduler.lr_lambdas[0](
        3) == pytest.approx(3 / 50)
    with pytest.raises(ConfigError, match="--train.lr_warmup_steps must be >= -1"):
        SFTConfig.from_args(["--train.lr_warmup_steps", "-2"])


def test_every_key_of_verls_sft_config_and_examples_has_a_rule():
    assert len(VERL_SFT_KEYS) == 73
    lines = (ROOT / "tests" / "fixtures" / "verl" / "sft_example_overrides.txt").read_text().splitlines()
    examples = [line.split()[0].lstrip("+") for line in lines if line and not line.startswith("#")]
    assert len(examples) > 20
    for key in (*VERL_SFT_KEYS, *examples):
        verl_sft_rule(key)


def test_sft_reads_a_dotted_key_into_nested_columns_and_leaves_the_callers_records_alone():
    from rlhfkit.data.supervised import select_records

    rows = [{"extra_info": {"question": "1+1=", "answer": "2"}}]
    ((_, record, _),) = select_records(rows, {"--data.input_key": "extra_info.question"}, None, None, "train", None,
                                       None)
    assert record.data["extra_info.question"] == "1+1="
    assert rows == [{"extra_info": {"question": "1+1=", "answer": "2"}}]
    with pytest.raises(Exception, match="no key 'extra_info.prompt' \\(--data.input_key\\): extra_info has keys"):
        select_records(rows, {"--data.input_key": "extra_info.prompt"}, None, None, "train", None, None)
