"""Exact-answer math reward: pull a number out of a response and compare it with the label.

String logic (sympy only through math-verify in the "latex" mode). Numbers are read by one regular expression, with
these choices:
  * a minus sign belongs to the number when it does not follow a letter, digit, '.' or '-'
    ("-5" and "x = -5" give -5; "3-5" gives 3 then 5);
  * commas group thousands only in groups of exactly three digits: "1,234" is 1234 and
    "1,234,567" is 1234567, but "12, not 13" is 12 then 13 and "1,23" is 1 then 23;
  * a decimal part is kept ("12.0" equals 12, "3.5" does not equal 3); a sentence's full stop
    is not a decimal point ("The answer is 12." gives 12).
Values compare exactly as fractions, so "12", "12.0", " 12 ", 12 and "1,234" vs 1234 all match.
Labels and boxed answers may also be simple fractions: "3/4", "\\frac{3}{4}", "\\dfrac34".
A candidate that is not a number (e.g. "\\sqrt{2}") is compared with the label as a string
after removing spaces and "$", so exact symbolic answers still count.

Modes of `math_exact_reward` (chosen from `EXTRACTORS`):
  first_integer  the first number in the response must be the answer (short-answer tasks,
                 e.g. "12, because ..."); see `extract_first_integer`
  answer         `\\boxed{...}` (the last one), else "Answer: X" / "answer is X" / "#### X"
                 (the last one), else the last number; see `extract_answer`
  latex          the `answer` extraction, then symbolic equivalence with the label through
                 math-verify (sympy): "\\frac{1}{2}" = "0.5", "2\\pi" = "\\pi \\cdot 2",
                 "\\sqrt{8}" = "2\\sqrt{2}"; see `latex_equal`
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import torch

from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.rewards.base import RewardOutput

_NUMBER = r"(?:(?<![\w.\-])-)?(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?![\d,]\d)|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER, re.ASCII)
_MARKED_RE = re.compile(
    r"(?:answer\s*(?:is|=|:)|####)\s*[:=]?\s*[$*]*\s*(" + _NUMBER + ")", re.IGNORECASE | re.ASCII
)
_FRAC_RE = re.compile(r"^\\[dt]?frac\{?(-?\d+)\}?\{?(-?\d+)\}?$")
_SLASH_RE = re.compile(r"^(-?\d+)/(-?\d+)$")
_PLAIN_RE = re.compile(r"^-?\d+(?:\.\d+)?$")
_GROUPED_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def parse_number(text: str | int | float) -> Fraction | None:
    """The exact value of a number written as text (or given as int / float); None if not one.

    Accepts "12", " -12.50 ", "1,234", "$12", "12.", "3/4", "\\frac{3}{4}", 12, 12.0. A number of
    more digits than Python converts (4300; a policy repeating "9" writes one) is None, not an error.
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(repr(text)) if text == text and abs(text) != float("inf") else None
    s = text.strip().strip("$").strip().rstrip(".")
    if _GROUPED_RE.match(s):
        s = s.replace(",", "")
    try:
        if _PLAIN_RE.match(s):
            return Fraction(s)
        match = _FRAC_RE.match(s) or _SLASH_RE.match(s)
        if match and int(match.group(2)) != 0:
            return Fraction(int(match.group(1)), int(match.group(2)))
    except ValueError:  # past sys.get_int_max_str_digits()
        return None
    return None


def find_numbers(text: str) -> list[str]:
    """Every number in `text`, in order, as written (e.g. "1,234", "-5", "2.5")."""
    return _NUMBER_RE.findall(text)


def extract_first_integer(text: str) -> int | None:
    """The first number in `text` if it is a whole number ("12.0" gives 12), else None.

    "12, not 13" gives 12; "-5 apples" gives -5; "3.5 or 4" gives None (the first number is
    not whole, and skipping it would reward a response that led with a wrong answer).
    """
    numbers = find_numbers(text)
    if not numbers:
        return None
    value = parse_number(numbers[0])
    if value is None or value.denominator != 1:
        return None
    return int(value)


def extract_bare_number(text: str) -> int | None:
    """The whole response is one whole number (surrounding space and one final period allowed):
    "64", " 64.\n" give 64; "The answer is 64.", "64 + 1", "64\nbecause" give None.

    This is the strict "answer with only the number" format: nothing but the answer counts.
    """
    stripped = text.strip()
    if stripped.endswith("."):
        stripped = stripped[:-1].rstrip()
    numbers = find_numbers(stripped)
    if len(numbers) != 1 or numbers[0].strip() != stripped:
        return None
    return extract_first_integer(stripped)


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (nested braces allowed); None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None  # unclosed brace: no usable box


def extract_answer(text: str) -> str | None:
    """The final answer of a worked solution, as a string; None if nothing is found.

    Priority: the last `\\boxed{...}`; else the number after the last "Answer: X",
    "answer is X", "answer = X" or "#### X" (case-insensitive); else the last number.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    marked = _MARKED_RE.findall(text)
    if marked:
        return marked[-1]
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def answers_equal(candidate: str | int | None, label: Any) -> bool:
    """True when candidate and label are the same number, or the same non-numeric string."""
    if candidate is None:
        return False
    a = parse_number(candidate)
    b = parse_number(label) if isinstance(label, (str, int, float)) else None
    if a is not None and b is not None:
        return a == b
    if a is None and b is None and isinstance(candidate, str) and isinstance(label, str):
        return _squash(candidate) == _squash(label) != ""
    return False


def latex_equal(candidate: str | None, label: Any) -> bool:
    """True when `candidate` equals `label` exactly (`answers_equal`) or symbolically (math-verify).

    Both are read as LaTeX math ("$...$" is added when missing), so fractions, roots, pi and
    simple expressions compare by value. math-verify's signal-based timeouts only work in the
    main thread; elsewhere they are switched off.
    """
    if candidate is None or label is None:
        return False
    if answers_equal(candidate, label):
        return True
    from math_verify import parse, verify  # imports sympy: slow, only when used

    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None

    def read(text: str):
        text = text.strip()
        return parse(text if text.startswith("$") or "\\boxed" in text else f"${text}$", parsing_timeout=timeout)

    gold, pred = read(str(label)), read(str(candidate))
    return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))


def lenient_correct(response: str, label: Any) -> bool:
    """True when the label's number appears anywhere in the response's first non-empty line."""
    lines = [line for line in response.strip().splitlines() if line.strip()]
    if not lines:
        return False
    return any(answers_equal(n, label) for n in find_numbers(lines[0]))


EXTRACTORS: dict[str, Callable[[str], str | int | None]] = {
    "first_integer": extract_first_integer,
    "bare_number": extract_bare_number,
    "answer": extract_answer,
}


def math_exact_reward(
    responses: Sequence[str], labels: Sequence[Any], mode: str = "first_integer"
) -> RewardOutput:
    """Reward 1.0 when the answer extracted from each response equals its label, else 0.0.

    Args:
      responses: B response strings (the generated part only, not the prompt).
      labels: B reference answers (str, int or float; "12", "12.0", " 12 " and 12 are equal).
      mode: a key of `EXTRACTORS` ("first_integer", "bare_number", "answer") or "latex".

    Returns:
      RewardOutput with rewards = scores: FloatTensor [B] of 0.0 / 1.0, and extra_logs
      {"answer_found": [B]} (1.0 where the extractor found an answer at all).

    Raises:
      ConfigError: an unknown mode. RewardError: lengths differ or a label is None.
    """
    if mode not in EXTRACTORS and mode != "latex":
        raise ConfigError(
            f"math reward mode {mode!r} is unknown; valid modes: {sorted([*EXTRACTORS, 'latex'])}"
        )
    if len(responses) != len(labels):
        raise RewardError(
            f"math reward: {len(responses)} responses but {len(labels)} labels; give one label each"
        )
    extract = EXTRACTORS["answer" if mode == "latex" else mode]
    equal = latex_equal if mode == "latex" else answers_equal
    rewards, found = [], []
    for i, (response, label) in enumerate(zip(responses, labels)):
        if label is None:
            raise RewardError(
                f"math reward: label {i} is None; load the prompts with a label_key that holds "
                "the reference answer"
            )
        candidate = extract(response)
        found.append(0.0 if candidate is None else 1.0)
        rewards.append(1.0 if equal(candidate, label) else 0.0)
    reward_tensor = torch.tensor(rewards, dtype=torch.float32)
    return RewardOutput(
        rewards=reward_tensor,
        scores=reward_tensor.clone(),
        extra_logs={"answer_found": torch.tensor(found, dtype=torch.float32)},
    )


def _squash(text: str) -> str:
    return text.replace(" ", "").replace("$", "").rstrip(".")
