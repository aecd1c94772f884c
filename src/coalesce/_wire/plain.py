"""A group of one, asked as a plain call (``docs/protocol.md``).

A packed request pays for its format (about a sixth more prompt tokens than the item
asked on its own), which a group of one gains nothing from. So it is sent as the
application would send it: the instructions as the system message (with the output
schema when the provider does not enforce one), the item as the user message (a
string as it is, else compact JSON), and the output schema itself as the reply schema,
wrapped as ``{"answer": <output>}`` when its root is not an object. The reply is
validated like a packed one, with the same failure kinds, so re-asks work the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .outcomes import FailureKind, ItemFailure, Occurrence, Split, judge
from .packing import PackedRequest, pack_value
from .schema import untitled_schema

__all__ = [
    "ANSWER_KEY",
    "PLAIN_ID",
    "plain_request",
    "split_plain",
    "text_output",
    "wrapped_output",
]

T = TypeVar("T")

PLAIN_ID = "1"
"""The id a plain call's only item goes by in outcomes and statistics."""


def text_output(output_schema: Mapping[str, Any]) -> bool:
    """Whether the output is plain text (``str``): a plain call's reply is the output."""
    return dict(output_schema) == {"type": "string"}


#: The key a scalar output is wrapped in when the provider takes only an object root.
ANSWER_KEY = "answer"


def wrapped_output(output_schema: Mapping[str, Any]) -> bool:
    """Whether a plain call asks for this output wrapped in ``{"answer": ...}``: it is
    neither text nor an object (a ``Literal``, a number, a list...), and OpenAI's
    structured outputs and Anthropic's tool inputs take only an object as the root."""
    return not text_output(output_schema) and not _object_root(output_schema)


def _object_root(output_schema: Mapping[str, Any]) -> bool:
    kind = output_schema.get("type")
    return (kind == "object" or (kind is None and "properties" in output_schema)) and not any(
        key in output_schema for key in ("$ref", "anyOf", "oneOf", "allOf")
    )


def _plain_schema(output_schema: Mapping[str, Any]) -> dict[str, Any]:
    schema = untitled_schema(output_schema)
    if not wrapped_output(output_schema):
        return schema
    defs = schema.pop("$defs", None)  # references into them stay valid from the root
    wrapper: dict[str, Any] = {
        "type": "object",
        "properties": {ANSWER_KEY: schema},
        "required": [ANSWER_KEY],
        "additionalProperties": False,
    }
    if defs is not None:
        wrapper["$defs"] = defs
    return wrapper


def plain_request(
    instructions: str, item: Any, output_schema: Mapping[str, Any], *, structured: bool = True
) -> PackedRequest:
    """One item asked on its own (see the module doc).

    Args:
        instructions: The shared task instructions.
        item: The item: a string is sent as it is, anything else as compact JSON.
        output_schema: JSON schema of the output: text, an object, or anything else
            (asked for wrapped in ``{"answer": ...}``, see :func:`wrapped_output`).
        structured: The provider enforces the reply schema; when false, the schema is
            spelled out in the system message instead.

    Returns:
        The request; its ``reply_schema`` is empty for a text output (ask for text).

    Raises:
        ConfigurationError: The item is not JSON-able.
    """
    text = text_output(output_schema)
    schema = {} if text else _plain_schema(output_schema)
    system = instructions.rstrip()
    if not structured and not text:
        described = json.dumps(schema, ensure_ascii=False, sort_keys=True)
        system += (
            "\n\nReply with one JSON object and nothing else (no prose, no code fence),"
            f" valid against this JSON schema: {described}"
        )
    user = item if isinstance(item, str) else pack_value(item)
    return PackedRequest(system, user, (PLAIN_ID,), schema)


def split_plain(
    text: str,
    validate: Callable[[Any], T],
    *,
    truncated: bool = False,
    as_text: bool = False,
    wrapped: bool = False,
) -> Split[T]:
    """The outcome of a plain call's reply: its one value, or why there is none.

    The reply is the output's JSON; prose or a code fence around it are skipped (the
    first ``{`` that starts a complete JSON value is taken). A text output is the reply
    itself, unless it was cut off.

    Args:
        text: The reply text (for a tool call, ``json.dumps`` of its input).
        validate: Converts the raw output to the caller's type; any exception it raises
            marks the output invalid.
        truncated: The provider said the reply was cut off.
        as_text: The output is text (:func:`text_output`).
        wrapped: The output was asked for as ``{"answer": ...}`` (:func:`wrapped_output`).
    """
    found, raw = (bool(text) and not truncated, text) if as_text else _json_object(text)
    if found and wrapped:
        found, raw = _unwrap(raw)
    failure: ItemFailure | None = None
    if not found:
        if truncated:
            failure = ItemFailure(FailureKind.TRUNCATED, None, "the reply was cut off", text)
        elif not text.strip():
            failure = ItemFailure(FailureKind.MISSING, None, "the reply was empty")
        else:
            failure = ItemFailure(FailureKind.INVALID, text, "the reply was not JSON", text)
    else:
        ok, outcome = judge(Occurrence(PLAIN_ID, raw, True, ""), validate)
        if ok:
            return Split((PLAIN_ID,), {PLAIN_ID: outcome}, {}, (), truncated)
        failure = outcome
    return Split((PLAIN_ID,), {}, {PLAIN_ID: failure}, (), truncated)


def _unwrap(raw: Any) -> tuple[bool, Any]:
    if isinstance(raw, dict) and ANSWER_KEY in raw:
        return True, raw[ANSWER_KEY]
    return True, raw  # the bare output, or something validation will refuse


def _json_object(text: str) -> tuple[bool, Any]:
    stripped = text.strip()
    try:
        return True, json.loads(stripped, strict=False)
    except ValueError:
        pass
    decoder = json.JSONDecoder(strict=False)
    start = stripped.find("{")
    while start != -1:
        try:
            return True, decoder.raw_decode(stripped, start)[0]
        except ValueError:
            start = stripped.find("{", start + 1)
    return False, None
