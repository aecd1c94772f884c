"""The free-text agreement measure (issue 37, point 1), pure."""

from __future__ import annotations

from enum import Enum
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from coalesce._accuracy.texts import (
    TEXT_AGREEMENT,
    agreement_for,
    answers_agree,
    labels,
    token_f1,
    words,
)
from coalesce.testing import degraded_output, expected_output


class Review(BaseModel):
    sentiment: Literal["negative", "neutral", "positive"]
    product: str


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


def test_words_are_normalised() -> None:
    assert words("The Kindle  Paperwhite!") == ["kindle", "paperwhite"]
    assert words("ＣＡＦÉ") == ["café"]  # NFKC, case folded


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("Kindle Paperwhite", "the kindle paperwhite.", 1.0),
        ("Kindle Paperwhite", "Kindle", 2 / 3),
        ("Kindle Paperwhite", "Echo Dot", 0.0),
        ("", "", 1.0),
        ("", "Echo", 0.0),
    ],
)
def test_token_f1_of_known_pairs(first: str, second: str, expected: float) -> None:
    assert token_f1(first, second) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("packed", "plain", "agree"),
    [
        # The same answer in other words.
        ("the Kindle Paperwhite", "Kindle Paperwhite.", True),
        ("Kindle Paperwhite e-reader", "Kindle Paperwhite", True),
        ("Bonjour le monde", "bonjour, le monde !", True),
        # A different answer.
        ("Kindle Paperwhite", "Echo Dot smart speaker", False),
        ("battery life is poor", "screen is too dim", False),
        ("yes", "no", False),
    ],
)
def test_strings_agree_when_they_share_enough_words(packed: str, plain: str, agree: bool) -> None:
    assert answers_agree(packed, plain) is agree


def test_models_agree_field_by_field_enums_exactly_text_by_words() -> None:
    plain = Review(sentiment="positive", product="Kindle Paperwhite")
    assert answers_agree(Review(sentiment="positive", product="the kindle paperwhite"), plain)
    assert not answers_agree(Review(sentiment="neutral", product="Kindle Paperwhite"), plain)
    assert not answers_agree(Review(sentiment="positive", product="Echo Dot"), plain)


def test_exact_parts_are_compared_exactly() -> None:
    assert answers_agree(3, 3.0)
    assert not answers_agree(3, 4)
    assert not answers_agree(True, 1)  # a boolean is not a number here
    assert answers_agree(Colour.RED, Colour.RED)
    assert not answers_agree(Colour.RED, Colour.BLUE)
    assert answers_agree(None, None)
    assert not answers_agree(None, "")
    assert answers_agree(["a b", 1], ["A B.", 1])
    assert not answers_agree(["a"], ["a", "b"])
    assert not answers_agree({"a": 1}, {"a": 1, "b": 2})


@given(st.text(max_size=40))
def test_an_answer_agrees_with_itself(text: str) -> None:
    assert answers_agree(text, text)
    assert answers_agree({"t": [text]}, {"t": [text]})


@given(st.text(max_size=40), st.text(max_size=40))
def test_agreement_is_symmetric(first: str, second: str) -> None:
    assert answers_agree(first, second) == answers_agree(second, first)
    assert 0.0 <= token_f1(first, second) <= 1.0


def test_the_threshold_decides_between_paraphrase_and_other_answer() -> None:
    assert answers_agree("Kindle Paperwhite", "Kindle", threshold=TEXT_AGREEMENT)
    assert not answers_agree("Kindle Paperwhite", "Kindle", threshold=0.9)


def test_sharing_half_the_words_is_another_answer() -> None:
    assert token_f1("Kindle Paperwhite", "Kindle Oasis") == pytest.approx(TEXT_AGREEMENT)
    assert not answers_agree("Kindle Paperwhite", "Kindle Oasis")


class Rated(BaseModel):
    rating: Literal["positive", "very positive"]
    reason: str


def test_a_schemas_labels_compare_exactly_and_its_free_text_by_words() -> None:
    schema = Rated.model_json_schema()
    assert labels(schema) == {"positive", "very positive"}
    agree = agreement_for(schema, None)
    assert agree is not None
    plain = Rated(rating="positive", reason="The battery lasts two days.")
    assert agree(Rated(rating="positive", reason="battery lasts two days"), plain)
    assert not agree(Rated(rating="very positive", reason="The battery lasts two days."), plain)


def test_equality_without_free_text_and_the_users_agree_wins() -> None:
    assert agreement_for({"enum": ["a", "b"]}, None) is None
    assert agreement_for({"type": "integer"}, None) is None
    mine = lambda packed, plain: True  # noqa: E731
    assert agreement_for({"type": "string"}, mine) is mine
    assert agreement_for({"type": "string"}, None) is not None


@pytest.mark.parametrize("tokens", [None, 12, 40])
def test_the_simulators_wrong_free_text_is_another_answer(tokens: int | None) -> None:
    for item in range(50):
        right = expected_output(item, {"type": "string"}, output_tokens=tokens)
        wrong = degraded_output(item, {"type": "string"}, output_tokens=tokens)
        assert answers_agree(right, expected_output(item, {"type": "string"}, output_tokens=tokens))
        assert not answers_agree(wrong, right), (wrong, right)
