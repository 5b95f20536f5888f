"""TRL's SFTConfig, DPOConfig, KTOConfig and RewardConfig read field by field (config/trl_supervised.py): a rule
for every field of the installed TRL's configs, the mapping by hand, one-line refusals, and one SFT step from a
TRL config."""

import dataclasses
import logging

import pytest

from rlhfkit.config.kd import KDConfig
from rlhfkit.config.preference import DPOConfig, KTOConfig, RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.config.trl_supervised import DPO_RULES, KTO_RULES, RM_RULES, SFT_RULES
from rlhfkit.errors import ConfigError

trl = pytest.importorskip("trl")
CPU = dict(output_dir="out", bf16=False, use_cpu=True, report_to="none", lr_scheduler_type="cosine")
MODEL = ["--model.model_name_or_path", "unused"]


@pytest.mark.parametrize(("theirs", "rules"), [("SFTConfig", SFT_RULES), ("DPOConfig", DPO_RULES),
                                               ("KTOConfig", KTO_RULES), ("RewardConfig", RM_RULES)])
def test_every_field_has_a_rule(theirs, rules):
    names = {f.name for f in dataclasses.fields(getattr(trl, theirs)) if not f.name.startswith("_")}
    assert names - set(rules) == set()


def test_sft_by_hand():
    cfg = SFTConfig.from_trl(trl.SFTConfig(**CPU, per_device_train_batch_size=2, gradient_accumulation_steps=3,
                                           num_train_epochs=2, learning_rate=2e-5, warmup_steps=0.1, max_length=256,
                                           packing=True, eval_strategy="steps", eval_steps=7, seed=5,
                                           weight_decay=0.1, gradient_checkpointing=False), MODEL)
    t = cfg.train
    assert (t.micro_batch_size, t.batch_size, t.max_epochs, t.max_steps) == (2, 6, 2, None)
    assert (cfg.adam.lr, cfg.adam.weight_decay, t.lr_scheduler, t.lr_warmup_ratio, t.eval_steps, t.seed) == (
        2e-5, 0.1, "cosine", 0.1, 7, 5)
    assert (cfg.data.max_len, cfg.ds.packing_samples, cfg.model.gradient_checkpointing_enable) == (256, True, False)
    assert t.lr_warmup_steps == -1  # the ratio is read
    # whole warmup steps are --train.lr_warmup_steps, with or without max_steps
    cfg = SFTConfig.from_trl(trl.SFTConfig(**CPU, warmup_steps=5, max_steps=50), MODEL)
    assert (cfg.train.lr_warmup_steps, cfg.train.max_steps) == (5, 50)
    # TRL's max_steps wins over num_train_epochs (3 by default): as many passes as steps, max_steps the cap
    assert cfg.train.max_epochs == 50
    assert SFTConfig.from_trl(trl.SFTConfig(**CPU, num_train_epochs=1.5, max_steps=4), MODEL).train.max_epochs == 4
    assert SFTConfig.from_trl(trl.SFTConfig(**CPU, warmup_steps=7), MODEL).train.lr_warmup_steps == 7
    assert SFTConfig.from_trl(trl.SFTConfig(**{**CPU, "lr_scheduler_type": "constant"}, warmup_steps=7),
                              MODEL).train.lr_warmup_steps == 0


def test_sft_loss_type_dft_is_read():
    assert SFTConfig.from_trl(trl.SFTConfig(**CPU, loss_type="dft"), MODEL).model.loss_type == "dft"
    assert SFTConfig.from_trl(trl.SFTConfig(**CPU), MODEL).model.loss_type == "nll"


def test_dpo_by_hand():
    cfg = DPOConfig.from_trl(trl.DPOConfig(**CPU, beta=0.2, label_smoothing=0.1, per_device_train_batch_size=4,
                                           gradient_accumulation_steps=2, learning_rate=5e-7), MODEL)
    m = cfg.model
    assert (m.beta, m.label_smoothing, m.ipo_enable, cfg.train.batch_size, cfg.adam.lr) == (0.2, 0.1, False, 8, 5e-7)
    assert DPOConfig.from_trl(trl.DPOConfig(**CPU, loss_type="ipo"), MODEL).model.ipo_enable


def test_kto_by_hand():
    cfg = KTOConfig.from_trl(trl.KTOConfig(**CPU, beta=0.3, desirable_weight=1.5, undesirable_weight=0.7,
                                           per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                           max_length=300, max_steps=6), MODEL)
    m, t = cfg.model, cfg.train
    assert (m.beta, m.desirable_weight, m.undesirable_weight, m.ipo_enable) == (0.3, 1.5, 0.7, False)
    assert (t.micro_batch_size, t.batch_size, t.max_steps, cfg.data.max_len, cfg.adam.lr) == (4, 8, 6, 300, 1e-6)
    # TRL's KL term needs per_device_train_batch_size > 1, as ours: one sample is refused by our own check
    with pytest.raises(ConfigError, match="micro_batch_size >= 2"):
        KTOConfig.from_trl(trl.KTOConfig(**CPU, per_device_train_batch_size=1), MODEL)


def test_reward_config_by_hand():
    cfg = RMConfig.from_trl(trl.RewardConfig(**CPU, per_device_train_batch_size=2, gradient_accumulation_steps=4,
                                             max_length=512, num_train_epochs=2, center_rewards_coefficient=0.01),
                            MODEL)
    t = cfg.train
    assert (t.micro_batch_size, t.batch_size, t.max_epochs, cfg.data.max_len, cfg.adam.lr) == (2, 8, 2, 512, 1e-4)
    assert (cfg.model.center_rewards_coef, RMConfig.from_trl(trl.RewardConfig(**CPU), MODEL).model.center_rewards_coef
            ) == (0.01, 0.0)
    assert cfg.model.margin_loss_enable  # TRL subtracts a record's "margin" wherever the data has one
    # our flags win over what the TRL config gives
    assert not RMConfig.from_trl(trl.RewardConfig(**CPU), [*MODEL, "--model.margin_loss_enable", "false"]
                                 ).model.margin_loss_enable


@pytest.mark.parametrize(("make", "needle"), [
    (lambda: trl.SFTConfig(**{**CPU, "lr_scheduler_type": "polynomial"}), "lr_scheduler_type='polynomial'"),
    (lambda: trl.SFTConfig(**CPU, completion_only_loss=False), "completion_only_loss=False"),
    (lambda: trl.DPOConfig(**CPU, loss_type=["sigmoid", "sft"]), "loss_type="),
    (lambda: trl.DPOConfig(**CPU, f_divergence_type="js_divergence"), "f_divergence_type="),
    (lambda: trl.KTOConfig(**CPU, loss_type="apo_zero_unpaired"), "loss_type='apo_zero_unpaired'"),
    (lambda: trl.KTOConfig(**CPU, sync_ref_model=True), "sync_ref_model=True"),
    (lambda: trl.RewardConfig(**CPU, eos_token="<|im_end|>"), "eos_token="),
])
def test_what_rlhfkit_cannot_honour_is_refused_in_one_line(make, needle):
    cls = {"SFTConfig": SFTConfig, "DPOConfig": DPOConfig, "KTOConfig": KTOConfig,
           "RewardConfig": RMConfig}[type(make()).__name__]
    with pytest.raises(ConfigError, match=needle) as err:
        cls.from_trl(make(), MODEL)
    assert "\n" not in str(err.value)


def test_another_trainers_trl_config_is_refused_by_its_fields():
    with pytest.raises(ConfigError, match="TRL KTOConfig fields rlhfkit has no rule for: .*label_smoothing"):
        KTOConfig.from_trl(trl.DPOConfig(**CPU), MODEL)
    with pytest.raises(ConfigError, match="only SFTConfig, DPOConfig, KTOConfig and RMConfig"):
        KDConfig.from_trl(trl.SFTConfig(**CPU), MODEL)


def test_the_meaning_that_differs_at_trl_defaults_is_noticed(caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        DPOConfig.from_trl(trl.DPOConfig(**CPU), MODEL)
        SFTConfig.from_trl(trl.SFTConfig(**CPU, assistant_only_loss=True), MODEL)
        KTOConfig.from_trl(trl.KTOConfig(**CPU), MODEL)
        RMConfig.from_trl(trl.RewardConfig(**CPU), MODEL)
    assert [r.getMessage().split(":")[1] for r in caplog.records] == [
        " rlhfkit's train dpo keeps the model's dropout (most LLMs have none); TRL's default turns it off",
        " rlhfkit's train kto keeps the model's dropout (most LLMs have none); TRL's default turns it off",
        " rlhfkit's train rm keeps the model's dropout (most LLMs have none); TRL's default turns it off"]


def test_sft_keep_end_is_noticed_with_the_flag_that_cuts(caplog):
    with caplog.at_level(logging.WARNING, logger="rlhfkit"):
        cfg = SFTConfig.from_trl(trl.SFTConfig(**CPU, truncation_mode="keep_end", assistant_only_loss=True), MODEL)
    assert cfg.data.truncation == "skip"
    assert [r.getMessage() for r in caplog.records if r.name == "rlhfkit"] == [
        "TRL truncation_mode='keep_end': ignored: rlhfkit skips samples longer than --data.max_len (max_length); "
        "to cut them set --data.truncation right (TRL's keep_start) or left (keep_end)"]


def test_one_sft_step_from_a_trl_config(tmp_path):
    import rlhfkit
    from rlhfkit.models import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    cfg = SFTConfig.from_trl(
        trl.SFTConfig(**{**CPU, "output_dir": str(tmp_path / "out")}, per_device_train_batch_size=2, max_steps=1,
                      learning_rate=1e-3, gradient_checkpointing=False),
        ["--model.model_name_or_path", str(tmp_path / "tiny"), "--data.input_key", "prompt", "--data.output_key",
         "completion", "--logger.progress_bar", "false", "--train.num_threads", "1"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = rlhfkit.SFTTrainer.from_config(cfg, train_dataset=[{"prompt": f"{i} plus {i}:", "completion": str(2 * i)}
                                                                 for i in range(4)])
    trainer.train()
    after = trainer.model.state_dict()
    assert any(not (after[k] == before[k]).all() for k in before)


def test_the_migration_guide_python_runs():
    """docs/migration.md's SFT/DPO example runs as written (its assert is the mapping)."""
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "migration.md").read_text(encoding="utf-8")
    block = doc.split("### TRL `SFTConfig`", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "SFTConfig.from_trl" in block and "DPOConfig.from_trl" in block
    exec(compile(block, "migration.md", "exec"), {})
