"""A group of one, asked as a plain call: the request and the reply (pure)."""

from __future__ import annotations

import json
from typing import Any, Literal

import pydantic
import pytest

from coalesce._exceptions import ConfigurationError
from coalesce._wire.outcomes import FailureKind, failure_error
from coalesce._wire.plain import (
    PLAIN_ID,
    plain_request,
    split_plain,
    text_output,
    wrapped_output,
)


class Verdict(pydantic.BaseModel):
    label: Literal["good", "bad"]
    score: int = pydantic.Field(ge=0, le=10, title="Score out of ten")


@pytest.mark.parametrize(
    ("schema", "wrapped"),
    [
        (Verdict.model_json_schema(), False),
        ({"type": "object", "properties": {"x": {"type": "integer"}}}, False),
        ({"properties": {"x": {"type": "integer"}}}, False),
        ({"type": "string"}, False),  # text: the reply is the output
        ({"type": "string", "maxLength": 5}, True),
        ({"enum": ["a", "b"]}, True),
        ({"type": "array", "items": {"type": "integer"}}, True),
        ({"$ref": "#/$defs/A", "$defs": {"A": {"type": "object"}}}, True),
        ({"anyOf": [{"type": "object"}, {"type": "null"}]}, True),
    ],
)
def test_outputs_that_are_not_objects_or_text_are_asked_wrapped(
    schema: dict[str, Any], wrapped: bool
) -> None:
    assert wrapped_output(schema) is wrapped


def test_a_scalar_output_is_asked_as_an_answer_object_and_unwrapped() -> None:
    schema = pydantic.TypeAdapter(Literal["good", "bad"]).json_schema()
    request = plain_request("Judge the review.", "it is fine", schema)
    assert request.reply_schema == {
        "type": "object",
        "properties": {"answer": {"enum": ["good", "bad"], "type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    validate = pydantic.TypeAdapter(Literal["good", "bad"]).validate_python
    split = split_plain('{"answer": "bad"}', validate, wrapped=True)
    assert split.values == {PLAIN_ID: "bad"}
    split = split_plain('{"answer": "meh"}', validate, wrapped=True)
    assert split.failures[PLAIN_ID].kind is FailureKind.INVALID


def test_a_wrapped_output_keeps_its_definitions_at_the_root() -> None:
    schema = pydantic.TypeAdapter(list[Verdict]).json_schema()
    request = plain_request("Judge.", "x", schema)
    assert set(request.reply_schema) == {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "$defs",
    }
    assert request.reply_schema["properties"]["answer"]["items"] == {"$ref": "#/$defs/Verdict"}


def test_plain_request_is_what_a_plain_call_sends() -> None:
    schema = Verdict.model_json_schema()
    request = plain_request("Judge the review.  \n", 'it is "fine"', schema)
    assert request.system == "Judge the review."
    assert request.user == 'it is "fine"'  # a string as it is, not JSON-quoted
    assert request.ids == (PLAIN_ID,)
    fields = request.reply_schema["properties"]
    assert "title" not in fields["label"]  # "Label" only repeats the name
    assert fields["score"]["title"] == "Score out of ten"
    assert schema["properties"]["label"]["title"] == "Label"  # the input is untouched
    assert plain_request("x", {"b": [1, "é"]}, schema).user == '{"b":[1,"é"]}'
    assert plain_request("x", Verdict(label="good", score=3), schema).user == (
        '{"label":"good","score":3}'
    )
    with pytest.raises(ConfigurationError, match="JSON"):
        plain_request("x", {"n": float("nan")}, schema)


def test_plain_request_describes_the_schema_when_the_provider_does_not_enforce_it() -> None:
    request = plain_request("Judge.", "x", Verdict.model_json_schema(), structured=False)
    first, described = request.system.split("\n\n")
    assert first == "Judge."
    assert "one JSON object and nothing else" in described
    schema_text = described[described.index("{") :]
    assert json.loads(schema_text) == request.reply_schema


def validate(raw: Any) -> Verdict:
    return Verdict.model_validate(raw)


@pytest.mark.parametrize(
    "text",
    [
        '{"label": "good", "score": 7}',
        '  {"label":"good","score":7}\n',
        'Sure! {"label": "good", "score": 7} Hope it helps {',
        '```json\n{"label": "good", "score": 7}\n```',
        'A {brace} first, then {"label": "good", "score": 7}',
    ],
)
def test_split_plain_finds_the_object(text: str) -> None:
    split = split_plain(text, validate)
    assert split.values == {PLAIN_ID: Verdict(label="good", score=7)}
    assert split.ok


@pytest.mark.parametrize(
    ("text", "truncated", "kind"),
    [
        ('{"label": "good", "score": 70}', False, FailureKind.INVALID),
        ("I cannot judge this.", False, FailureKind.INVALID),
        ("", False, FailureKind.MISSING),
        ('{"label": "good", "sco', True, FailureKind.TRUNCATED),
        ("", True, FailureKind.TRUNCATED),
    ],
)
def test_split_plain_failures(text: str, truncated: bool, kind: FailureKind) -> None:
    split = split_plain(text, validate, truncated=truncated)
    assert not split.values
    assert split.failures[PLAIN_ID].kind is kind
    assert split.truncated is truncated
    if kind is FailureKind.INVALID and text.startswith("{"):
        assert split.failures[PLAIN_ID].raw == {"label": "good", "score": 70}


def test_split_plain_keeps_the_reply_for_the_callers_error() -> None:
    prose = "I cannot judge this, " * 20
    failure = split_plain(prose, validate).failures[PLAIN_ID]
    assert (failure.kind, failure.raw, failure.reply) == (FailureKind.INVALID, prose, prose)
    message = str(failure_error(PLAIN_ID, failure, attempts=2))
    assert message == f"the reply was not JSON (the reply began: {prose[:200]!r}...);" + (
        " gave up after 2 attempts"
    )
    cut = split_plain('{"label": "go', validate, truncated=True).failures[PLAIN_ID]
    assert cut.reply == '{"label": "go'
    # An invalid output shows the validation error, not the reply.
    invalid = split_plain('{"label": "good", "score": 70}', validate).failures[PLAIN_ID]
    assert invalid.reply is None
    assert str(failure_error(PLAIN_ID, invalid)).startswith(
        "the reply's output for this call failed validation: 1 validation error"
    )


def test_a_text_output_is_asked_for_and_read_as_text() -> None:
    schema = {"type": "string"}
    assert text_output(schema)
    for structured in (True, False):
        request = plain_request("Summarise.", "a long mail", schema, structured=structured)
        assert request.system == "Summarise."  # no JSON format asked for
        assert request.reply_schema == {}
    ok = split_plain('Sure: {"not": "json"} is fine', str, as_text=True)
    assert ok.values == {PLAIN_ID: 'Sure: {"not": "json"} is fine'}
    cut = split_plain("Half a sent", str, truncated=True, as_text=True)
    assert cut.failures[PLAIN_ID].kind is FailureKind.TRUNCATED
    assert split_plain("", str, as_text=True).failures[PLAIN_ID].kind is FailureKind.MISSING
