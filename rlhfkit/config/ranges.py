"""The allowed range of every numeric setting, written as the error message says it.

Each config module keeps a table {dotted flag: spec} beside its `validate` function, and
`check_ranges(cfg, table)` refuses the first value outside its range with a one-line ConfigError
naming the flag (`--actor.adam.eps must be > 0 (got 0.0)`). A spec is one of

    ">= 0"  "> 0"  "<= 1"  "< 1"      one bound
    "[0, 1)"  "(0, 1]"  "[0, 1]"        an interval (brackets include the end, parentheses exclude it)
    "-1 or >= 1"                        alternatives (a bare number allows that one value, e.g. an "off")
    "low < high"                        a pair of finite numbers in increasing order

A tuple field's spec applies to each of its values; a tuple of specs applies position by position.
None passes (the type decides whether a field may be none), NaN and +-inf never do. A test walks
every numeric field of every config class and checks that the table has it, so a new numeric field
cannot go without a range.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping
from typing import Any, NamedTuple

from rlhfkit.config.parse import field_table
from rlhfkit.errors import ConfigError

Spec = str | tuple[str, ...]
_BOUND = re.compile(r"^(>=|>|<=|<)\s*(-?[\d.e+-]+)$")
_INTERVAL = re.compile(r"^([\[(])\s*(-?[\d.e+-]+)\s*,\s*(-?[\d.e+-]+)\s*([\])])$")
ORDERED = "low < high"


class _Test(NamedTuple):
    """One alternative of a spec: `low <(=) v <(=) high`, either bound optional."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __call__(self, v: float) -> bool:
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below


def _parse_one(text: str) -> _Test:
    text = text.strip()
    m = _BOUND.match(text)
    if m:
        op, x = m.group(1), float(m.group(2))
        if op[0] == ">":
            return _Test(low=x, low_open=op == ">")
        return _Test(high=x, high_open=op == "<")
    m = _INTERVAL.match(text)
    if m:
        return _Test(float(m.group(2)), float(m.group(3)), m.group(1) == "(", m.group(4) == ")")
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"bad range spec {text!r}") from None
    return _Test(x, x)


def parse_spec(spec: str) -> tuple[_Test, ...]:
    """The alternatives of `spec` ("-1 or >= 1" -> two tests); ValueError on a malformed spec."""
    return tuple(_parse_one(part) for part in spec.split(" or "))


def describe(spec: str) -> str:
    """How a message says `spec`: intervals read "in [0, 1)", the rest as written."""
    return " or ".join(f"in {p.strip()}" if p.strip()[0] in "[(" else p.strip() for p in spec.split(" or "))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def allows(spec: str, value: float) -> bool:
    """True when `value` is a finite number inside `spec`."""
    return _finite(value) and any(test(value) for test in parse_spec(spec))


def _show(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def check_value(name: str, value: Any, spec: Spec, optional: bool = False) -> None:
    """ConfigError naming `--name` when `value` (a number, a tuple of numbers, or None) is outside
    `spec`; `optional`: the message adds that none is allowed too."""
    if value is None:
        return
    if spec == ORDERED:
        ok = len(value) == 2 and all(map(_finite, value)) and value[0] < value[1]
        if not ok:
            raise ConfigError(f"--{name} must be two finite numbers LOW HIGH with LOW < HIGH (got {_show(value)})")
        return
    if isinstance(value, tuple):
        specs = spec if isinstance(spec, tuple) else (spec,) * len(value)
        for i, (v, s) in enumerate(zip(value, specs, strict=True)):
            if not allows(s, v):
                which = f"value {i + 1}" if isinstance(spec, tuple) else "each value"
                raise ConfigError(f"--{name}: {which} must be {describe(s)} (got {_show(value)})")
        return
    if not allows(spec, value):
        finite = "" if _finite(value) else "a finite number "
        raise ConfigError(f"--{name} must be {finite}{describe(spec)}{' or none' if optional else ''} "
                          f"(got {_show(value)})")


def leaf(cfg: Any, name: str) -> Any:
    """The value of dotted field `name` of a nested config."""
    for part in name.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_ranges(cfg: Any, table: Mapping[str, Spec]) -> None:
    """Refuse the first field of `cfg` outside its range in `table` (dotted flag -> spec)."""
    types = field_table(type(cfg))
    for name, spec in table.items():
        check_value(name, leaf(cfg, name), spec, optional=type(None) in typing.get_args(types[name]))


def validate_table(table: Mapping[str, Spec]) -> Mapping[str, Spec]:
    """`table`, after checking that every spec parses (a typo fails at import, not at a user's run)."""
    for name, spec in table.items():
        for s in spec if isinstance(spec, tuple) else (spec,):
            if s != ORDERED:
                parse_spec(s)
    return table
