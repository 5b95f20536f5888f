"""Nested frozen dataclasses <-> YAML files and dotted command-line flags.

`parse_config(cls, argv)` builds a config in three layers: the dataclass defaults, then the
YAML file named by `--config FILE` (nested mappings or dotted keys), then the flags
(`--section.field value`, `--section.field=value`, a bare `--flag` for booleans). Every value
is converted to the field's annotated type; an unknown flag is a ConfigError that suggests the
nearest valid one. This module imports nothing from rlhfkit but `errors`.

The flags of another tool are read through an alias table `{name: str | Alias}`: a string is
another name of one of our flags; an `Alias` says how the other tool's flag is `mapped` onto
ours, or that it is `noticed` (accepted, its values consumed, a one-line warning on the
"rlhfkit" logger saying what rlhfkit does instead) or `refused` (a one-line ConfigError naming
what to use). OpenRLHF's table is config/openrlhf.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rlhfkit.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
KINDS = ("mapped", "noticed", "refused")
log = logging.getLogger("rlhfkit")

Converter = Callable[[list[str], Mapping[str, list]], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Alias:
    """Another tool's flag and what rlhfkit does with it.

    kind: "mapped" (its values set our flag `to`, or the flags `convert` returns), "noticed"
    (accepted, its values consumed, `note` logged as a warning; `convert` may still set flags) or
    "refused" (ConfigError `--NAME: note`, unless every value is one of `harmless`, the values
    that change nothing).
    nargs: the values it takes, as the other tool declares it: 0 (a switch, which may be followed
    by true/false), N, (LOW, HIGH) or "*" (any number).
    convert(values, given) -> {our dotted name: raw value}, when a value needs converting (`to` then
    only names the flag for the docs); `given` maps every flag on the command line (as typed,
    without --) to its values, for flags whose meaning depends on another one.
    weak: what it sets applies only where no other flag sets the same field.
    """

    kind: str
    nargs: int | tuple[int, int] | str = 1
    to: str | None = None
    convert: Converter | None = None
    note: str = ""
    harmless: tuple[str, ...] = ()
    weak: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Alias kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "mapped" and not (self.to or self.convert):
            raise ValueError("a mapped Alias needs `to` or `convert`")
        if self.kind != "mapped" and (not self.note or self.to):
            raise ValueError(f"a {self.kind} Alias needs a note and no `to`")
        if "\n" in self.note:
            raise ValueError(f"an Alias note is one line: {self.note!r}")


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
            if isinstance(value, str) and not value.strip().lstrip("+-").isdigit():
                f = float(value)  # 1e8, 4096.0 (another tool's float-typed flag)
                if not f.is_integer():
                    raise ValueError
                return int(f)
            return int(value)
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


Rule = str | Alias | None  # None: one of our own flags


def split_argv(argv: list[str], table: dict[str, Any], aliases: Mapping[str, str | Alias]) -> dict[str, Any]:
    """Parse `--name value` / `--name=value` / bare boolean flags into {dotted name: raw value}."""
    return apply_flags(read_flags(argv, table, aliases), table)


def read_flags(argv: list[str], table: dict[str, Any], aliases: Mapping[str, str | Alias],
               positional: list[str] | None = None) -> list[tuple[str, Rule, list]]:
    """[(name as given, its rule, its values)] in command-line order; an unknown flag is an error. A token that
    is neither a flag nor a flag's value is appended to `positional` when given (another tool's `key=value`
    overrides), else an error."""
    items: list[tuple[str, Rule, list]] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            if positional is None:
                raise ConfigError(f"unexpected argument {tok!r}: flags look like --section.name VALUE")
            positional.append(tok)
            i += 1
            continue
        name, eq, val = tok[2:].partition("=")
        rule = aliases.get(name)
        if isinstance(rule, Alias):
            vals, i = _take(argv, i, name, rule.nargs, [val] if eq else [])
            items.append((name, rule, vals))
            continue
        target = rule or name
        if target not in table:
            raise ConfigError(f"unknown flag --{name}{_suggest(name, sorted(table))}")
        if not eq:
            val, i = _typed_value(argv, i, target, table[target])
        items.append((name, rule, [val]))
        i += 1
    return items


def _typed_value(argv: list[str], i: int, name: str, tp: Any) -> tuple[str, int]:
    """The value of our flag argv[i] (the next token; none for a bare boolean; N for an N-tuple)."""
    base, _ = _strip_optional(tp)
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    is_value = nxt is not None and not _is_flag(nxt)
    if base is bool and not is_value:
        return "true", i
    if typing.get_origin(base) is tuple and typing.get_args(base)[-1] is not Ellipsis:
        n = len(typing.get_args(base))
        vals = argv[i + 1 : i + 1 + n]
        if len(vals) < n or any(_is_flag(v) for v in vals):
            raise ConfigError(f"--{name}: expected {n} values")
        return " ".join(vals), i + n
    if not is_value:
        raise ConfigError(f"--{name}: a value is required")
    return nxt, i + 1


def _take(argv: list[str], i: int, name: str, nargs: int | tuple[int, int] | str,
          vals: list[str]) -> tuple[list[str], int]:
    """Consume the values of another tool's flag argv[i] (`vals`: one given as --name=value);
    returns them and the index of the next flag."""
    i += 1
    if nargs == 0:  # a switch; an explicit true/false may follow
        if not vals and i < len(argv) and not _is_flag(argv[i]):
            vals, i = [argv[i]], i + 1
        return vals, i
    low, high = (nargs, nargs) if isinstance(nargs, int) else (0, len(argv)) if nargs == "*" else nargs
    while len(vals) < high and i < len(argv) and not _is_flag(argv[i]):
        vals, i = vals + [argv[i]], i + 1
    if len(vals) < low:
        if low == 1:
            raise ConfigError(f"--{name}: a value is required")
        raise ConfigError(f"--{name}: expected {low if low == high else f'{low} to {high}'} values")
    return vals, i


def apply_flags(items: list[tuple[str, Rule, list]], table: dict[str, Any], dashes: str = "--") -> dict[str, Any]:
    """{our dotted name: raw value} from read_flags' items: later flags win; a `weak` alias's
    values only fill fields that no other flag sets. `dashes` begins each name in messages (none for
    another tool's `key=value` overrides)."""
    given = {name: vals for name, _, vals in items}
    strong: dict[str, Any] = {}
    weak: dict[str, Any] = {}
    for name, rule, vals in items:
        if not isinstance(rule, Alias):
            strong[rule or name] = vals[0]
            continue
        out = resolve_alias(name, rule, vals, given, dashes)
        for target in out:
            if target not in table:
                raise ConfigError(f"{dashes}{name} maps to --{target}, which this command does not have")
        (weak if rule.weak else strong).update(out)
    return {**weak, **strong}


def resolve_alias(name: str, rule: Alias, vals: list, given: Mapping[str, list],
                  dashes: str = "--") -> dict[str, Any]:
    """What another tool's flag `--name vals` sets in rlhfkit (logs a notice, raises if refused)."""
    ours, name = name, dashes + name
    if rule.nargs == 0:
        if rule.kind == "mapped" and rule.to and not rule.convert:
            return {rule.to: vals[0] if vals else "true"}  # our boolean flag converts and checks it
        switch = str(vals[0]).lower() if vals else "true"
        if switch not in _TRUE | _FALSE:
            raise ConfigError(f"{name}: expected true or false, got {vals[0]!r}")
        if switch in _FALSE:  # a switch turned off does nothing, whatever its kind, but our own flag goes off
            return {ours: "false"} if rule.kind == "mapped" and ours == rule.to else {}
        vals = []
    if rule.kind == "refused":
        if vals and all(str(v) in rule.harmless for v in vals):
            return {}
        raise ConfigError(f"{name}: {rule.note}")
    if rule.kind == "noticed":
        log.warning("%s: %s", name, rule.note)
    if rule.convert is not None:
        try:
            return rule.convert([str(v) for v in vals], given)
        except ConfigError as e:  # another tool's `key=value` override: its converter's message after the key
            if dashes or str(e).startswith(name):
                raise
            raise ConfigError(f"{name}: {e}") from None
        except (ValueError, TypeError, IndexError):
            raise ConfigError(f"{name}: cannot read {' '.join(map(str, vals))!r} (or a flag it depends "
                              "on) as a number") from None
    if rule.to is None:
        return {}
    return {rule.to: ",".join(map(str, vals)) if rule.nargs == "*" else " ".join(map(str, vals))}


def _is_flag(tok: str) -> bool:
    return tok.startswith("--") and not _is_number(tok)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def build(cls: type, values: dict[str, Any], prefix: str = "", base: Any = None) -> Any:
    """Construct dataclass `cls` from flat dotted `values`; missing keys keep their defaults, those of
    `base` when given (a section's defaults are its field's default, e.g. `AdamConfig(lr=9e-6)`)."""
    hints = typing.get_type_hints(cls)
    base = cls() if base is None else base
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = build(tp, values, name + ".", getattr(base, f.name))
        elif name in values:
            kwargs[f.name] = convert(name, values[name], tp)
    return dataclasses.replace(base, **kwargs)


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


Positional = Callable[[list[str], dict[str, Any], dict[str, Any]], dict[str, Any]]


def parse_config(cls: type, argv: list[str], aliases: Mapping[str, str | Alias] | None = None,
                 positional: Positional | None = None) -> Any:
    """Defaults < `--config FILE` < `positional(tokens, table, flag values)` (another tool's `key=value`
    overrides, when given) < flags. Returns an instance of `cls` (not yet validated)."""
    aliases = aliases or {}
    table = field_table(cls)
    argv = list(argv)
    items: list[tuple[str, Rule, list]] = []
    if "--config" in argv or any(a.startswith("--config=") for a in argv):
        idx = next(i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config="))
        if argv[idx] == "--config":
            if idx + 1 >= len(argv):
                raise ConfigError("--config: a YAML file path is required")
            path = argv.pop(idx + 1)
        else:
            path = argv[idx].split("=", 1)[1]
        argv.pop(idx)
        items = _yaml_items(path, table, aliases)
    tokens: list[str] | None = [] if positional else None
    flags = read_flags(argv, table, aliases, tokens)
    if not (positional and tokens):
        return build(cls, apply_flags(items + flags, table))
    ours = apply_flags(flags, table)
    return build(cls, {**apply_flags(items, table), **positional(tokens, table, ours), **ours})


def _yaml_items(path: str, table: dict[str, Any], aliases: Mapping[str, str | Alias]) -> list:
    """The keys of a YAML config file as read_flags' items (aliases allowed, as on the command line)."""
    items: list[tuple[str, Rule, list]] = []
    for key, v in load_yaml(path).items():
        rule = aliases.get(key)
        if isinstance(rule, Alias):
            vals = list(v) if isinstance(v, (list, tuple)) else [] if v is True else [v]
            items.append((key, rule, ["false"] if v is False else vals))
            continue
        if (rule or key) not in table:
            raise ConfigError(f"{path}: unknown key {key!r}{_suggest(key, sorted(table))}")
        items.append((key, rule, [v]))
    return items


def to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict of a config (for writing config.yaml into a run folder)."""
    return dataclasses.asdict(cfg)
