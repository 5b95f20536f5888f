"""builtin:reasoning_gym (reasoning-gym installed): the task's own score_answer on the one <answer> tag, by hand;
the shortcuts an RL policy finds (no tag, an empty one, several, a dump holding the right answer) score 0."""

import pytest

from rlhfkit.data.procedural import reasoning_gym_records
from rlhfkit.errors import RewardError
from rlhfkit.rewards.reasoning_gym import JUNK, score_response, single_answer
from rlhfkit.rewards.resolve import resolve_reward

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (rlhfkit[reasoning-gym])")


def test_single_answer_reads_one_non_empty_tag():
    assert single_answer("Five times six... <answer> 30 </answer>") == "30"
    assert single_answer("<answer>\n30\n</answer> done") == "30"
    assert single_answer("30") is None and single_answer("<answer>  </answer>") is None
    assert single_answer("<answer>28</answer> or <answer>30</answer>") is None  # reasoning-gym would take 30
    assert single_answer("<answer>30") is None and single_answer("<answer>30</answer><answer>") is None


def test_containment_credit_is_taken_away_and_other_partial_credit_kept():
    entry = {"answer": "30", "metadata": {}}

    def default_scoring(answer, entry):  # reasoning-gym's ProceduralDataset.score_answer
        oracle = entry["answer"]
        return 1.0 if answer == oracle else len(oracle) / len(answer) if oracle in answer else 0.0

    assert default_scoring("28 29 30 31", entry) == pytest.approx(2 / 11)  # what the dump would earn
    assert score_response("<answer>28 29 30 31</answer>", entry, default_scoring) == 0.0
    assert score_response("<answer>30</answer>", entry, default_scoring) == 1.0
    assert score_response("<answer>300</answer>", entry, default_scoring) == 0.0  # 2/3 before
    assert score_response("<answer>3</answer>", entry, lambda a, e: 0.5) == 0.5  # not holding 30: kept


def test_builtin_reward_scores_leg_counting_with_its_own_score_answer():
    records = reasoning_gym_records("reasoning_gym:leg_counting:size=2:seed=0:min_animals=2:max_animals=2")  # 30, 70
    fn = resolve_reward("builtin:reasoning_gym")
    responses = ["legs: <answer>30</answer>", "<answer>70</answer><answer>70</answer>", "<answer>69</answer>",
                 "<answer>70, 71</answer>", "70"]
    rows = [records[0], records[1], records[1], records[1], records[1]]
    out = fn(responses, [""] * 5, [None] * 5, responses=responses, records=rows)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert out.extra_logs["answer_tag"].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]


def test_entries_of_several_tasks_in_one_batch_and_a_row_that_is_not_an_entry():
    legs = reasoning_gym_records("reasoning_gym:leg_counting:size=1:seed=0:min_animals=2:max_animals=2")[0]
    arith = reasoning_gym_records("reasoning_gym:basic_arithmetic:size=1:seed=0")[0]
    fn = resolve_reward("builtin:reasoning_gym")
    responses = ["<answer>30</answer>", f"<answer>{arith['answer']}</answer>"]
    assert fn(responses, ["", ""], [None, None], responses=responses, records=[legs, arith]).rewards.tolist() == [1, 1]
    with pytest.raises(RewardError, match=r"sample 0's prompt record is not a reasoning-gym entry .*:TASK"):
        fn(["<answer>1</answer>"], [""], [None], responses=["<answer>1</answer>"], records=[{"q": "1+0"}])


def test_an_answer_holding_the_right_one_scores_0_even_where_the_task_gives_full_credit():
    entry = {"answer": "noremopyh", "metadata": {}}

    def search_scoring(answer, entry):  # as knights_knaves: the oracle found anywhere, case aside
        return 1.0 if entry["answer"].lower() in answer.lower() else 0.0

    assert search_scoring("The answer is NOREMOPYH", entry) == 1.0
    assert score_response("<answer>The answer is NOREMOPYH</answer>", entry, search_scoring) == 0.0
    assert score_response("<answer>noremopyh noremopyh</answer>", entry, search_scoring) == 0.0
    assert score_response("<answer>NOREMOPYH</answer>", entry, search_scoring) == 1.0  # the task's casing rule
    grid = {"answer": "1 0\n0 1", "metadata": {}}
    assert score_response("<answer>guess: 1 0 0 1</answer>", grid, search_scoring) == 0.0  # whitespace aside
    assert score_response("<answer>1  0\n0 1</answer>", grid, lambda a, e: 1.0) == 1.0


@pytest.mark.parametrize("task, answers", [
    ("spell_backward", ["{o} x", "{O} 0 1"]),  # its prefix scoring gives these 1.0000000000000002 (> the word)
    ("knights_knaves", ["The answer is {o}", "0 {O}"]),
    ("quantum_lock", ["{o} or something else"]),
    ("gsm_symbolic", ["{o} dollars", "{o}\n0 1 2"]),
])
def test_real_tasks_that_credit_an_answer_holding_the_right_one(task, answers):
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(task, size=1, seed=0)
    entry = dataset[0]
    for answer in answers:
        text = answer.format(o=entry["answer"], O=entry["answer"].upper())
        assert dataset.score_answer(text, entry) >= 1.0  # what the task alone gives
        assert score_response(f"<answer>{text}</answer>", entry, dataset.score_answer) == 0.0
    assert score_response(f"<answer>{entry['answer']}</answer>", entry, dataset.score_answer) == 1.0


def test_an_answer_the_task_cannot_parse_scores_0_and_the_batch_goes_on():
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("prime_factorization", size=1, seed=0)
    entry = dataset[0]
    with pytest.raises(ValueError):  # its parsing reads each factor with int()
        dataset.score_answer("two times three", entry)
    fn = resolve_reward("builtin:reasoning_gym")
    responses = ["<answer>two times three</answer>", f"<answer>{entry['answer']}</answer>"]
    assert fn(responses, ["", ""], [None, None], responses=responses, records=[entry, entry]).rewards.tolist() == [0, 1]


def test_a_task_that_credits_a_junk_answer_is_refused():
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("game_of_life_halting", size=1, seed=0)
    entry = dataset[0]
    if dataset.score_answer(JUNK, entry) < 1.0:
        pytest.skip("this reasoning-gym's game_of_life_halting scores a junk answer 0")
    assert dataset.score_answer("not even a guess", entry) == 1.0  # bool(answer) == bool(oracle)
    fn = resolve_reward("builtin:reasoning_gym")
    with pytest.raises(RewardError, match=r"game_of_life_halting gives full credit to the junk .* leave the task"):
        fn(["<answer>x</answer>"], [""], [None], responses=["<answer>x</answer>"], records=[entry])


def test_partial_credit_false_scores_a_constant_answer_0_and_the_right_one_1():
    from rlhfkit.api.builder import load_reward
    from rlhfkit.config.rl import ReasoningGymRewardConfig, RewardConfig, RLConfig

    records = [reasoning_gym_records("reasoning_gym:time_intervals:size=1:seed=0")[0],  # 5 days
               *reasoning_gym_records("reasoning_gym:polynomial_equations:size=2:seed=0"),  # roots 0 and more
               *reasoning_gym_records("reasoning_gym:rectangle_count:size=3:seed=0")[1:]]  # 3, 1 rectangles
    responses = ["<answer>0</answer>"] * 5
    kept = resolve_reward("builtin:reasoning_gym")(responses, [""] * 5, [None] * 5, responses=responses,
                                                   records=records)
    assert kept.rewards.tolist() == pytest.approx([0.95, 0.5, 0.5, 0.32, 0.64])  # the tasks' credit to "0"
    cfg = RLConfig.from_args(["--reward.remote_url", "builtin:reasoning_gym",
                              "--reward.reasoning_gym.partial_credit", "false"])
    assert cfg.reward.reasoning_gym == ReasoningGymRewardConfig(partial_credit=False)
    exact = load_reward(cfg.reward)
    assert exact(responses, [""] * 5, [None] * 5, responses=responses, records=records).rewards.tolist() == [0] * 5
    right = [f"<answer>{r['answer']}</answer>" for r in records]
    assert exact(right, [""] * 5, [None] * 5, responses=right, records=records).rewards.tolist() == [1] * 5
    assert load_reward(RewardConfig(remote_url="builtin:reasoning_gym")).fn.name == "builtin_reasoning_gym_reward"
