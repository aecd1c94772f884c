"""The streaming splitter: events as each result completes, any chunking (pure)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_packing import Case, cases, expected, fingerprint, oracle_all_occurrences, validate

from coalesce._wire.jsonstream import (
    Failed,
    Ignored,
    IgnoreReason,
    Resolved,
    ResultScanner,
    StreamEvent,
    StreamSplitter,
)
from coalesce._wire.outcomes import FailureKind
from coalesce._wire.packing import split_reply


def as_int(raw: Any) -> int:
    if type(raw) is not int:
        raise ValueError(f"not an int: {raw!r}")
    return raw


def feed_all(
    splitter: StreamSplitter[Any], chunks: list[str], truncated: bool = False
) -> list[Any]:
    events: list[Any] = []
    for chunk in chunks:
        events += splitter.feed(chunk)
    return events + splitter.close(truncated)


def outcome(events: list[Any]) -> dict[str, Any]:
    decided: dict[str, Any] = {}
    for event in events:
        if isinstance(event, Resolved):
            assert event.id not in decided
            decided[event.id] = event.value
        elif isinstance(event, Failed):
            assert event.id not in decided
            decided[event.id] = event.failure.kind
    return decided


NASTY_REPLY = (
    'Sure {not json} here:\n```json\n{"results": [\n'
    '  {"id": "2", "output": "a \\"quoted\\" }]} \\\\ \\u00e9\\ud83d\\ude00 [{"},\n'
    '  {"id": 1, "output": "\u2603 {\\n}"}\n]}\n```'
)


def test_event_fires_when_the_object_completes_not_at_the_end() -> None:
    splitter = StreamSplitter(["1", "2"], as_int)
    first = '{"results": [{"id": "2", "output": 20}'
    assert splitter.feed(first[:-1]) == []
    assert splitter.feed(first[-1]) == [Resolved("2", 20)]
    assert splitter.pending == ("1",)
    assert splitter.feed(', {"id": "1", "output": 10}') == [Resolved("1", 10)]
    assert splitter.done
    assert splitter.feed("]}") == []
    assert splitter.close() == []


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_any_chunk_size_gives_the_same_outcome(size: int) -> None:
    chunks = [NASTY_REPLY[i : i + size] for i in range(0, len(NASTY_REPLY), size)]
    events = feed_all(StreamSplitter(["1", "2"], str), chunks)
    assert outcome(events) == {"1": "\u2603 {\n}", "2": 'a "quoted" }]} \\ \u00e9\U0001f600 [{'}


def test_every_two_chunk_split_point() -> None:
    whole = outcome(feed_all(StreamSplitter(["1", "2"], str), [NASTY_REPLY]))
    for cut in range(len(NASTY_REPLY) + 1):
        chunks = [NASTY_REPLY[:cut], NASTY_REPLY[cut:]]
        assert outcome(feed_all(StreamSplitter(["1", "2"], str), chunks)) == whole


def test_key_split_inside_unicode_escape() -> None:
    reply = '{"res\\u0075lts": [{"id": "1", "output": 1}]}'
    for cut in range(len(reply) + 1):
        splitter = StreamSplitter(["1"], as_int)
        assert outcome(feed_all(splitter, [reply[:cut], reply[cut:]])) == {"1": 1}


def test_duplicate_after_resolution_is_ignored_and_reported() -> None:
    splitter = StreamSplitter(["1"], as_int)
    events = splitter.feed('[{"id": "1", "output": 1}, {"id": "1", "output": 2}]')
    assert events == [Resolved("1", 1), Ignored("1", IgnoreReason.DUPLICATE, 2)]


def test_first_invalid_occurrence_fails_the_id_for_good() -> None:
    splitter = StreamSplitter(["1"], as_int)
    events = splitter.feed('[{"id": "1", "output": "one"}, {"id": "1", "output": 1}]')
    assert isinstance(events[0], Failed)
    assert events[0].failure.kind is FailureKind.INVALID
    assert events[1] == Ignored("1", IgnoreReason.DUPLICATE, 1)


def test_unknown_ids_are_reported() -> None:
    splitter = StreamSplitter(["1"], as_int)
    events = splitter.feed('[{"id": "7", "output": 1}, {"id": "7", "output": 1}]')
    assert events == [Ignored("7", IgnoreReason.UNKNOWN, 1)] * 2
    assert splitter.unknown_ids == ("7",)


@pytest.mark.parametrize(
    ("text", "truncated", "kind"),
    [
        ('{"results": []}', False, FailureKind.MISSING),
        ('{"results": []}', True, FailureKind.TRUNCATED),
        ('{"results": [{"id": "1", "outp', False, FailureKind.TRUNCATED),
        ("no JSON here", False, FailureKind.MISSING),
    ],
)
def test_close_fails_pending_ids(text: str, truncated: bool, kind: FailureKind) -> None:
    splitter = StreamSplitter(["1", "2"], as_int)
    splitter.feed(text)
    events = splitter.close(truncated)
    assert [(e.id, e.failure.kind) for e in events if isinstance(e, Failed)] == [
        ("1", kind),
        ("2", kind),
    ]
    assert splitter.close() == []
    with pytest.raises(RuntimeError):
        splitter.feed("x")
    assert "closed" in repr(splitter)


def test_large_reply_in_one_char_chunks_stays_linear() -> None:
    # A quadratic splitter would take minutes here; pytest-timeout guards the hang.
    big = 'x\\"{[' * 20_000
    reply = json.dumps({"results": [{"id": "1", "output": big}]})
    scanner = ResultScanner()
    found = [obj for char in reply for obj in scanner.feed(char)]
    assert json.loads(found[0].text)["output"] == big
    assert found[0].key is None
    keyed = json.dumps({"results": {"1": big, "2": [big]}})
    scanner = ResultScanner()
    found = [obj for char in keyed for obj in scanner.feed(char)]
    assert [(f.key, json.loads(f.text)) for f in found] == [("1", big), ("2", [big])]


@st.composite
def chunked(draw: st.DrawFn) -> tuple[Case, list[str]]:
    case = draw(cases())
    text = case.sent
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return case, [text[a:b] for a, b in itertools.pairwise(bounds)]


def oracle_first_occurrence(case: Case, item_id: str) -> Any:
    """The stream's rule: the first complete occurrence decides."""
    raws = [raw for i, raw in case.seen() if i == item_id]
    if not raws:
        return FailureKind.TRUNCATED if case.cut is not None else FailureKind.MISSING
    try:
        return validate(raws[0])
    except ValueError:
        return FailureKind.INVALID


@given(chunked())
def test_stream_property_each_item_gets_its_own_output_or_a_failure(
    data: tuple[Case, list[str]],
) -> None:
    case, chunks = data
    splitter: StreamSplitter[Any] = StreamSplitter(list(case.inputs), validate)
    per_chunk: list[list[StreamEvent[Any]]] = [splitter.feed(c) for c in chunks]
    per_chunk.append(splitter.close(truncated=case.cut is not None))
    events = [e for chunk_events in per_chunk for e in chunk_events]
    decided = outcome(events)
    assert set(decided) == set(case.inputs)
    for item_id, item in case.inputs.items():
        if not isinstance(decided[item_id], FailureKind):
            assert decided[item_id] == expected(item)  # never another's
        assert decided[item_id] == oracle_first_occurrence(case, item_id)
    # Each first occurrence is decided in the very chunk that completes its object.
    ends = [0]
    for chunk in chunks:
        ends.append(ends[-1] + len(chunk))
    limit = len(case.sent)
    for item_id, _raw, end in case.results:
        if item_id not in case.inputs or end > limit:
            continue
        index = next(n for n in range(len(chunks)) if ends[n + 1] >= end)
        assert item_id in {e.id for e in per_chunk[index] if not isinstance(e, Ignored)} | {
            e.id
            for chunk_events in per_chunk[:index]
            for e in chunk_events
            if not isinstance(e, Ignored)
        }


@given(chunked())
def test_stream_matches_split_reply_without_conflicting_duplicates(
    data: tuple[Case, list[str]],
) -> None:
    case, chunks = data
    splitter: StreamSplitter[Any] = StreamSplitter(list(case.inputs), validate)
    stream = outcome(feed_all(splitter, chunks, truncated=case.cut is not None))
    split = split_reply(case.sent, list(case.inputs), validate, truncated=case.cut is not None)
    assert splitter.unknown_ids == split.unknown_ids
    for item_id in case.inputs:
        raws = {fingerprint(raw) for i, raw in case.seen() if i == item_id}
        if len(raws) <= 1:
            whole = split.values.get(item_id, split.failures.get(item_id))
            assert stream[item_id] == (whole.kind if item_id in split.failures else whole)  # type: ignore[union-attr]
        else:
            assert oracle_all_occurrences(case, item_id) is FailureKind.DUPLICATE
