"""Several prompt datasets for `train rl`: --data.prompt_dataset a,b read as one, mixed by
--data.prompt_probs as OpenRLHF's blending_datasets mixes --prompt_data with --prompt_data_probs;
the mixed prompts through the run's PromptStream, resumed exactly."""

import json

import numpy as np
import pytest

from rlhfkit.api.builder import prompt_options, prompt_source, prompt_stream
from rlhfkit.api.rl import load_examples_fn
from rlhfkit.config import RLConfig
from rlhfkit.data.prompts import check_prompts, tokenize_prompts
from rlhfkit.data.records import Blend, read_records
from rlhfkit.errors import CheckpointError, ConfigError
from rlhfkit.models import tiny_tokenizer


def write(path, prompts):
    path.write_text("".join(json.dumps({"input": p}) + "\n" for p in prompts))
    return path


def cfg_of(*flags):
    return RLConfig.from_args(list(map(str, flags)))


def mixed(cfg):
    """The training prompts' texts, in the mix's order (read_records does not shuffle)."""
    return [r.data["input"] for r in read_records(prompt_source(cfg))]


@pytest.fixture
def two(tmp_path):
    return write(tmp_path / "a.jsonl", ["a0", "a1"]), write(tmp_path / "b.jsonl", ["b0", "b1", "b2"])


def test_the_mix_of_a_fixed_seed_by_hand(two):
    """Each next prompt comes from the dataset numpy's generator of the seed draws (datasets'
    interleave_datasets), a dataset that runs out starts again, and the mix ends when the last one
    has been read to its end."""
    a, b = two
    draws = np.random.default_rng(0).choice(2, size=8, p=[0.7, 0.3]).tolist()
    assert draws == [0, 0, 0, 0, 1, 1, 0, 1]  # a a a a b b a b
    cfg = cfg_of("--data.prompt_dataset", f"{a},{b}", "--data.prompt_probs", "0.7,0.3", "--train.seed", 0)
    # a: a0 a1, then again a0 a1; b: b0 b1; a: a0; b: b2 -> b read to its end, the mix stops
    assert mixed(cfg) == ["a0", "a1", "a0", "a1", "b0", "b1", "a0", "b2"]
    assert check_prompts(prompt_source(cfg), **prompt_options(cfg)) == 8  # what train rl counts and plans


def test_without_probabilities_the_datasets_are_concatenated(two):
    a, b = two
    assert mixed(cfg_of("--data.prompt_dataset", f"{a},{b}")) == ["a0", "a1", "b0", "b1", "b2"]
    assert prompt_source(cfg_of("--data.prompt_dataset", a)) == str(a)  # one dataset: read as before


def test_the_proportions_over_many_draws_follow_the_probabilities(tmp_path):
    """One prompt in a.jsonl, 300 in b.jsonl: the mix runs until b's 300 were drawn, ~1000 draws at
    0.7 / 0.3, so a's prompt is ~70% of it (ignoring the probabilities: 1 of 301)."""
    a = write(tmp_path / "a.jsonl", ["a0"])
    b = write(tmp_path / "b.jsonl", [f"b{i}" for i in range(300)])
    for probs, share in (("0.7,0.3", 0.7), ("0.5,0.5", 0.5)):
        got = mixed(cfg_of("--data.prompt_dataset", f"{a},{b}", "--data.prompt_probs", probs))
        assert set(got) == {"a0"} | {f"b{i}" for i in range(300)}  # every prompt of b, once
        assert got.count("a0") / len(got) == pytest.approx(share, abs=0.04)
        assert len(got) == pytest.approx(300 / (1 - share), rel=0.1)


def test_max_samples_cuts_each_dataset_before_the_mix(two):
    a, b = two
    cfg = cfg_of("--data.prompt_dataset", f"{a},{b}", "--data.prompt_probs", "0.5,0.5", "--data.max_samples", 1)
    assert set(mixed(cfg)) == {"a0", "b0"}
    assert check_prompts(prompt_source(cfg), **prompt_options(cfg)) == 1  # and one prompt of the mix


@pytest.mark.parametrize("probs,needle", [
    ("0.5", "--data.prompt_probs '0.5' has 1 probabilities for 2 dataset(s)"),
    ("0,1", "--data.prompt_probs '0,1': the probabilities must be > 0 and sum to 1"),
    ("0.5,0.6", "must be > 0 and sum to 1"),
    ("half,half", "--data.prompt_probs 'half,half': expected comma-separated numbers"),
])
def test_bad_probabilities_are_one_line_config_errors(two, probs, needle):
    a, b = two
    with pytest.raises(ConfigError) as err:
        prompt_source(cfg_of("--data.prompt_dataset", f"{a},{b}", "--data.prompt_probs", probs))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_train_dataset_path_is_mixed_and_a_prompt_function_refused(two):
    a, b = two
    cfg = cfg_of("--data.prompt_probs", "0.5,0.5")
    assert isinstance(prompt_source(cfg, f"{a},{b}"), Blend)
    with pytest.raises(ConfigError, match="a prompt function cannot be mixed"):
        prompt_source(cfg, lambda tokenizer: [])


def stream_of(cfg, tok):
    prompts, _ = tokenize_prompts(load_examples_fn(cfg, prompt_source(cfg))(tok), tok, 64, "input")
    return prompt_stream(cfg, prompts)


def texts(batch):
    return [p.text for p in batch.prompts]


def test_a_resumed_run_draws_the_mixed_prompts_of_the_uninterrupted_one(two):
    a, b = two
    tok = tiny_tokenizer()
    flags = ["--data.prompt_dataset", f"{a},{b}", "--data.prompt_probs", "0.7,0.3", "--rollout.batch_size", 2,
             "--train.batch_size", 16, "--train.num_episodes", 2, "--train.seed", 0]
    whole = stream_of(cfg_of(*flags), tok)
    first = [whole.take(2) for _ in range(3)]
    state = whole.state_dict()
    rest = [whole.take(2) for _ in range(5)]
    resumed = stream_of(cfg_of(*flags), tok)  # built again from the files, as a resumed run builds it
    resumed.load_state_dict(state)
    again = [resumed.take(2) for _ in range(5)]
    assert [texts(x) for x in again] == [texts(x) for x in rest] and [x.seeds for x in again] == [x.seeds for x in rest]
    # each episode draws the 8 prompts of the mix (test_the_mix_of_a_fixed_seed_by_hand), 5 of them a's
    assert sum(t.startswith("a") for x in first + rest for t in texts(x)) == 2 * 5
    other = stream_of(cfg_of(*flags[:-1], 10), tok)  # seed 10: a mix of as many prompts, in another order
    assert len(other.prompts) == len(whole.prompts) == 8 and other.digest() != whole.digest()
    with pytest.raises(CheckpointError, match="written with other prompts"):
        other.load_state_dict(state)


def test_generate_reads_the_mix_and_takes_batch_inference_flags(two):
    """`rlhfkit generate` (and train rs / iterative-dpo) reads its prompts as train rl does; OpenRLHF's
    batch_inference --dataset a,b --dataset_probs is --data.prompt_dataset with --data.prompt_probs."""
    from rlhfkit.api.workflows import load_prompt_items
    from rlhfkit.config.generate import GenerateConfig

    a, b = two
    theirs = GenerateConfig.from_args(["--dataset", f"{a},{b}", "--dataset_probs", "0.7,0.3", "--train.seed", "0"])
    assert theirs == GenerateConfig.from_args(["--data.prompt_dataset", f"{a},{b}", "--data.prompt_probs", "0.7,0.3",
                                               "--train.seed", "0"])
    items, _ = load_prompt_items(theirs, tiny_tokenizer())
    assert sorted(p.text for p in items) == sorted(["a0", "a1", "a0", "a1", "b0", "b1", "a0", "b2"])
