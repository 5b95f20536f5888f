"""load_reward_file with reward files written to tmp_path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlhfkit.errors import RewardError
from rlhfkit.rewards import RewardFn, RewardOutput, load_reward_file

QUERIES = ["Q: 1+1? A: 2", "Q: 2+2? A: 5"]
PROMPTS = ["Q: 1+1? A:", "Q: 2+2? A:"]
LABELS = ["2", "4"]


def write(tmp_path: Path, body: str, name: str = "rm.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def test_list_return(tmp_path):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels):
            return [1.0 if q.endswith(l) else 0.0 for q, l in zip(queries, labels)]
        """,
    )
    fn = load_reward_file(path)
    assert isinstance(fn, RewardFn)
    out = fn(QUERIES, PROMPTS, LABELS, responses=[" 2", " 5"], response_lengths=[1, 1])
    assert isinstance(out, RewardOutput)
    assert out.rewards.tolist() == [1.0, 0.0] and out.scores.tolist() == [1.0, 0.0]
    assert out.extra_logs == {}


def test_dict_return_with_tensors(tmp_path):
    path = write(
        tmp_path,
        """
        import torch

        def reward_func(queries, prompts, labels, **kwargs):
            r = torch.tensor([2.0, -1.0])
            lengths = torch.tensor(kwargs["response_lengths"]).float()
            return {"rewards": r, "scores": (r > 0).float(), "extra_logs": {"len": lengths}}
        """,
    )
    out = load_reward_file(path)(QUERIES, PROMPTS, LABELS, response_lengths=[3, 7])
    assert out.rewards.tolist() == [2.0, -1.0]
    assert out.scores.tolist() == [1.0, 0.0]
    assert out.extra_logs["len"].tolist() == [3.0, 7.0]


def test_kwargs_passed_only_when_named(tmp_path):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels, responses=None):
            return [float(len(r)) for r in responses]
        """,
    )
    out = load_reward_file(path)(QUERIES, PROMPTS, LABELS, responses=["ab", "abc"], other=1)
    assert out.rewards.tolist() == [2.0, 3.0]


def test_async_reward_func(tmp_path):
    path = write(
        tmp_path,
        """
        import asyncio

        async def reward_func(queries, prompts, labels, **kwargs):
            await asyncio.sleep(0)
            return [0.5] * len(queries)
        """,
    )
    assert load_reward_file(path)(QUERIES, PROMPTS, LABELS).rewards.tolist() == [0.5, 0.5]


def test_wrong_length_names_the_file(tmp_path):
    path = write(tmp_path, "def reward_func(queries, prompts, labels):\n    return [1.0]\n")
    with pytest.raises(RewardError, match=r"rm\.py returned 1 rewards for a batch of 2"):
        load_reward_file(path)(QUERIES, PROMPTS, LABELS)


def test_nan_names_the_file_and_index(tmp_path):
    path = write(
        tmp_path, "def reward_func(queries, prompts, labels):\n    return [0.0, float('nan')]\n"
    )
    with pytest.raises(RewardError, match=r"rm\.py returned a non-finite value in rewards at index 1"):
        load_reward_file(path)(QUERIES, PROMPTS, LABELS)


def test_raising_function_shows_one_line_message(tmp_path):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels):
            raise ValueError("no grader for this task\\nsecond line")
        """,
    )
    with pytest.raises(RewardError) as info:
        load_reward_file(path)(QUERIES, PROMPTS, LABELS)
    msg = str(info.value)
    assert "rm.py raised ValueError" in msg and "no grader for this task" in msg
    assert "second line" not in msg and "\n" not in msg
    assert isinstance(info.value.__cause__, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(RewardError, match=r"nope\.py does not exist"):
        load_reward_file(tmp_path / "nope.py")


def test_no_reward_func(tmp_path):
    path = write(tmp_path, "def score(queries, prompts, labels):\n    return [0.0]\n")
    with pytest.raises(RewardError, match="reward_func is not defined"):
        load_reward_file(path)
    path = write(tmp_path, "reward_func = 3\n", name="rm2.py")
    with pytest.raises(RewardError, match="reward_func is not callable"):
        load_reward_file(path)


def test_import_errors_show_exception_line(tmp_path):
    path = write(tmp_path, "import not_a_module_rlhfkit_test\n")
    with pytest.raises(RewardError, match=r"failed to import: ModuleNotFoundError: No module named"):
        load_reward_file(path)
    path = write(tmp_path, "def reward_func(:\n", name="syntax.py")
    with pytest.raises(RewardError, match=r"syntax\.py failed to import: SyntaxError"):
        load_reward_file(path)
    path = write(tmp_path, "raise RuntimeError('boom')\n", name="boom.py")
    with pytest.raises(RewardError, match=r"failed to import: RuntimeError: boom"):
        load_reward_file(path)
    assert not [m for m in sys.modules if m.startswith("rlhfkit_reward_file_boom")]


def test_signature_that_cannot_take_three_arguments(tmp_path):
    path = write(tmp_path, "def reward_func(queries):\n    return [0.0]\n")
    with pytest.raises(RewardError, match=r"cannot be called with \(queries, prompts, labels\)"):
        load_reward_file(path)


def test_each_load_is_a_fresh_module(tmp_path):
    path = write(
        tmp_path,
        """
        CALLS = []

        def reward_func(queries, prompts, labels):
            CALLS.append(1)
            return [float(len(CALLS))] * len(queries)
        """,
    )
    a, b = load_reward_file(path), load_reward_file(path)
    a(QUERIES, PROMPTS, LABELS)
    assert a(QUERIES, PROMPTS, LABELS).rewards.tolist() == [2.0, 2.0]
    assert b(QUERIES, PROMPTS, LABELS).rewards.tolist() == [1.0, 1.0]


def test_mismatched_prompts_or_labels(tmp_path):
    path = write(tmp_path, "def reward_func(queries, prompts, labels):\n    return [0.0]\n")
    with pytest.raises(RewardError, match="2 queries, 1 prompts and 2 labels"):
        load_reward_file(path)(QUERIES, PROMPTS[:1], LABELS)


def test_builtin_math_reward_file():
    import rlhfkit.rewards.builtin_math_reward as builtin

    fn = load_reward_file(builtin.__file__)
    out = fn(
        ["Q: 6*7?\nA: 6*7 = 42", "Q: 2+3?\nA: I think 6", "Q: 1+1?\nthe answer is 2."],
        ["Q: 6*7?\nA:", "Q: 2+3?\nA:", "some other prompt"],
        [42, "5", "2"],
        responses=["unused"] * 3,
    )
    assert out.rewards.tolist() == [1.0, 0.0, 1.0]
    assert out.scores.tolist() == [1.0, 0.0, 1.0]
    assert out.extra_logs["answer_found"].tolist() == [1.0, 1.0, 1.0]
    assert torch.equal(out.rewards, out.scores)


def test_builtin_math_reward_scores_only_the_response():
    from rlhfkit.rewards.builtin_math_reward import reward_func, split_response

    # the prompt's number 7 must not count: the response has no number
    assert reward_func(["What is 7? I do not know"], ["What is 7?"], ["7"])["rewards"].tolist() == [0.0]
    assert split_response("abc def", "abc") == " def"
    assert split_response("xyz", "abc") == "xyz"


def test_file_colon_name_picks_the_function_of_any_contract(tmp_path):
    from rlhfkit.rewards.loader import split_function
    from rlhfkit.rewards.resolve import resolve_reward

    path = write(tmp_path, """
        def reward_func(queries, prompts, labels):
            return [9.0] * len(queries)

        def exact(data_source, solution_str, ground_truth, extra_info=None):  # verl's contract
            return float(solution_str.strip() == ground_truth)

        def lengths(completions, **kwargs):  # TRL's
            return [float(len(c)) for c in completions]
        """)
    assert split_function(f"{path}:exact") == (str(path), "exact")
    assert split_function(str(path)) == (str(path), None) and split_function("http://h:80/x") == ("http://h:80/x", None)
    responses = [" 2", " 5"]
    def scores(spec):
        return resolve_reward(spec)(QUERIES, PROMPTS, LABELS, responses=responses).rewards.tolist()

    assert scores(f"{path}:exact") == [1.0, 0.0] and scores(f"{path}:lengths") == [2.0, 2.0]
    assert resolve_reward(str(path))(QUERIES, PROMPTS, LABELS).rewards.tolist() == [9.0, 9.0]  # reward_func
    with pytest.raises(RewardError, match=r"has no function 'nope' \(its functions: exact, lengths, reward_func\)"):
        resolve_reward(f"{path}:nope")
