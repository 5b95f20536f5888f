"""Nested frozen dataclasses <-> YAML files and dotted command-line flags.

`parse_config(cls, argv)` builds a config in three layers: the dataclass defaults, then the
YAML file named by `--config FILE` (nested mappings or dotted keys), then the flags
(`--section.field value`, `--section.field=value`, a bare `--flag` for booleans). Every value
is converted to the field's annotated type; an unknown flag is a ConfigError that suggests the
nearest valid one. This module imports nothing from rlhfkit but `errors`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlhfkit.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def field_table(cls: type, prefix: str = "") -> dict[str, Any]:
    """Map every dotted leaf name of dataclass `cls` to its annotated type."""
    table: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            table.update(field_table(tp, name + "."))
        else:
            table[name] = tp
    return table


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def convert(name: str, value: Any, tp: Any) -> Any:
    """Convert `value` (a string from the command line or a YAML scalar/list) to type `tp`."""
    base, optional = _strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"--{name}: a value is required (got none)")
    origin = typing.get_origin(base)
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            s = str(value).lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if isinstance(value, (list, dict)):
                raise ValueError
            return str(value)
        if origin is tuple:
            items = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
            args = typing.get_args(base)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(convert(name, v, args[0]) for v in items)
            if len(items) != len(args):
                raise ValueError
            return tuple(convert(name, v, a) for v, a in zip(items, args))
        if typing.get_origin(base) is typing.Literal:
            if value not in typing.get_args(base):
                raise ConfigError(f"--{name}: {value!r} is not one of {list(typing.get_args(base))}")
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"--{name}: expected {_type_name(tp)}, got {value!r}") from None
    return value


def _type_name(tp: Any) -> str:
    base, optional = _strip_optional(tp)
    name = getattr(base, "__name__", str(base))
    if typing.get_origin(base) is tuple:
        name = "a tuple of " + " ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(base))
    return name + (" or none" if optional else "")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _suggest(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if not close:  # try matching the last component, e.g. --lr -> actor.adam.lr
        tail = [v for v in valid if v.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]]
        close = tail[:1]
    return f"; did you mean --{close[0]}?" if close else ""


def split_argv(argv: list[str], table: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """Parse `--name value` / `--name=value` / bare boolean flags into {dotted name: raw value}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}: flags look like --section.name VALUE")
        name, eq, val = tok[2:].partition("=")
        name = aliases.get(name, name)
        if name not in table:
            raise ConfigError(f"unknown flag --{name}{_suggest(name, sorted(table))}")
        base, _ = _strip_optional(table[name])
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            is_value = nxt is not None and not (nxt.startswith("--") and not _is_number(nxt))
            if base is bool and not is_value:
                val = "true"
            elif typing.get_origin(base) is tuple and typing.get_args(base)[-1] is not Ellipsis:
                n = len(typing.get_args(base))
                vals = argv[i + 1 : i + 1 + n]
                if len(vals) < n or any(v.startswith("--") and not _is_number(v) for v in vals):
                    raise ConfigError(f"--{name}: expected {n} values")
                val, i = " ".join(vals), i + n
            elif not is_value:
                raise ConfigError(f"--{name}: a value is required")
            else:
                val, i = nxt, i + 1
        out[name] = val
        i += 1
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Construct dataclass `cls` from flat dotted `values` (missing keys keep their defaults)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = build(tp, values, name + ".")
        elif name in values:
            kwargs[f.name] = convert(name, values[name], tp)
    return cls(**kwargs)


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping of sections")
    return _flatten(data)


def parse_config(cls: type, argv: list[str], aliases: dict[str, str] | None = None) -> Any:
    """Defaults < `--config FILE` < flags. Returns an instance of `cls` (not yet validated)."""
    aliases = aliases or {}
    table = field_table(cls)
    argv = list(argv)
    values: dict[str, Any] = {}
    if "--config" in argv or any(a.startswith("--config=") for a in argv):
        idx = next(i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config="))
        if argv[idx] == "--config":
            if idx + 1 >= len(argv):
                raise ConfigError("--config: a YAML file path is required")
            path = argv.pop(idx + 1)
        else:
            path = argv[idx].split("=", 1)[1]
        argv.pop(idx)
        for key, v in load_yaml(path).items():
            key = aliases.get(key, key)
            if key not in table:
                raise ConfigError(f"{path}: unknown key {key!r}{_suggest(key, sorted(table))}")
            values[key] = v
    values.update(split_argv(argv, table, aliases))
    return build(cls, values)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict of a config (for writing config.yaml into a run folder)."""
    return dataclasses.asdict(cfg)
