"""Schema surgery: the JSON schema of a packed reply, built from one output's schema.

The output schema moves into the reply schema's ``$defs`` with every local ``$ref``
rewritten to keep pointing at the same place, and titles that only repeat a name are
left out (:func:`untitled_schema`): they constrain nothing and are paid as prompt
tokens on every request. Provider-specific dressing (OpenAI's strict mode, Anthropic's
tool) lives in :mod:`coalesce.providers`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from .._exceptions import ConfigurationError
from .outcomes import check_ids

__all__ = ["build_reply_schema", "untitled_schema"]

# The name under which the output schema sits in the reply schema's $defs, unless the
# output schema itself uses it (then a suffix is added).
_OUTPUT_DEF = "Output"


def _move_ref(ref: str, pointer: str) -> str:
    if ref in ("#", "#/"):
        return pointer
    if ref.startswith("#/$defs/"):
        return ref
    if ref.startswith("#/definitions/"):
        return "#/$defs/" + ref[len("#/definitions/") :]
    if ref.startswith("#/"):
        return pointer + ref[1:]
    return ref  # not a local reference: nothing to move


def _rewrite_refs(node: Any, pointer: str) -> Any:
    if isinstance(node, dict):
        return {
            key: _move_ref(value, pointer)
            if key == "$ref" and isinstance(value, str)
            else _rewrite_refs(value, pointer)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(value, pointer) for value in node]
    return node


def _hoist(output_schema: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The output schema's definitions and the output schema itself, as one ``$defs``
    map (refs rewritten to point at the same places), and the output's name in it."""
    body = copy.deepcopy(dict(output_schema))
    body.pop("$schema", None)
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        for name, sub in (body.pop(key, None) or {}).items():
            if name in defs:
                raise ConfigurationError(
                    f"the output schema defines {name!r} in both $defs and definitions"
                )
            defs[name] = sub
    name, n = _OUTPUT_DEF, 1
    while name in defs:
        name, n = f"{_OUTPUT_DEF}{n}", n + 1
    defs = {key: _untitled(sub, key) for key, sub in defs.items()}
    defs[name] = _untitled(body, None)
    pointer = f"#/$defs/{name}"
    return name, {key: _rewrite_refs(sub, pointer) for key, sub in defs.items()}


def untitled_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` (and of its ``$defs``) without the titles that only repeat a
    field's name or a definition's key; see :func:`build_reply_schema`."""
    copied = copy.deepcopy(dict(schema))
    copied.pop("$schema", None)
    for key in ("$defs", "definitions"):
        if isinstance(copied.get(key), dict):
            copied[key] = {name: _untitled(sub, name) for name, sub in copied[key].items()}
    untitled: dict[str, Any] = _untitled(copied, None)
    return untitled


# Keywords whose value is one subschema, and those whose value is a list of them.
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_SUBSCHEMAS = ("anyOf", "allOf", "oneOf", "prefixItems")


def _untitled(node: Any, name: str | None) -> Any:
    """``node`` without the titles that only repeat a name the schema already gives.

    Pydantic titles every field after its name (``max_items``: ``"Max Items"``) and
    every model after its class, which is also its ``$defs`` key. A title is an
    annotation: it constrains nothing, and each one is paid as prompt tokens on every
    request. Titles that say something else (``Field(title=...)``) are kept.
    """
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str) and name is not None and _same(value, name):
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {field: _untitled(sub, field) for field, sub in value.items()}
        elif key in _SUBSCHEMA:
            out[key] = _untitled(value, None)
        elif key in _SUBSCHEMAS and isinstance(value, list):
            out[key] = [_untitled(sub, None) for sub in value]
        else:
            out[key] = value
    return out


def _same(title: str, name: str) -> bool:
    def squash(text: str) -> str:
        return "".join(c for c in text if c.isalnum()).casefold()

    return squash(title) == squash(name)


def build_reply_schema(
    output_schema: Mapping[str, Any],
    ids: Sequence[str] | None = None,
    *,
    pin: bool = True,
    keyed: bool = True,
) -> dict[str, Any]:
    """The JSON schema of a packed reply, ``{"results": {"1": <output>, ...}}``.

    The output schema goes into the root's ``$defs`` (as ``Output``, or ``Output1``...
    if the output schema already defines that name), beside its own ``$defs`` (and
    ``definitions``); every local ``$ref`` is rewritten to keep pointing at the same
    place, and each result refers to the output by ``$ref``. Titles that only repeat a
    field's name or a definition's key (pydantic's defaults) are left out: they
    constrain nothing and would be paid on every request.

    Args:
        output_schema: JSON schema of one item's output (e.g. ``TypeAdapter(Out).json_schema()``).
        ids: The request's ids; required when ``pin`` is true.
        pin: Name every id as a required property of ``results``, in request order, and
            allow no other (``additionalProperties: false``), so a constrained decoder
            writes each id exactly once. This is the form OpenAI's strict mode accepts.
            The schema then differs between group sizes, which costs prompt-cache hits
            where the provider caches the schema with the prompt. Unpinned,
            ``results`` is a map from any id to an output: the same schema for every
            request, but not accepted by OpenAI's strict mode (use ``strict=False``).
        keyed: Format 2 (outputs keyed by id). When false, format 1:
            ``{"results": [{"id": ..., "output": ...}, ...]}``, pinned with
            ``"id": {"enum": ids}`` and ``minItems = maxItems = len(ids)``. Format 1
            costs about 5 more output tokens per item, but a repeated id survives a
            provider that parses the reply before handing it over (Anthropic's tool
            input, when not streamed), where a repeated key would silently keep one value.

    Raises:
        ConfigurationError: ``pin`` without ids, or clashing definition names.
    """
    name, defs = _hoist(output_schema)
    output = {"$ref": f"#/$defs/{name}"}
    if pin and not ids:
        raise ConfigurationError("build_reply_schema(pin=True) needs the request's ids")
    pinned = check_ids(ids) if pin and ids else ()
    results: dict[str, Any]
    if not keyed:
        id_schema: dict[str, Any] = {"type": "string"}
        results = {"type": "array"}
        if pin:
            id_schema["enum"] = list(pinned)
            results["minItems"] = results["maxItems"] = len(pinned)
        results["items"] = _object({"id": id_schema, "output": output})
    elif pin:
        results = _object({item_id: dict(output) for item_id in pinned})
    else:
        results = {"type": "object", "additionalProperties": output}
    schema = _object({"results": results})
    schema["$defs"] = defs
    return schema


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
