"""The deterministic model: every answer is a pure function of the item's input.

An item's answer is derived from the SHA-256 of its input's canonical JSON, salted
with the position inside the answer, so two callers with different inputs get
different answers and a test can recompute the answer to any item with
:func:`expected_output`. A JSON schema, when given, shapes the answer: every branch
choice, number and string is drawn from that hash, never from a random generator.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

__all__ = ["bare_schema", "canonical_json", "expected_output", "fraction", "free_text"]

# Common words that are one token each in the OpenAI encodings; they pad string
# fields so an answer reaches its target length.
_WORDS = (
    "the", "time", "river", "stone", "light", "water", "green", "house",
    "paper", "night", "field", "cloud", "north", "south", "metal", "glass",
    "bread", "music", "table", "chair", "apple", "story", "plant", "train",
    "road", "wind", "fire", "snow", "sand", "rain", "wood", "gold",
)  # fmt: skip
_MAX_DEPTH = 8
_DEFAULT_SPAN = 1000


def canonical_json(value: Any) -> str:
    """Return ``value`` as canonical JSON: sorted keys, no spaces, UTF-8 kept.

    Args:
        value: Any JSON-able value; anything else is written as its ``str()``.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _digest(key: str, path: str) -> bytes:
    return hashlib.sha256(f"{key}\x00{path}".encode()).digest()


def fraction(key: str, path: str = "") -> float:
    """Return a number in ``[0, 1)`` that depends only on ``key`` and ``path``.

    Args:
        key: Usually the hex digest of an item's input.
        path: Where in the answer the number is used.
    """
    return int.from_bytes(_digest(key, path)[:8], "big") / 2.0**64


def _input_key(item_input: Any) -> str:
    return hashlib.sha256(canonical_json(item_input).encode()).hexdigest()


def expected_output(
    item_input: Any,
    schema: Mapping[str, Any] | None = None,
    *,
    output_tokens: int | None = None,
    avoid: Collection[str] = (),
) -> Any:
    """Return the answer the simulated model gives to ``item_input``.

    Without a schema, or with one that asks for any string, the answer is a short
    string derived from the input (``"out-"`` and 12 hex digits). With a JSON schema the answer is an instance of it, drawn
    deterministically: enums, consts, numbers within bounds, array lengths within
    ``minItems``/``maxItems``, ``$ref`` into ``$defs`` and ``anyOf``/``oneOf``.

    Args:
        item_input: The item, any JSON-able value.
        schema: JSON schema of the answer, self-contained (its ``$ref`` point into
            its own ``$defs``), e.g. ``MyModel.model_json_schema()``.
        output_tokens: Target length; the first free string of the answer is padded
            with deterministic words until the answer is about this many tokens long.
        avoid: Words the padding does not use (where others are left): a wrong
            answer's text shares none with the right one's.
    """
    key = _input_key(item_input)
    vocabulary = [word for word in _WORDS if word not in avoid] or _WORDS
    if schema is None or free_text(schema):
        # Free text is the same answer whether asked for as text or as a JSON string.
        text = f"out-{key[:12]}"
        return _pad(text, key, output_tokens, text, vocabulary)
    generator = _Generator(schema, key)
    value = generator.value(schema, "", 0)
    if output_tokens is not None and generator.free_strings:
        value = _pad_at(value, generator.free_strings[0], key, output_tokens, vocabulary)
    return value


def free_text(schema: Mapping[str, Any]) -> bool:
    """A schema that asks for any string: ``{"type": "string"}``, annotations aside,
    directly or through a ``$ref`` into its ``$defs``."""
    return bare_schema(schema) == {"type": "string"}


def bare_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``schema`` says, annotations aside, directly or through a ``$ref`` into its
    own ``$defs`` (a packed item's); ``None`` when that is not a schema object."""
    node: Any = schema
    for _ in range(8):
        ref = node.get("$ref") if isinstance(node, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            break
        node = schema.get("$defs", {}).get(ref[len("#/$defs/") :])
    if not isinstance(node, Mapping):
        return None
    return {k: v for k, v in node.items() if k not in _ANNOTATIONS}


#: Keys that describe a schema without constraining it.
_ANNOTATIONS = frozenset({"$defs", "definitions", "$schema", "title", "description"})


def _estimate_tokens(value: Any) -> int:
    # Model-independent on purpose: the answer must not depend on the tokenizer.
    return math.ceil(len(canonical_json(value)) / 4)


def _pad(
    text: str, key: str, target: int | None, whole: Any, vocabulary: Sequence[str] = _WORDS
) -> str:
    if target is None:
        return text
    missing = target - _estimate_tokens(whole)
    n = len(vocabulary)
    words = [vocabulary[_digest(key, f"pad/{i}")[0] % n] for i in range(max(0, missing))]
    return " ".join([text, *words]) if words else text


def _pad_at(
    value: Any, path: tuple[str | int, ...], key: str, target: int, vocabulary: Sequence[str]
) -> Any:
    if not path:
        return _pad(str(value), key, target, value, vocabulary)
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    inner = copy[head]
    if not rest:
        missing = target - _estimate_tokens(value) + _estimate_tokens(inner)
        copy[head] = _pad(str(inner), key, missing, inner, vocabulary)
    else:
        extra = target - _estimate_tokens(value) + _estimate_tokens(inner)
        copy[head] = _pad_at(inner, rest, key, extra, vocabulary)
    return copy


class _Generator:
    """Draws one instance of a schema from an item's key; remembers free strings."""

    def __init__(self, root: Mapping[str, Any], key: str) -> None:
        self.root = root
        self.key = key
        self.free_strings: list[tuple[str | int, ...]] = []
        self._location: tuple[str | int, ...] = ()

    def value(self, schema: Any, path: str, depth: int) -> Any:
        if depth > 3 * _MAX_DEPTH:  # a schema that requires itself: stop somewhere
            return None
        if not isinstance(schema, Mapping):
            return self._string({}, path)
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._pick(schema["enum"], path)
        for combinator in ("anyOf", "oneOf"):
            if isinstance(schema.get(combinator), list) and schema[combinator]:
                return self.value(self._branch(schema[combinator], path, depth), path, depth + 1)
        if isinstance(schema.get("allOf"), list):
            return self.value(self._merge(schema), path, depth + 1)
        return self._typed(schema, self._type(schema, path), path, depth)

    def _typed(self, schema: Mapping[str, Any], kind: str, path: str, depth: int) -> Any:
        if kind == "object":
            return self._object(schema, path, depth)
        if kind == "array":
            return self._array(schema, path, depth)
        if kind == "integer":
            return self._integer(schema, path)
        if kind == "number":
            return self._number(schema, path)
        if kind == "boolean":
            return fraction(self.key, path) < 0.5
        if kind == "null":
            return None
        return self._string(schema, path)

    def _resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        seen: set[str] = set()
        while isinstance(schema.get("$ref"), str) and schema["$ref"] not in seen:
            ref = schema["$ref"]
            seen.add(ref)
            target = self._pointer(ref)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest}
        return schema

    def _pointer(self, ref: str) -> Mapping[str, Any]:
        node: Any = self.root
        for part in ref.removeprefix("#").strip("/").split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        return node if isinstance(node, Mapping) else {}

    def _merge(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, Mapping):
                resolved = self._resolve(part)
                props = {**merged.get("properties", {}), **resolved.get("properties", {})}
                merged = {**merged, **resolved}
                if props:
                    merged["properties"] = props
        return merged

    def _pick(self, options: Sequence[Any], path: str) -> Any:
        return options[int(fraction(self.key, path + "#pick") * len(options))]

    def _branch(self, options: Sequence[Any], path: str, depth: int) -> Any:
        if depth >= _MAX_DEPTH:
            # Recursive schemas end on the branch that does not recurse.
            plain = [o for o in options if isinstance(o, Mapping) and "$ref" not in o]
            options = plain or options
        return self._pick(options, path + "#branch")

    def _type(self, schema: Mapping[str, Any], path: str) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            concrete = [k for k in kind if k != "null"] or kind
            kind = self._pick(concrete, path + "#type") if concrete else None
        if isinstance(kind, str):
            return kind
        if "properties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return "string"

    def _object(self, schema: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            return {}
        required = schema.get("required")
        names = list(props)
        if depth >= _MAX_DEPTH and isinstance(required, list):
            names = [n for n in names if n in required]
        result: dict[str, Any] = {}
        outer = self._location
        for name in names:
            self._location = (*outer, name)
            result[name] = self.value(props[name], f"{path}/{name}", depth + 1)
        self._location = outer
        return result

    def _array(self, schema: Mapping[str, Any], path: str, depth: int) -> list[Any]:
        given = schema.get("prefixItems")
        prefix: list[Any] = given if isinstance(given, list) else []
        low = max(int(schema.get("minItems", 0)), len(prefix))
        high = int(schema.get("maxItems", low + 3))
        high = max(low, high)
        count = (
            low
            if depth >= _MAX_DEPTH
            else low + int(fraction(self.key, path + "#len") * (high - low + 1))
        )
        outer = self._location
        items: list[Any] = []
        for index in range(count):
            self._location = (*outer, index)
            item_schema = prefix[index] if index < len(prefix) else schema.get("items", {})
            items.append(self.value(item_schema, f"{path}/{index}", depth + 1))
        self._location = outer
        return items

    def _bounds(self, schema: Mapping[str, Any], step: float) -> tuple[float, float]:
        low = schema.get("minimum")
        high = schema.get("maximum")
        if isinstance(schema.get("exclusiveMinimum"), (int, float)):
            low = schema["exclusiveMinimum"] + step
        if isinstance(schema.get("exclusiveMaximum"), (int, float)):
            high = schema["exclusiveMaximum"] - step
        if low is None:
            low = 0 if high is None or high >= 0 else high - _DEFAULT_SPAN
        if high is None:
            high = low + _DEFAULT_SPAN
        return float(low), float(max(low, high))

    def _integer(self, schema: Mapping[str, Any], path: str) -> int:
        low, high = self._bounds(schema, 1)
        low_i, high_i = math.ceil(low), math.floor(high)
        if high_i < low_i:
            return low_i
        return low_i + int(fraction(self.key, path) * (high_i - low_i + 1))

    def _number(self, schema: Mapping[str, Any], path: str) -> float:
        low, high = self._bounds(schema, 1e-6)
        exact = low + fraction(self.key, path) * (high - low)
        rounded = round(exact, 3)
        return rounded if low <= rounded <= high else exact

    def _string(self, schema: Mapping[str, Any], path: str) -> str:
        digest = hashlib.sha256(f"{self.key}\x00{path}".encode()).hexdigest()
        fmt = schema.get("format")
        if fmt in _FORMATS:
            return _FORMATS[fmt](digest)
        text = f"out-{digest[:12]}"
        min_length = int(schema.get("minLength", 0))
        if len(text) < min_length:
            text = (text + digest * (min_length // 64 + 1))[:min_length]
        if "maxLength" in schema:
            return text[: int(schema["maxLength"])]
        if "pattern" not in schema:
            self.free_strings.append(self._location)
        return text


def _uuid(digest: str) -> str:
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-a{digest[17:20]}-{digest[20:32]}"


def _date(digest: str) -> str:
    day = int(digest[:6], 16) % 10000
    year, rest = 2000 + day // 365 % 30, day % 365
    return f"{year:04d}-{rest // 28 % 12 + 1:02d}-{rest % 28 + 1:02d}"


_FORMATS: dict[str, Callable[[str], str]] = {
    "uuid": _uuid,
    "date": _date,
    "date-time": lambda d: f"{_date(d)}T{int(d[6:8], 16) % 24:02d}:{int(d[8:10], 16) % 60:02d}:00Z",
    "email": lambda d: f"user-{d[:8]}@example.com",
    "uri": lambda d: f"https://example.com/{d[:12]}",
}
