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

import inspect
import json
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
