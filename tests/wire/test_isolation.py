"""What a packed prompt does to set items apart from the instructions (pure)."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from coalesce._exceptions import ConfigurationError
from coalesce._wire.packing import (
    DATAMARK,
    DEFAULT_ISOLATION,
    NO_ISOLATION,
    NOTICE,
    Isolation,
    format_instructions,
    mark,
    pack_request,
    split_reply,
    unmark,
    unmarked,
)

INSTRUCTIONS = "Classify the sentiment of the review as positive or negative."
SCHEMA = {"type": "string", "enum": ["positive", "negative"]}
ITEMS = ["a fine  film,\nwell made", "dull"]


def test_the_default_leaves_the_user_message_the_array_alone() -> None:
    request = pack_request(INSTRUCTIONS, ITEMS, SCHEMA)
    assert json.loads(request.user) == [
        {"id": "1", "input": ITEMS[0]},
        {"id": "2", "input": ITEMS[1]},
    ]
    assert request == pack_request(INSTRUCTIONS, ITEMS, SCHEMA, isolation=DEFAULT_ISOLATION)


def test_no_isolation_is_the_format_before_issue_26() -> None:
    request = pack_request(INSTRUCTIONS, ITEMS, SCHEMA, isolation=NO_ISOLATION)
    assert request.system == (
        f"{INSTRUCTIONS}\n\nThe user message is a JSON array of items, each"
        ' {"id", "input"}: apply the instructions above to each input on its own and give'
        " its output under its id."
    )


@pytest.mark.parametrize("structured", [True, False])
def test_the_notice_is_one_sentence_of_the_cacheable_system_message(structured: bool) -> None:
    notice = Isolation(notice=True)
    small = pack_request(INSTRUCTIONS, ITEMS, SCHEMA, structured=structured, isolation=notice)
    large = pack_request(INSTRUCTIONS, ITEMS * 3, SCHEMA, structured=structured, isolation=notice)
    assert small.system.count(NOTICE) == 1
    assert small.system == large.system  # the same for every request of the function
    assert json.loads(small.user)[0]["input"] == ITEMS[0]
    if not structured:  # the reply's description still follows
        assert small.system.index(NOTICE) < small.system.index("Reply with one JSON object")


def test_datamarking_replaces_whitespace_in_strings_and_names_the_marker() -> None:
    request = pack_request(INSTRUCTIONS, ITEMS, SCHEMA, isolation=Isolation(datamark=DATAMARK))
    inputs = [entry["input"] for entry in json.loads(request.user)]
    assert inputs == [f"a{DATAMARK}fine{DATAMARK}film,{DATAMARK}well{DATAMARK}made", "dull"]
    assert f"the character {DATAMARK} is written in place of every space" in request.system


class Review(pydantic.BaseModel):
    title: str
    stars: int


def test_datamarking_walks_structured_items_but_not_keys() -> None:
    item = {
        "the title": "big fish",
        "tags": ["a b", 3, None],
        "review": Review(title="x y", stars=2),
    }
    request = pack_request(
        INSTRUCTIONS,
        [item, Review(title="p q", stars=1)],
        SCHEMA,
        isolation=Isolation(datamark="|"),
    )
    first, second = (entry["input"] for entry in json.loads(request.user))
    assert first == {
        "the title": "big|fish",
        "tags": ["a|b", 3, None],
        "review": {"title": "x|y", "stars": 2},
    }
    assert second == {"title": "p|q", "stars": 1}


def test_mark_and_unmark() -> None:
    assert mark("  two  words ", "|") == "two|words"
    assert mark(("a b",), "|") == ["a|b"]
    assert mark("a b", "") == "a b"
    assert unmark({"k|ey": ["a|b", 1]}, "|") == {"k ey": ["a b", 1]}
    assert unmark("a|b", "") == "a|b"


def test_unmarked_outputs_reach_the_caller_without_the_marker() -> None:
    validate = pydantic.TypeAdapter(str).validate_python
    reply = json.dumps({"results": {"1": f"a{DATAMARK}fine{DATAMARK}film", "2": "dull"}})
    split = split_reply(reply, ["1", "2"], unmarked(validate, DATAMARK))
    assert split.values == {"1": "a fine film", "2": "dull"}
    assert unmarked(validate, "") is validate


def test_the_sandwich_restates_the_instructions_after_the_array() -> None:
    request = pack_request(INSTRUCTIONS, ITEMS, SCHEMA, isolation=Isolation(sandwich=True))
    array, end = json.JSONDecoder().raw_decode(request.user)
    assert array == [{"id": "1", "input": ITEMS[0]}, {"id": "2", "input": ITEMS[1]}]
    assert request.user[end:].strip().endswith(INSTRUCTIONS)
    assert INSTRUCTIONS in request.system  # the instructions stay first too


@pytest.mark.parametrize("marker", ["ab", " ", "\n"])
def test_a_datamark_is_one_visible_character(marker: str) -> None:
    with pytest.raises(ConfigurationError, match="datamark"):
        Isolation(datamark=marker)


def test_format_instructions_without_isolation_is_unchanged() -> None:
    described: Any = format_instructions(SCHEMA)
    assert NOTICE not in described
    assert NOTICE in format_instructions(SCHEMA, isolation=Isolation(notice=True))
