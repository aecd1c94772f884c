"""The longest answer a schema allows, in tokens: a safe size before any reply.

An output type with finitely many short instances (a classification's label, a flag,
a small record of enums) bounds every answer; free text does not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .tokens import TokenEstimator

__all__ = ["bounded_output_tokens", "has_free_text"]


def bounded_output_tokens(schema: Mapping[str, Any], estimator: TokenEstimator) -> int | None:
    """Return the tokens of the longest output ``schema`` allows, or ``None`` if unbounded.

    An output made only of enums, constants, booleans and nulls (in objects, fixed
    tuples, arrays with ``maxItems`` and unions, ``$ref`` into ``$defs`` resolved) has a
    longest instance: a classification's answer, for example. Its tokens, as compact
    JSON, are a safe expected size before any reply was measured. Numbers count at a
    typical width (their bounds' when both are given), and dates, times and UUIDs at
    theirs; free strings have no bound.

    Args:
        schema: A JSON schema (as pydantic writes it).
        estimator: Counts the tokens.
    """
    longest = _longest_instance(schema, schema, depth=0)
    if longest is _UNBOUNDED:
        return None
    return estimator.count(json.dumps(longest, ensure_ascii=False, separators=(",", ":")))


def has_free_text(schema: Mapping[str, Any]) -> bool:
    """Whether an answer of ``schema`` may hold free text: a string with no ``enum``,
    ``const`` or known ``format``, or a part whose type is not said (any JSON),
    anywhere in it. Two right answers of free text rarely match word for word.

    Args:
        schema: A JSON schema (as pydantic writes it).
    """
    return _free(schema, schema, depth=0)


def _free(node: Any, root: Mapping[str, Any], *, depth: int) -> bool:
    if isinstance(node, bool) or not isinstance(node, Mapping) or depth > 32:
        return node is not False  # True or {}: anything; a recursive schema: assume so
    if "const" in node or "enum" in node:
        return False
    if "$ref" in node:
        ref, defs = node["$ref"], root.get("$defs")
        if not (isinstance(ref, str) and ref.startswith("#/$defs/") and isinstance(defs, Mapping)):
            return True
        return _free(defs.get(ref.removeprefix("#/$defs/")), root, depth=depth + 1)
    parts = [n for union in ("anyOf", "oneOf", "allOf") for n in _listed(node.get(union))]
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else _listed(kinds)
    if not parts and not kinds:
        return True
    if "string" in kinds and node.get("format") not in _FORMATTED:
        return True
    properties = node.get("properties")
    if isinstance(properties, Mapping):
        parts += properties.values()
    parts += [
        node[key] for key in ("items", "additionalProperties") if isinstance(node.get(key), Mapping)
    ]
    parts += _listed(node.get("prefixItems"))
    return any(_free(part, root, depth=depth + 1) for part in parts)


def _listed(value: Any) -> list[Any]:
    """``value`` if it is a list (a schema's ``anyOf``, ``type`` or ``prefixItems``)."""
    return list(value) if isinstance(value, list) else []


_UNBOUNDED: Any = object()
# A number without bounds is rarely long in an answer (a score, a count, a year): an
# instance of this size stands in for it; the sizes measured from replies replace it.
_TYPICAL_INTEGER = -1_000_000
_TYPICAL_NUMBER = -1_000.125
_FORMATTED = {
    "date": "2026-11-30",
    "date-time": "2026-11-30T23:59:59.999999Z",
    "time": "23:59:59.999999",
    "uuid": "00000000-0000-0000-0000-000000000000",
}


def _typical_number(node: Mapping[str, Any], *, integer: bool) -> float:
    """The widest of a number's bounds, or a typical width when it has none."""
    bounds = [node.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
    known = [b for b in bounds if isinstance(b, (int, float)) and not isinstance(b, bool)]
    if len(known) >= 2:
        return max(known, key=lambda b: len(json.dumps(b)))
    return _TYPICAL_INTEGER if integer else _TYPICAL_NUMBER


def _longest_instance(node: Any, root: Mapping[str, Any], *, depth: int) -> Any:
    """The instance of ``node`` with the longest compact JSON, or ``_UNBOUNDED``."""
    if not isinstance(node, Mapping) or depth > 32:  # a recursive schema is unbounded
        return _UNBOUNDED
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            return _UNBOUNDED
        target = root.get("$defs", {}).get(ref.removeprefix("#/$defs/"))
        return _longest_instance(target, root, depth=depth + 1)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return _longest(list(node["enum"]))
    for union in ("anyOf", "oneOf"):
        if union in node:
            options = [_longest_instance(n, root, depth=depth + 1) for n in node[union]]
            return _UNBOUNDED if _UNBOUNDED in options else _longest(options)
    return _longest_of_type(node, root, depth=depth)


def _longest_of_type(node: Mapping[str, Any], root: Mapping[str, Any], *, depth: int) -> Any:
    """:func:`_longest_instance` of a node that only gives a ``type``."""
    kind = node.get("type")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind in ("integer", "number"):
        return _typical_number(node, integer=kind == "integer")
    if kind == "string" and node.get("format") in _FORMATTED:
        return _FORMATTED[node["format"]]
    if kind == "object" and isinstance(node.get("properties"), Mapping):
        return _longest_object(node, root, depth=depth)
    if kind == "array":
        return _longest_array(node, root, depth=depth)
    return _UNBOUNDED


def _longest_object(node: Mapping[str, Any], root: Mapping[str, Any], *, depth: int) -> Any:
    if node.get("additionalProperties", False) is not False:
        return _UNBOUNDED
    value: dict[str, Any] = {}
    for name, sub in node["properties"].items():
        value[name] = _longest_instance(sub, root, depth=depth + 1)
        if value[name] is _UNBOUNDED:
            return _UNBOUNDED
    return value


def _longest_array(node: Mapping[str, Any], root: Mapping[str, Any], *, depth: int) -> Any:
    prefix = node.get("prefixItems")
    if isinstance(prefix, list) and node.get("items", False) is False:
        values = [_longest_instance(n, root, depth=depth + 1) for n in prefix]
        return _UNBOUNDED if _UNBOUNDED in values else values
    most = node.get("maxItems")
    if isinstance(most, int) and most <= 64:
        one = _longest_instance(node.get("items"), root, depth=depth + 1)
        return _UNBOUNDED if one is _UNBOUNDED else [one] * most
    return _UNBOUNDED


def _longest(values: list[Any]) -> Any:
    if not values:
        return _UNBOUNDED
    return max(values, key=lambda v: len(json.dumps(v, ensure_ascii=False)))
