"""What an OpenAI request asks the answer to be, besides a ``json_schema`` format.

A forced function tool (Chat Completions ``tools`` with ``tool_choice`` ``"required"``
or naming one, and the same in the Responses API) makes the answer the tool's
arguments, shaped by its ``parameters``. A ``json_object`` request has no schema of its
own: the model answers the schema its instructions spell out, if they hold one
(instructor's JSON mode, coalesce's own unstructured prompts). Pure: tested by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._http import HttpError
from ._model import bare_schema
from ._wire import parse_packed

__all__ = ["ForcedTool", "any_object", "described_schema", "forced_function"]

#: Keys only a JSON schema has at its root (an object with one is taken for a schema).
_SCHEMA_KEYS = frozenset({"properties", "$defs", "definitions", "anyOf", "oneOf", "allOf", "$ref"})
_SCHEMA_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})


@dataclass(frozen=True)
class ForcedTool:
    """The function a request forces the model to call.

    Attributes:
        name: The function's name.
        schema: Its ``parameters``, the schema of the arguments (``None``: any).
    """

    name: str
    schema: Mapping[str, Any] | None


def _function(tool: Any, nested: bool) -> Mapping[str, Any] | None:
    """The function definition of one entry of ``tools``, or ``None`` (not a function)."""
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        return None
    spec = tool.get("function") if nested else tool
    return spec if isinstance(spec, Mapping) and isinstance(spec.get("name"), str) else None


def _chosen_name(choice: Any, nested: bool) -> str | None:
    if not isinstance(choice, Mapping) or choice.get("type") != "function":
        return None
    spec = choice.get("function") if nested else choice
    name = spec.get("name") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else None


def forced_function(body: Mapping[str, Any], *, nested: bool) -> ForcedTool | None:
    """Return the function tool the request forces, or ``None`` (the model answers text).

    ``tool_choice`` ``"required"`` forces the first function tool (a deterministic
    model always picks the same), ``{"type": "function", ...}`` the one it names;
    ``"auto"``, ``"none"`` or no ``tool_choice`` force nothing.

    Args:
        body: The request body.
        nested: Chat Completions' shape (``{"type": "function", "function": {...}}``);
            false for the Responses API's flat ``{"type": "function", "name": ...}``.

    Raises:
        HttpError: ``tool_choice`` names a function that is not in ``tools``, or is
            ``"required"`` with no function tool.
    """
    tools = body.get("tools")
    choice = body.get("tool_choice")
    functions = [f for f in (_function(t, nested) for t in _list(tools)) if f is not None]
    name = _chosen_name(choice, nested)
    if name is not None:
        matches = [f for f in functions if f["name"] == name]
        if not matches:
            raise HttpError(
                400, f"tool_choice names the function {name!r}, which is not in 'tools'"
            )
        return _forced(matches[0])
    if choice == "required":
        if not functions:
            raise HttpError(400, "tool_choice 'required' needs at least one function in 'tools'")
        return _forced(functions[0])
    return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _forced(spec: Mapping[str, Any]) -> ForcedTool:
    schema = spec.get("parameters")
    return ForcedTool(str(spec["name"]), schema if isinstance(schema, Mapping) else None)


def _looks_like_schema(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    return bool(_SCHEMA_KEYS & value.keys()) or value.get("type") in _SCHEMA_TYPES


def any_object(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` allows any JSON object and says nothing more (``{"type":
    "object"}``, annotations aside, directly or through a ``$ref`` into its ``$defs``):
    it leaves the answer's shape to the instructions."""
    rest = bare_schema(schema)
    if rest is None:
        return False
    if rest.get("additionalProperties") is True:
        del rest["additionalProperties"]
    return rest == {"type": "object"}


def _schemas_in(text: str) -> list[dict[str, Any]]:
    """The JSON objects in ``text`` that are JSON schemas (outermost first)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            value, end = None, start + 1
        if _looks_like_schema(value):
            found.append(dict(value))
            start = text.find("{", end)
        else:
            start = text.find("{", start + 1)
    return found


def described_schema(texts: Sequence[str], user_parts: Sequence[str]) -> dict[str, Any] | None:
    """Return the JSON schema the prompt's text spells out for the answer, if any.

    The texts are read in order (instructions first); the items of a packed request
    (in the last user message's ``user_parts``) are data, never read for a schema. A
    schema that allows any object (:func:`any_object`, such as a packed frame's
    ``{"type": "object"}`` output) is returned only when there is no other.
    """
    skipped = set(user_parts) if parse_packed(user_parts) is not None else set()
    found = [schema for text in texts if text not in skipped for schema in _schemas_in(text)]
    shaping = [schema for schema in found if not any_object(schema)]
    first = shaping or found
    return first[0] if first else None
