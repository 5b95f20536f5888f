"""Prompt datasets a library generates: reasoning-gym's procedural tasks (`reasoning_gym:TASK`).

    --data.prompt_dataset reasoning_gym:leg_counting
    --data.prompt_dataset reasoning_gym:leg_counting:size=200:seed=7:max_animals=4
    --data.prompt_dataset reasoning_gym:leg_counting,reasoning_gym:basic_arithmetic   (two tasks, mixed)

`reasoning_gym:TASK[:KEY=VALUE]...` is `reasoning_gym.create_dataset(TASK, size=, seed=, **options)`
(Stojanovski et al. 2025, "REASONING GYM: Reasoning Environments for Reinforcement Learning with
Verifiable Rewards"): `size` entries (default `DEFAULT_SIZE`) drawn with `seed` (default
`DEFAULT_SEED`, so a run sees the same prompts every time; give an evaluation set another seed);
the other options are the task's config fields (e.g. leg_counting's `max_animals`), each value read
as JSON where it parses (`4`, `true`, `[1, 2]`) and as text otherwise.

Each entry is a record with reasoning-gym's own keys, `question`, `answer` and `metadata` (the
reward `builtin:reasoning_gym` scores with the task's `score_answer`, found through
`metadata.source_dataset`), plus `prompt`: the question as a chat, after the system prompt of
reasoning-gym's own examples (`reasoning_gym.utils.SYSTEM_PROMPTS["default"]`: think, then the answer
in `<answer>` tags; option `system_prompt=NAME` picks another of that table, `system_prompt=none`
leaves it out). Train on `prompt` with `--data.input_key prompt --data.apply_chat_template`, or on the
bare `question`.

A spec's entries are generated once per process (the run's check of its prompts and their load read the
same entries; some tasks take seconds per hundred); each read gets its own copies.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
from typing import Any

from rlhfkit.errors import ConfigError

PREFIX = "reasoning_gym:"
DEFAULT_SIZE = 1000
DEFAULT_SEED = 0


def is_procedural(source: str) -> bool:
    """True for a `reasoning_gym:TASK...` spec."""
    return source.startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """(task, options) of `reasoning_gym:TASK[:KEY=VALUE]...`; options hold size, seed and system_prompt
    with their defaults filled in.

    >>> parse_spec("reasoning_gym:leg_counting:size=3:max_animals=4")
    ('leg_counting', {'size': 3, 'seed': 0, 'system_prompt': 'default', 'max_animals': 4})
    """
    task, *parts = spec[len(PREFIX):].split(":")
    if not task:
        raise ConfigError(f"{spec}: name the task, reasoning_gym:TASK (e.g. reasoning_gym:leg_counting)")
    options: dict[str, Any] = {"size": DEFAULT_SIZE, "seed": DEFAULT_SEED, "system_prompt": "default"}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise ConfigError(f"{spec}: {part!r} is not KEY=VALUE; write reasoning_gym:TASK:size=200:seed=7")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    for key in ("size", "seed"):
        if not isinstance(options[key], int) or isinstance(options[key], bool) or options[key] < 0:
            raise ConfigError(f"{spec}: {key} must be a whole number >= 0 (got {options[key]!r})")
    return task, options


def reasoning_gym_records(spec: str) -> list[dict[str, Any]]:
    """The records of a `reasoning_gym:TASK[:KEY=VALUE]...` spec (see the module docstring), copies of
    the ones generated the first time.

    Raises:
      ConfigError: reasoning-gym is not installed, the task is unknown (similar names are listed), an
        option is not one of the task's, or its config refuses a value.
    """
    return copy.deepcopy(_generate(spec))


@functools.lru_cache(maxsize=8)
def _generate(spec: str) -> list[dict[str, Any]]:
    """The records of `spec`, generated (`reasoning_gym_records`; not to be changed: they are cached)."""
    task, options = parse_spec(spec)
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS
    except ImportError as exc:
        raise ConfigError(f"{spec}: reasoning-gym is not installed: pip install 'rlhfkit[reasoning-gym]'") from exc
    if task not in DATASETS:
        close = difflib.get_close_matches(task, list(DATASETS), n=5)
        hint = f"; similar: {', '.join(close)}" if close else f" (it has {len(DATASETS)}, e.g. leg_counting)"
        raise ConfigError(f"{spec}: reasoning-gym has no task {task!r}{hint}")
    system_name = options.pop("system_prompt")
    if system_name != "none" and system_name not in SYSTEM_PROMPTS:
        raise ConfigError(f"{spec}: system_prompt {system_name!r} is not one of reasoning-gym's "
                          f"({', '.join(SYSTEM_PROMPTS)}) nor none")
    try:
        dataset = reasoning_gym.create_dataset(task, **options)
    except (TypeError, AssertionError, ValueError) as exc:  # an unknown field; a value its validate() refuses
        raise ConfigError(f"{spec}: reasoning-gym's {task} refused the options "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'invalid'})") from exc
    system = [] if system_name == "none" else [{"role": "system", "content": SYSTEM_PROMPTS[system_name]}]
    return [{"question": e["question"], "answer": e["answer"], "metadata": e["metadata"],
             "prompt": [*system, {"role": "user", "content": e["question"]}]} for e in dataset]
