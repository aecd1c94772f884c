"""The wire format as the simulated model reads it: a packed request and its reply.

The shared instructions come first (system message or system prompt); the items
travel in the last user message as a JSON array of ``{"id": ..., "input": ...}``.
The reply is keyed by id, ``{"results": {"1": <output>, ...}}`` (format 2), unless the
request asks for format 1, ``{"results": [{"id": ..., "output": ...}, ...]}``: with a
reply schema whose ``results`` is an array, or, without a schema, with instructions
that show that shape. Each output's schema is the value of any property of
``results`` (or its ``additionalProperties``) in format 2, and
``properties.results.items.properties.output`` in format 1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PackedItem", "item_output_schema", "keyed_reply", "parse_packed"]


@dataclass(frozen=True)
class PackedItem:
    """One item of a packed request."""

    id: str
    input: Any


def _as_items(value: Any) -> list[PackedItem] | None:
    if not isinstance(value, list) or not value:
        return None
    items = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"id", "input"}:
            return None
        if not isinstance(entry["id"], str):
            return None
        items.append(PackedItem(entry["id"], entry["input"]))
    return items


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_packed(parts: Sequence[str]) -> list[PackedItem] | None:
    """Return the items of a packed request, or ``None`` if it is not one: the whole text
    of the last user message's ``parts`` is tried first, then each part, then the span
    from its first ``[`` to its last ``]``."""
    whole = "".join(parts)
    candidates = [whole, *parts]
    if "[" in whole:
        candidates.append(whole[whole.index("[") : whole.rindex("]") + 1])
    for text in candidates:
        items = _as_items(_parse(text.strip()))
        if items is not None:
            return items
    return None


def _resolve(node: Any, root: Mapping[str, Any]) -> Any:
    for _ in range(32):
        if not isinstance(node, Mapping) or not isinstance(node.get("$ref"), str):
            return node
        target: Any = root
        for part in node["$ref"].removeprefix("#").strip("/").split("/"):
            target = target.get(part) if isinstance(target, Mapping) and part else target
        node = target
    return node


_OUTPUT_POINTER = "#/properties/results/items/properties/output"


def _rebase(node: Any) -> Any:
    """Rewrite ``$ref`` into the output's own place so they resolve from the output."""
    if isinstance(node, Mapping):
        copy = {key: _rebase(value) for key, value in node.items()}
        ref = copy.get("$ref")
        if isinstance(ref, str) and (
            ref == _OUTPUT_POINTER or ref.startswith(_OUTPUT_POINTER + "/")
        ):
            copy["$ref"] = "#" + ref[len(_OUTPUT_POINTER) :]
        return copy
    if isinstance(node, list):
        return [_rebase(value) for value in node]
    return node


def _results_schema(root: Mapping[str, Any]) -> Mapping[str, Any] | None:
    props = _resolve(root, root)
    props = props.get("properties") if isinstance(props, Mapping) else None
    results = _resolve(props.get("results"), root) if isinstance(props, Mapping) else None
    return results if isinstance(results, Mapping) else None


def keyed_reply(schema: Mapping[str, Any] | None, texts: Sequence[str]) -> bool:
    """Whether to answer a packed request in format 2 (keyed by id) rather than 1: as the
    reply ``schema`` says, else as the prompt's ``texts`` do."""
    if schema is not None:
        results = _results_schema(schema)
        return results is None or results.get("type") != "array"
    return not any('"results": [{' in text for text in texts)


def item_output_schema(root: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the per-item output schema of a results-object schema, self-contained.

    The root's ``$defs`` (and ``definitions``) are copied into the returned schema,
    and (format 1) references to the output's own place are rebased to ``#``, so every
    ``$ref`` still resolves (see the wire format's hoisting rule).

    Args:
        root: The schema of the whole reply.

    Returns:
        The output schema, or ``None`` if ``root`` is not a results-object schema.
    """
    results = _results_schema(root)
    if results is None:
        return None
    output: Any
    if results.get("type") == "array":
        entry = _resolve(results.get("items"), root)
        entry_props = entry.get("properties") if isinstance(entry, Mapping) else None
        if not isinstance(entry_props, Mapping) or "output" not in entry_props:
            return None
        output = _rebase(entry_props["output"])
    else:
        keyed = results.get("properties")
        if isinstance(keyed, Mapping) and keyed:
            output = next(iter(keyed.values()))
        elif isinstance(results.get("additionalProperties"), Mapping):
            output = results["additionalProperties"]
        else:
            return None
    schema: dict[str, Any] = dict(output) if isinstance(output, Mapping) else {}
    for defs in ("$defs", "definitions"):
        if isinstance(root.get(defs), Mapping):
            schema[defs] = {**root[defs], **schema.get(defs, {})}
    return schema
