"""Tools as Python functions: their OpenAI function schemas and a name -> callable table.

A tool is a plain function, sync or `async def`, with type hints and a Google-style docstring
(one `Args:` line per parameter), as transformers' `get_json_schema` reads them:

    def multiply(a: int, b: int) -> int:
        \"\"\"Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        \"\"\"
        return a * b

    tools = ToolSet([multiply])      # tools.schemas -> [{"type": "function", "function": {...}}]
"""

from __future__ import annotations

import enum
import inspect
import json
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's name, its arguments (a dict) and the call's id."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def as_message_entry(self) -> dict:
        """The call as an OpenAI `tool_calls` entry of an assistant message (arguments as JSON text)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


def tool_schema(fn: Callable) -> dict:
    """The OpenAI function schema of `fn` ({"type": "function", "function": {name, description,
    parameters}}) from its type hints and docstring (transformers' `get_json_schema`).

    Raises:
      ConfigError: `fn` lacks a docstring, a type hint or an `Args:` line for a parameter (the
        message names the function and what to add).
    """
    from transformers.utils import get_json_schema

    if not callable(fn):
        raise ConfigError(f"a tool must be a function, got {type(fn).__name__}")
    try:
        return get_json_schema(fn)
    except Exception as exc:  # transformers' DocstringParsingException / TypeHintParsingException
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(f"tool {name}: {exc}; give it type hints and a docstring with an Args: line per "
                          "parameter (Google style)") from exc


class ToolSet:
    """The tools of an episode: name -> function (sync or async), with their schemas.

    Args:
      tools: functions, or a mapping name -> function (the name overrides the function's own).
    Raises:
      ConfigError: two tools share a name, or a function's schema cannot be built.
    """

    def __init__(self, tools: Iterable[Callable] | Mapping[str, Callable] = ()):
        items = list(tools.items()) if isinstance(tools, Mapping) else [(None, fn) for fn in tools]
        self.functions: dict[str, Callable] = {}
        self.schemas: list[dict] = []
        for name, fn in items:
            schema = tool_schema(fn)
            name = name or schema["function"]["name"]
            schema["function"]["name"] = name
            if name in self.functions:
                raise ConfigError(f"two tools are named {name!r}; give each tool a distinct name")
            self.functions[name] = fn
            self.schemas.append(schema)

    def __len__(self) -> int:
        return len(self.functions)

    def __bool__(self) -> bool:
        return bool(self.functions)

    def __contains__(self, name: object) -> bool:
        return name in self.functions

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def parameters(self, name: str) -> dict:
        """The JSON schema of the parameters of tool `name`."""
        return next(s["function"].get("parameters", {}) for s in self.schemas if s["function"]["name"] == name)

    def is_async(self, name: str) -> bool:
        return inspect.iscoroutinefunction(self.functions[name])

    def arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """`arguments` of a call of tool `name` as the function takes them: checked against its
        signature and its schema's types (a whole float for an integer becomes an int, a value of
        an Enum-typed parameter becomes the member).

        Raises:
          TypeError: an argument the signature does not take or a required one missing, a value of
            the wrong JSON type or outside the parameter's enum (the message says which).
        """
        fn = self.functions[name]
        signature = inspect.signature(fn)
        signature.bind(**arguments)
        properties = self.parameters(name).get("properties", {})
        defaults = {k: p.default for k, p in signature.parameters.items()}
        hints = _type_hints(fn)
        out = {}
        for key, value in arguments.items():
            spec = properties.get(key)
            if isinstance(spec, dict) and not (value is None and defaults.get(key) is None):
                value = _checked_value(spec, value, key)
            out[key] = _as_enum(hints.get(key), value)
        return out


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _checked_value(spec: dict, value: Any, where: str) -> Any:
    """`value` when it fits the JSON schema `spec` (its `type`, `nullable`, `enum`, `anyOf`, array
    `items`; other keywords are not checked), a whole float for "integer" as an int; else TypeError."""
    if "anyOf" in spec:
        for option in spec["anyOf"]:
            try:
                return _checked_value(option, value, where)
            except TypeError:
                continue
        raise TypeError(f"{where}: {json.dumps(value)[:60]} matches none of its allowed types")
    types = spec.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if spec.get("nullable"):
        types.append("null")
    if "integer" in types and isinstance(value, float) and value.is_integer():
        value = int(value)
    if types and not any(_JSON_TYPES.get(t, lambda v: True)(value) for t in types):
        got = "null" if value is None else type(value).__name__
        raise TypeError(f"{where} must be {' or '.join(types)}, got {got} {json.dumps(value)[:60]}")
    if "enum" in spec and value not in spec["enum"]:
        raise TypeError(f"{where} must be one of {json.dumps(spec['enum'])[:200]}, got {json.dumps(value)[:60]}")
    if isinstance(value, list) and isinstance(spec.get("items"), dict):
        value = [_checked_value(spec["items"], v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _type_hints(fn: Callable) -> dict[str, Any]:
    """`fn`'s resolved type hints ({} when one cannot be resolved: the schema was built from what resolved)."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an unresolvable hint
        return {}


def _as_enum(hint: Any, value: Any) -> Any:
    """`value` as a member of the Enum `hint` (a parameter's type hint; also inside Optional)."""
    for cls in (hint, *typing.get_args(hint)):
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and not isinstance(value, cls):
            try:
                return cls(value)
            except ValueError:
                continue
    return value
