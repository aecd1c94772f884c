"""The simulator's deterministic model and its pure helpers, without any event loop."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, TypeAdapter

from coalesce._exceptions import ConfigurationError
from coalesce.testing import LongTail, expected_output, item_output_schema
from coalesce.testing._length import target_tokens
from coalesce.testing._model import canonical_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


class Address(BaseModel):
    city: str
    zip_code: str = Field(min_length=5, max_length=5)


class Review(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float = Field(ge=0, le=1)
    stars: int = Field(gt=0, le=5)
    flagged: bool
    tags: list[str] = Field(min_length=1, max_length=3)
    address: Address
    note: str | None = None
    kind: Literal["review"] = "review"


class Tree(BaseModel):
    name: str
    children: list[Tree] = Field(default_factory=list)


@given(json_values)
def test_without_schema_the_answer_is_a_short_string_of_the_input(item: Any) -> None:
    answer = expected_output(item)
    assert isinstance(answer, str)
    assert answer.startswith("out-")
    assert len(answer) == 16
    assert expected_output(json.loads(json.dumps(item))) == answer


def test_different_inputs_give_different_answers() -> None:
    answers = {expected_output({"n": n}) for n in range(200)}
    assert len(answers) == 200


def test_key_order_does_not_matter() -> None:
    assert expected_output({"a": 1, "b": 2}) == expected_output({"b": 2, "a": 1})
    assert canonical_json({"b": 2, "a": 1}) == '{"a":1,"b":2}'


@given(json_values)
def test_schema_shaped_answers_validate(item: Any) -> None:
    schema = Review.model_json_schema()
    answer = expected_output(item, schema)
    assert set(schema["required"]) <= answer.keys() <= set(schema["properties"])
    # Valid as written: nothing coerced, nothing left for a default to fill.
    assert Review.model_validate(answer).model_dump(mode="json", exclude_unset=True) == answer
    assert expected_output(json.loads(json.dumps(item)), schema) == answer


def _depth(tree: Tree) -> int:
    return 1 + max((_depth(child) for child in tree.children), default=0)


@given(json_values)
def test_recursive_schemas_terminate_and_validate(item: Any) -> None:
    answer = expected_output(item, Tree.model_json_schema())
    tree = Tree.model_validate(answer)
    assert tree.model_dump(mode="json", exclude_unset=True) == answer
    assert 1 <= _depth(tree) <= 8  # the generator's depth limit ends the recursion


@pytest.mark.parametrize(
    ("schema", "check"),
    [
        ({"enum": ["a", "b", "c"]}, lambda v: v in "abc"),
        ({"const": 42}, lambda v: v == 42),
        ({"type": "boolean"}, lambda v: isinstance(v, bool)),
        ({"type": "null"}, lambda v: v is None),
        ({"type": "integer", "minimum": -3, "maximum": -1}, lambda v: -3 <= v <= -1),
        ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 2}, lambda v: v == 1),
        ({"type": "number", "minimum": 0.5, "maximum": 0.6}, lambda v: 0.5 <= v <= 0.6),
        ({"type": "number", "maximum": -10}, lambda v: v <= -10),
        (
            {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
            lambda v: len(v) == 2,
        ),
        ({"type": "string", "maxLength": 3}, lambda v: len(v) <= 3),
        ({"type": "string", "minLength": 40}, lambda v: len(v) >= 40),
        (
            {"type": "string", "format": "date"},
            lambda v: TypeAdapter(Any).validate_python(v) and v[4] == "-",
        ),
        ({"type": "string", "format": "uuid"}, lambda v: len(v) == 36),
        ({"type": ["string", "null"]}, lambda v: isinstance(v, str)),
        (
            {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
            lambda v: isinstance(v, (int, bool)),
        ),
        (
            {
                "allOf": [
                    {"properties": {"a": {"type": "integer"}}},
                    {"properties": {"b": {"const": 1}}},
                ]
            },
            lambda v: set(v) == {"a", "b"},
        ),
        ({"$ref": "#/definitions/X", "definitions": {"X": {"const": "x"}}}, lambda v: v == "x"),
        ({"prefixItems": [{"const": 1}, {"const": 2}]}, lambda v: v[:2] == [1, 2]),
    ],
)
def test_schema_keywords(schema: dict[str, Any], check: Any) -> None:
    for n in range(20):
        assert check(expected_output(n, schema)), expected_output(n, schema)


def test_choices_vary_with_the_input() -> None:
    labels = {expected_output(n, {"enum": ["a", "b", "c"]}) for n in range(50)}
    assert labels == {"a", "b", "c"}


def test_output_tokens_pads_the_first_free_string() -> None:
    plain = expected_output("x", Review.model_json_schema())
    padded = expected_output("x", Review.model_json_schema(), output_tokens=300)
    assert padded["tags"][0].startswith(plain["tags"][0] + " ")
    assert len(canonical_json(padded)) / 4 >= 290
    assert padded == expected_output("x", Review.model_json_schema(), output_tokens=300)
    Review.model_validate(padded)


def test_output_tokens_without_schema() -> None:
    short, long = expected_output("q"), expected_output("q", output_tokens=100)
    assert long.startswith(short + " ")
    assert 90 <= len(long.split()) <= 100
    assert expected_output("q", output_tokens=1) == short


def test_long_tail_is_deterministic_and_long_tailed() -> None:
    tail = LongTail(median=40, sigma=1.0, maximum=2000)
    lengths = sorted(tail(n) for n in range(2000))
    assert lengths == sorted(LongTail(median=40, sigma=1.0, maximum=2000)(n) for n in range(2000))
    assert 30 <= lengths[1000] <= 50
    assert lengths[-20] > 5 * lengths[1000]
    assert lengths[-1] <= 2000
    assert LongTail(seed=1)(5) != LongTail(seed=2)(5) or LongTail(seed=1)(6) != LongTail(seed=2)(6)
    assert target_tokens(None, 1) is None
    assert target_tokens(7, 1) == 7
    assert target_tokens(lambda item: item * 2, 4) == 8


def test_long_tail_validates() -> None:
    with pytest.raises(ConfigurationError, match="median"):
        LongTail(median=0)


def test_item_output_schema_of_a_results_schema() -> None:
    out = Review.model_json_schema()
    defs = out.pop("$defs")
    root = {
        "type": "object",
        "properties": {"results": {"type": "array", "items": {"$ref": "#/$defs/Result"}}},
        "$defs": {
            **defs,
            "Result": {"type": "object", "properties": {"id": {"enum": ["1", "2"]}, "output": out}},
        },
    }
    schema = item_output_schema(root)
    assert schema is not None
    assert expected_output(3, schema) == expected_output(3, Review.model_json_schema())
    assert item_output_schema({"type": "object", "properties": {"x": {}}}) is None
    assert item_output_schema({"type": "string"}) is None


def test_item_output_schema_of_a_keyed_results_schema() -> None:
    from coalesce._wire.schema import build_reply_schema

    for pin in (True, False):
        root = build_reply_schema(Review.model_json_schema(), ["1", "2"], pin=pin)
        schema = item_output_schema(root)
        assert schema is not None
        assert expected_output(3, schema) == expected_output(3, Review.model_json_schema())
    assert item_output_schema({"properties": {"results": {"type": "object"}}}) is None


def test_item_output_schema_rebases_references_to_the_output() -> None:
    from coalesce._wire.schema import build_reply_schema

    root = build_reply_schema(Tree.model_json_schema(), ["1"], pin=True)
    schema = item_output_schema(root)
    assert schema is not None
    assert expected_output("t", schema) == expected_output("t", Tree.model_json_schema())


def test_free_text_is_the_same_answer_with_or_without_a_string_schema() -> None:
    text = expected_output("item")
    assert expected_output("item", {"type": "string", "title": "Answer"}) == text
    assert (
        expected_output("item", {"$ref": "#/$defs/A", "$defs": {"A": {"type": "string"}}}) == text
    )
    assert expected_output("item", {"type": "string", "maxLength": 3}) != text  # constrained
