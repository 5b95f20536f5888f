"""Exact-answer math reward on hand-made strings, including the tricky ones."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rewards.math import (
    answers_equal,
    extract_answer,
    extract_boxed,
    extract_first_integer,
    find_numbers,
    lenient_correct,
    math_exact_reward,
    parse_number,
)


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("The answer is 12.", ["12"]),
        ("12, not 13", ["12", "13"]),
        ("-5", ["-5"]),
        ("x = -5 and y=-3", ["-5", "-3"]),
        ("pages 3-5", ["3", "5"]),  # a hyphen between numbers is not a sign
        ("1,234 apples", ["1,234"]),  # thousands separator
        ("1,234,567", ["1,234,567"]),
        ("1,2,3", ["1", "2", "3"]),  # not groups of three: a list
        ("1,23", ["1", "23"]),
        ("pi is 3.14.", ["3.14"]),
        ("costs $2.50, ok", ["2.50"]),
        ("abc12def", ["12"]),
        ("no digits here", []),
    ],
)
def test_find_numbers(text, numbers):
    assert find_numbers(text) == numbers


@pytest.mark.parametrize(
    "text, value",
    [
        ("12, not 13", 12),
        ("The answer is 12.", 12),
        ("-5 degrees", -5),
        ("1,234", 1234),
        ("12.0 exactly", 12),
        ("3.5 or 4", None),  # first number is not whole
        ("nothing", None),
        ("**42**", 42),
    ],
)
def test_extract_first_integer(text, value):
    assert extract_first_integer(text) == value


@pytest.mark.parametrize(
    "text, answer",
    [
        ("So 3 + 4 = 7, answer \\boxed{7}. Check: 8", "7"),  # boxed beats the last number
        ("\\boxed{1} then \\boxed{ 2 }", "2"),  # the last box
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("Answer: 12\nCheck: 3*4 = 12 and 13 is wrong", "12"),
        ("The answer is -5. Since 10 - 15 = -5, 2 steps", "-5"),
        ("Final Answer: The answer is 42 (not 41)", "42"),
        ("answer is **7**, 8 was wrong", "7"),
        ("Reasoning...\n#### 1,000", "1,000"),
        ("we get 3 then 4 then 5", "5"),  # last number
        ("\\boxed{7", "7"),  # unclosed box: fall back to the last number
        ("no numbers", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_extract_boxed():
    assert extract_boxed("a \\boxed{x^{2}+1} b") == "x^{2}+1"
    assert extract_boxed("no box") is None


@pytest.mark.parametrize(
    "text, value",
    [
        ("12", Fraction(12)),
        (" 12 ", Fraction(12)),
        ("12.0", Fraction(12)),
        ("12.", Fraction(12)),
        ("-0.5", Fraction(-1, 2)),
        ("1,234", Fraction(1234)),
        ("$12", Fraction(12)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("\\dfrac34", Fraction(3, 4)),
        (12, Fraction(12)),
        (0.1, Fraction(1, 10)),
        ("1/0", None),
        ("12 apples", None),
        ("", None),
        (True, None),
        (float("nan"), None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_answers_equal():
    assert answers_equal("12", 12) and answers_equal(12, " 12 ") and answers_equal("12.0", "12")
    assert answers_equal("0.5", "\\frac{1}{2}")
    assert answers_equal("\\sqrt{2}", "\\sqrt{ 2 }")  # non-numbers compare as squashed strings
    assert not answers_equal("12", "13")
    assert not answers_equal(None, "12")
    assert not answers_equal("\\sqrt{2}", "2")
    assert not answers_equal("", "")


def test_math_exact_reward_first_integer():
    out = math_exact_reward(
        ["12, not 13", "13, not 12", "-5", "1,234 is it", "I cannot tell", "12.0"],
        ["12", 12, -5, "1234", "7", " 12 "],
    )
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert out.scores.tolist() == out.rewards.tolist()
    assert out.extra_logs["answer_found"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]


def test_math_exact_reward_answer_mode():
    out = math_exact_reward(
        ["Since 5+7=12, the answer is 12.", "first 3, so \\boxed{4}", "hmm 2 or 3", "Answer: 0.5"],
        [12, "3", "3", "1/2"],
        mode="answer",
    )
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_a_number_past_pythons_digit_limit_scores_0_instead_of_ending_the_run():
    """A collapsed policy repeating "9" writes a number of more than 4300 digits, which int() refuses."""
    huge = "9" * 5000
    for mode in ("first_integer", "answer", "bare_number"):
        out = math_exact_reward([f"The answer is {huge}", f"\\boxed{{{huge}}}", f"{huge}/3", "5"], ["5"] * 4, mode=mode)
        assert out.rewards.tolist() == [0.0, 0.0, 0.0, 1.0], mode
    assert parse_number(huge) is None and parse_number(f"0.{huge}") is None and parse_number(f"1/{huge}") is None
    assert extract_first_integer(huge + " apples") is None and parse_number("9" * 4000) == int("9" * 4000)


def test_math_exact_reward_errors():
    with pytest.raises(ConfigError,
                       match=r"unknown; valid modes: \['answer', 'bare_number', 'first_integer', 'latex'\]"):
        math_exact_reward(["1"], ["1"], mode="sympy")
    with pytest.raises(RewardError, match="2 responses but 1 labels"):
        math_exact_reward(["1", "2"], ["1"])
    with pytest.raises(RewardError, match="label 1 is None; .*label_key"):
        math_exact_reward(["1", "2"], ["1", None])


def test_empty_batch():
    out = math_exact_reward([], [])
    assert out.rewards.shape == (0,) and out.scores.shape == (0,)


@pytest.mark.parametrize(
    "response, label, ok",
    [
        ("I think it is 12 or so\nthen 99", "12", True),
        ("Between 11 and 13\n12", 12, False),  # the right number is not on the first line
        ("\n\n  x = -5, done", -5, True),  # leading blank lines are skipped
        ("1,234 total", 1234, True),
        ("", "1", False),
    ],
)
def test_lenient_correct(response, label, ok):
    assert lenient_correct(response, label) is ok


@pytest.mark.parametrize(
    "text,value",
    [
        ("64", 64),
        (" 64.\n", 64),
        ("-5", -5),
        ("64.0", 64),
        ("The answer is 64.", None),
        ("64 + 1", None),
        ("64\nbecause", None),
        ("64, 65", None),
        ("", None),
        ("3.5", None),
    ],
)
def test_extract_bare_number(text, value):
    from rlhfkit.rewards.math import extract_bare_number

    assert extract_bare_number(text) == value


def test_math_exact_reward_bare_number_mode():
    out = math_exact_reward(["40", "The answer is 40.", "41", "40."], ["40", "40", "40", 40], mode="bare_number")
    assert out.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("response,label,expected", [
    ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("the answer is 0.5", "\\frac{1}{2}", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{\\pi \\cdot 2}", "2\\pi", 1.0),
    ("\\boxed{1,234}", "1234", 1.0),
    ("first 3 then 12", "12", 1.0),  # last number
    ("the answer is 3", "4", 0.0),
    ("\\boxed{\\pi}", "3.14", 0.0),
    ("\\boxed{x+1}", "1+x", 1.0),
    ("no answer here", "4", 0.0),
])
def test_latex_mode_compares_by_value(response, label, expected):
    assert math_exact_reward([response], [label], mode="latex").rewards.tolist() == [expected]


def test_latex_equal_works_off_the_main_thread():
    import threading

    from rlhfkit.rewards.math import latex_equal

    out = []
    t = threading.Thread(target=lambda: out.append(latex_equal("\\frac{2}{4}", "0.5")))
    t.start()
    t.join()
    assert out == [True]
