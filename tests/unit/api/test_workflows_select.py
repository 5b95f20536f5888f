"""The selection rules of rejection sampling and iterative DPO (api/workflows.py), by hand, and the
configs of the sampling workflows (defaults, aliases, refusals)."""

import pytest

from rlhfkit.api.workflows import (
    above_threshold,
    best_per_prompt,
    best_worst_pairs,
    prompt_seeds,
)
from rlhfkit.config.generate import GenerateConfig, IterativeDPOConfig, RSConfig
from rlhfkit.errors import ConfigError

# two prompts (groups 0 and 1), samples interleaved; group 1 ties at its top and bottom
REWARDS = [0.2, 0.9, 0.5, 0.5, 0.1, 0.1]
GROUPS = [0, 1, 0, 1, 1, 0]


def test_best_per_prompt_takes_the_first_highest():
    assert best_per_prompt(REWARDS, GROUPS) == [2, 1]          # group 0: 0.5 at 2; group 1: 0.9 at 1
    assert best_per_prompt([1.0, 1.0], [0, 0]) == [0]          # a tie keeps the first


def test_above_threshold_is_at_least():
    assert above_threshold(REWARDS, 0.5) == [1, 2, 3]
    assert above_threshold(REWARDS, 1.0) == []


def test_best_worst_pairs_skip_groups_that_tie():
    assert best_worst_pairs(REWARDS, GROUPS) == [(2, 5), (1, 4)]  # group 0: 0.5 vs 0.1; group 1: 0.9 vs 0.1
    assert best_worst_pairs([0.3, 0.3, 1.0, 0.0], [0, 0, 1, 1]) == [(2, 3)]
    assert best_worst_pairs([0.3, 0.3, 0.3], [4, 4, 4]) == []


def test_prompt_seeds_are_a_function_of_the_seed():
    assert prompt_seeds(3, 1) == prompt_seeds(5, 1)[:3]
    assert prompt_seeds(3, 1) != prompt_seeds(3, 2)


def test_defaults_and_openrlhf_aliases():
    assert GenerateConfig.from_args([]).ckpt.output_dir == "runs/generate"
    rs = RSConfig.from_args(["--best_of_n", "4", "--iter", "3", "--greedy_sampling", "--max_num_seqs", "32"])
    assert (rs.rollout.n_samples_per_prompt, rs.rollout.temperature, rs.rollout.max_batch_size) == (4, 0.0, 32)
    assert (rs.ckpt.output_dir, rs.sft.adam.lr, rs.rs.threshold) == ("runs/rs", 5e-6, None)
    assert RSConfig.from_args(["--rs.best_of_n", "6"]).rollout.n_samples_per_prompt == 6
    dpo = IterativeDPOConfig.from_args(["--eval_task", "generate_vllm", "--dpo.model.beta", "0.2"])
    assert (dpo.rollout.engine, dpo.dpo.model.beta, dpo.dpo.adam.lr,
            dpo.iterative.ref) == ("vllm", 0.2, 5e-7, "initial")


@pytest.mark.parametrize("cls,flags,message", [
    (RSConfig, ["--sft.train.batch_size", "6", "--sft.train.micro_batch_size", "4"], "--sft.train.batch_size (6)"),
    (RSConfig, ["--rs.rounds", "2", "--rs.sft_enable", "--sft.ds.lora.rank", "4"], "--sft.ds.lora.rank 4 with 2"),
    (IterativeDPOConfig, ["--dpo.model.ipo_enable", "--dpo.model.label_smoothing", "0.1"], "are exclusive"),
    (RSConfig, ["--agent.func_path", "builtin:guess"], "--agent.func_path: train rs scores and trains"),
    (IterativeDPOConfig, ["--agent.on_rerender", "segment"], "--agent.on_rerender segment: train iterative-dpo trains"),
    (GenerateConfig, ["--eval_task", "bogus"], "--eval_task 'bogus'"),
])
def test_refused_settings(cls, flags, message):
    with pytest.raises(ConfigError, match=None) as e:
        cls.from_args(flags)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_mapped_batch_inference_flag_names_a_field():
    from rlhfkit.config.openrlhf import BATCH_INFERENCE_FLAGS
    from rlhfkit.config.parse import field_table

    fields = field_table(GenerateConfig)
    targets = [rule.to for rule in BATCH_INFERENCE_FLAGS.values() if rule.kind == "mapped" and rule.to]
    assert targets and all(t in fields for t in targets), [t for t in targets if t not in fields]
