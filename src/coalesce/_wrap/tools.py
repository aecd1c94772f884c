"""A forced single tool, read as a structured output.

A call that offers exactly one function tool and forces the model to call it (OpenAI
``tool_choice`` naming it or ``"required"``; Anthropic ``{"type": "tool", ...}`` or
``{"type": "any"}``) asks for one thing: the tool's arguments, which follow its schema.
It is coalesced as any structured output is (the schema is the item's output schema,
the packed request asks for the reply schema on any provider), and each caller gets a
tool call of its own (:mod:`coalesce._wrap.replies`). More than one tool, a tool the
model may skip, or a tool of another kind passes through untouched. Nothing here does
I/O or imports an SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ForcedTool", "anthropic_forced_tool", "openai_forced_tool"]

_OPENAI_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
_ANTHROPIC_TOOL_KEYS = frozenset(
    {"name", "description", "input_schema", "type", "strict", "cache_control"}
)
_ANTHROPIC_CHOICE_KEYS = frozenset({"type", "name", "disable_parallel_tool_use"})


@dataclass(frozen=True)
class ForcedTool:
    """The one tool a call forces: its arguments are the call's answer.

    Attributes:
        name: The tool's name.
        schema: JSON schema of its arguments (the answer's output schema).
        description: What the tool is for, if the call says.
    """

    name: str
    schema: Mapping[str, Any]
    description: str | None = None

    def instruction(self) -> str:
        """The sentence the shared instructions get: what each answer is."""
        about = f" ({self.description.strip()})" if self.description else ""
        return (
            f"Each item's output is the arguments of one call to the tool {self.name!r}{about},"
            " following the output schema."
        )


def openai_forced_tool(
    tools: Any, choice: Any, parallel: Any = None
) -> ForcedTool | Literal[False] | None:
    """The forced tool of an OpenAI chat call (``tools``, ``tool_choice``,
    ``parallel_tool_calls``); ``None`` when none of them is given; ``False`` otherwise.

    Args:
        tools: ``tools=``: one ``{"type": "function", "function": {...}}``.
        choice: ``tool_choice=``: ``"required"``, or the function named.
        parallel: ``parallel_tool_calls=``: a bool or ``None``.
    """
    if tools is None and choice is None and parallel is None:
        return None
    if not isinstance(tools, list) or len(tools) != 1:
        return False
    if not isinstance(parallel, (bool, type(None))):
        return False
    tool = tools[0]
    if not isinstance(tool, Mapping) or set(tool) != {"type", "function"}:
        return False
    function = tool["function"]
    if tool["type"] != "function" or not isinstance(function, Mapping):
        return False
    found = _tool(function, "parameters", _OPENAI_FUNCTION_KEYS)
    return found if found and _openai_forces(choice, found.name) else False


def _openai_forces(choice: Any, name: str) -> bool:
    if choice == "required":
        return True
    return (
        isinstance(choice, Mapping)
        and set(choice) == {"type", "function"}
        and choice["type"] == "function"
        and choice["function"] == {"name": name}
    )


def anthropic_forced_tool(tools: Any, choice: Any) -> ForcedTool | Literal[False] | None:
    """The forced tool of an Anthropic call (``tools``, ``tool_choice``); ``None`` when
    neither is given; ``False`` otherwise.

    Args:
        tools: ``tools=``: one custom tool (``name``, ``input_schema``).
        choice: ``tool_choice=``: ``{"type": "tool", "name": ...}`` or ``{"type": "any"}``.
    """
    if tools is None and choice is None:
        return None
    if not isinstance(tools, list) or len(tools) != 1 or not isinstance(tools[0], Mapping):
        return False
    tool = tools[0]
    if tool.get("type", "custom") != "custom":
        return False
    found = _tool(tool, "input_schema", _ANTHROPIC_TOOL_KEYS)
    return found if found and _anthropic_forces(choice, found.name) else False


def _anthropic_forces(choice: Any, name: str) -> bool:
    if not isinstance(choice, Mapping) or set(choice) - _ANTHROPIC_CHOICE_KEYS:
        return False
    if choice.get("type") == "any":
        return "name" not in choice
    return choice.get("type") == "tool" and choice.get("name") == name


def _tool(spec: Mapping[str, Any], schema_key: str, keys: frozenset[str]) -> ForcedTool | None:
    """The tool ``spec`` describes, or ``None`` when it holds more than ``keys`` or
    lacks a name or a schema."""
    name, schema, description = spec.get("name"), spec.get(schema_key), spec.get("description")
    if set(spec) - keys or not isinstance(name, str) or not name:
        return None
    if not isinstance(schema, Mapping) or not isinstance(description, (str, type(None))):
        return None
    return ForcedTool(name, schema, description)
