"""How each provider is asked for a packed reply: its request shapes.

The wire (:mod:`coalesce._wire.schema`) builds one provider-neutral reply schema; this
module dresses it the way each API wants it: OpenAI's ``response_format`` (with the
schema adapted to strict structured outputs) and Anthropic's forced tool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import ConfigurationError

__all__ = ["anthropic_tool", "openai_response_format", "strict_openai_schema"]


def openai_response_format(
    reply_schema: Mapping[str, Any], *, name: str = "coalesce_results", strict: bool = True
) -> dict[str, Any]:
    """The ``response_format`` argument of an OpenAI chat completion.

    Args:
        reply_schema: From :func:`~coalesce._wire.schema.build_reply_schema`.
        name: Schema name (letters, digits, ``_`` and ``-``, at most 64).
        strict: Ask for strict decoding; the schema goes through :func:`strict_openai_schema`.
    """
    schema = strict_openai_schema(reply_schema) if strict else dict(reply_schema)
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "strict": strict, "schema": schema},
    }


def anthropic_tool(
    reply_schema: Mapping[str, Any], *, name: str = "coalesce_results"
) -> dict[str, Any]:
    """An Anthropic tool whose input is the reply; force it with ``tool_choice``.

    Anthropic caches tools before the system prompt, so a pinned (per-size) schema here
    costs cache hits; an unpinned one (``pin=False``) keeps one tool for every request.

    Args:
        reply_schema: From :func:`~coalesce._wire.schema.build_reply_schema`.
        name: Tool name.
    """
    return {
        "name": name,
        "description": "Record the output for every item, one result per item id.",
        "input_schema": dict(reply_schema),
    }


def strict_openai_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` adapted to OpenAI's strict structured outputs.

    Every object gets ``additionalProperties: false`` (unless it sets its own) and all
    its properties required; ``default: null`` is dropped; a ``$ref`` with sibling keys
    is inlined. What strict mode cannot express is left as is and OpenAI rejects it (use
    ``strict=False`` then): free-form maps (``additionalProperties`` with a schema,
    e.g. ``dict[str, int]``), ``{}`` (any value), and ``oneOf``. Fields with defaults
    become required, so the model always writes them; validation still applies the
    output type's own rules.

    Args:
        schema: A JSON schema with ``$defs`` (if any) at its root.
    """
    strict: dict[str, Any] = _strict(dict(schema), schema)
    return strict


def _strict(node: Any, root: Mapping[str, Any]) -> Any:
    """``node`` made strict: a new dict for each schema object (the schema given is
    left as it is; its other values are shared)."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for key in ("$defs", "definitions"):
        if isinstance(node.get(key), dict):
            node[key] = {name: _strict(sub, root) for name, sub in node[key].items()}
    kinds = node.get("type")
    is_object = kinds == "object" or (isinstance(kinds, list) and "object" in kinds)
    if (is_object or "properties" in node) and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if isinstance(node.get("properties"), dict):
        node["required"] = list(node["properties"])
        node["properties"] = {k: _strict(v, root) for k, v in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        node["items"] = _strict(node["items"], root)
    for key in ("anyOf", "allOf"):
        if isinstance(node.get(key), list):
            node[key] = [_strict(sub, root) for sub in node[key]]
    if "default" in node and node["default"] is None:
        del node["default"]
    if isinstance(node.get("$ref"), str) and len(node) > 1:
        target = _resolve(root, node.pop("$ref"))
        return _strict({**target, **node}, root)
    return node


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/") if ref != "#" else []:
        node = node.get(part.replace("~1", "/").replace("~0", "~"))
    if not isinstance(node, Mapping):
        raise ConfigurationError(f"$ref {ref!r} does not resolve to a schema object")
    return node
