"""Which output schemas may hold free text (pure)."""

from __future__ import annotations

import datetime
from typing import Any, Literal

import pydantic
import pytest

from coalesce._planning.longest import has_free_text


class Tag(pydantic.BaseModel):
    category: Literal["billing", "bug"]
    urgent: bool
    score: int
    due: datetime.date


class Summary(pydantic.BaseModel):
    category: Literal["billing", "bug"]
    summary: str


class Nested(pydantic.BaseModel):
    tags: list[Tag]
    note: str | None = None


@pytest.mark.parametrize(
    ("output", "free"),
    [
        (Literal["positive", "negative"], False),
        (bool, False),
        (int, False),
        (float, False),
        (datetime.date, False),
        (Tag, False),
        (list[Tag], False),
        (str, True),
        (Summary, True),
        (Nested, True),
        (dict[str, int], False),
        (dict[str, str], True),
        (Any, True),
    ],
)
def test_free_text_is_a_string_without_enum_or_format(output: Any, free: bool) -> None:
    assert has_free_text(pydantic.TypeAdapter(output).json_schema()) is free


@pytest.mark.parametrize(
    ("schema", "free"),
    [
        ({"type": ["string", "null"]}, True),
        ({"type": ["integer", "null"]}, False),
        ({"type": "object", "properties": ["not", "a", "mapping"]}, False),
        ({"anyOf": {"type": "string"}}, True),  # a malformed union: nothing said
        ({"$ref": "#/$defs/Missing"}, True),
        ({"$ref": "#/$defs/Tag", "$defs": []}, True),
        ({"type": 7}, True),
        ({"type": "string", "format": "date"}, False),
    ],
)
def test_any_schema_a_user_may_send_is_read_without_error(
    schema: dict[str, Any], free: bool
) -> None:
    # wrap's schemas come from the caller's response_format: whatever its shape, the
    # answer is a bool; what it cannot read counts as free text (nothing learned).
    assert has_free_text(schema) is free
