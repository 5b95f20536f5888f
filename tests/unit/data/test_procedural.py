"""reasoning_gym:TASK prompt sources (reasoning-gym installed: rlhfkit[reasoning-gym]): the spec's options, the
generated records by hand, their reading through read_records / load_prompts, and one-line errors."""

import sys

import pytest

from rlhfkit.data import procedural
from rlhfkit.data.procedural import parse_spec, reasoning_gym_records
from rlhfkit.data.prompts import check_prompts, load_prompts
from rlhfkit.data.records import as_source, read_records
from rlhfkit.errors import ConfigError

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (rlhfkit[reasoning-gym])")

TWO_ANIMALS = "reasoning_gym:leg_counting:size=2:seed=0:min_animals=2:max_animals=2"


def test_the_spec_gives_the_task_and_its_options_with_defaults():
    assert parse_spec("reasoning_gym:leg_counting") == (
        "leg_counting", {"size": 1000, "seed": 0, "system_prompt": "default"})
    assert parse_spec("reasoning_gym:chain_sum:size=5:seed=3:allow_negation=true:tag=x:system_prompt=none") == (
        "chain_sum", {"size": 5, "seed": 3, "system_prompt": "none", "allow_negation": True, "tag": "x"})


def test_leg_counting_entries_by_hand():
    first, second = read_records(TWO_ANIMALS)
    # 5 grasshoppers x 6 legs + 9 jellyfish x 0; 5 woodlice x 14 + 2 leeches x 0
    assert first.data["question"].endswith("if you have 5 grasshoppers, 9 jellyfishs?\n")
    assert (first.data["answer"], second.data["answer"]) == ("30", "70")
    assert first.data["metadata"]["source_dataset"] == "leg_counting" and first.where == "record 0"
    system, user = first.data["prompt"]
    assert system["role"] == "system" and "<answer>answer here</answer>" in system["content"]
    assert user == {"role": "user", "content": first.data["question"]}
    again = reasoning_gym_records(TWO_ANIMALS)
    assert [r["answer"] for r in again] == ["30", "70"]  # the same seed, the same entries
    assert [r["answer"] for r in reasoning_gym_records(TWO_ANIMALS.replace("seed=0", "seed=1"))] != ["30", "70"]
    bare = reasoning_gym_records(TWO_ANIMALS + ":system_prompt=none")
    assert bare[0]["prompt"] == [{"role": "user", "content": first.data["question"]}]


def test_two_tasks_read_as_one_blend():
    blend = as_source(f"{TWO_ANIMALS},reasoning_gym:basic_arithmetic:size=1")
    records = read_records(blend)
    assert [r.data["metadata"]["source_dataset"] for r in records] == ["leg_counting"] * 2 + ["basic_arithmetic"]


@pytest.mark.parametrize("spec, message", [
    ("leg_countin", r"reasoning-gym has no task 'leg_countin'; similar: leg_counting"),
    ("leg_counting:legs=3", r"leg_counting refused the options \(TypeError: .*'legs'"),
    ("leg_counting:min_animals=4:max_animals=2", r"refused the options \(AssertionError: max_animals must be >= min"),
    ("leg_counting:size=many", r"size must be a whole number >= 0 \(got 'many'\)"),
    ("leg_counting:seed", r"'seed' is not KEY=VALUE"),
    ("leg_counting:system_prompt=chatty", r"system_prompt 'chatty' is not one of reasoning-gym's"),
])
def test_bad_specs_are_one_line_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        read_records(f"reasoning_gym:{spec}")


def test_without_reasoning_gym_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed
    procedural._generate.cache_clear()  # a process without it has generated nothing
    with pytest.raises(ConfigError, match=r"reasoning-gym is not installed: pip install 'rlhfkit\[reasoning-gym\]'"):
        read_records("reasoning_gym:leg_counting")


def test_the_check_and_the_load_generate_the_entries_once_and_each_read_gets_its_own(monkeypatch):
    import reasoning_gym

    original, made = reasoning_gym.create_dataset, []

    def counting(task, **options):
        made.append(task)
        return original(task, **options)

    monkeypatch.setattr(reasoning_gym, "create_dataset", counting)
    spec = "reasoning_gym:leg_counting:size=3:seed=11"
    assert check_prompts(spec, input_key="question", label_key="answer") == 3  # the run's check
    examples = load_prompts(spec, input_key="question", label_key="answer")  # and its load
    assert made == ["leg_counting"]
    records = reasoning_gym_records(spec)
    assert [e.label for e in examples] == [r["answer"] for r in records]
    records[0]["metadata"]["source_dataset"] = "changed"  # a reader changing its records
    assert reasoning_gym_records(spec)[0]["metadata"]["source_dataset"] == "leg_counting"
    assert made == ["leg_counting"]
