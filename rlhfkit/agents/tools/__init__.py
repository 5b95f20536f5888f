"""Native tool calling: tools as Python functions, their schemas in the chat template's `tools=`,
the model's calls parsed with transformers' response parsing, results as `role: "tool"` turns.

    from rlhfkit.agents.tools import ToolSet, ToolTemplate, parse_tool_calls, tool_schema

    tools = ToolSet([multiply])                        # schemas from type hints + docstrings
    tt = ToolTemplate(tokenizer, tools.schemas)        # tt.native: the template renders tools=
    ids = tt.prompt_ids([{"role": "user", "content": "What is 123*456?"}])
    content, calls, errors = tt.parse(action_ids)      # [ToolCall(name, arguments, id)], [str]
    ids += action_ids + tt.delta(action_ids, stopped=True, new_messages=[{"role": "tool", ...}])

Public for other parts of rlhfkit (the OpenAI-compatible endpoint renders `tools` and parses
`tool_calls` with the same functions).
"""

from rlhfkit.agents.tools.parse import (
    DEFAULT_PARSER,
    TOOL_PARSERS,
    detect_parser,
    parse_tool_calls,
    response_template,
)
from rlhfkit.agents.tools.render import (
    PROMPT_OK,
    RERENDER,
    RETOKENIZED,
    ToolTemplate,
    default_tools_messages,
    default_tools_prompt,
    template_uses_tools,
)
from rlhfkit.agents.tools.schema import ToolCall, ToolSet, tool_schema

__all__ = [
    "DEFAULT_PARSER",
    "PROMPT_OK",
    "RERENDER",
    "RETOKENIZED",
    "TOOL_PARSERS",
    "ToolCall",
    "ToolSet",
    "ToolTemplate",
    "default_tools_messages",
    "default_tools_prompt",
    "detect_parser",
    "parse_tool_calls",
    "response_template",
    "template_uses_tools",
    "tool_schema",
]
