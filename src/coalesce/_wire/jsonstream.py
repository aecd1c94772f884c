"""Incremental split of a streamed multi-item reply (``docs/protocol.md``).

:class:`ResultScanner` finds, in text arriving chunk by chunk, each complete result of
either wire format, skipping prose and code fences around the JSON; every character is
looked at a bounded number of times, so the work is linear in the reply's length
whatever the chunking (chunks may split the text anywhere, even inside an escape).

:class:`StreamSplitter` turns those results into per-id events as soon as each one
completes. An id's **first complete occurrence decides it**, valid or not: an answer
cannot be taken back, so a later occurrence is ignored and reported
(:attr:`IgnoreReason.DUPLICATE`), as is an id the request did not carry
(:attr:`IgnoreReason.UNKNOWN`).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union

from .outcomes import Found, ItemFailure, absent, check_ids, judge, ordered_unique, read_result

__all__ = [
    "Failed",
    "Found",
    "IgnoreReason",
    "Ignored",
    "Resolved",
    "ResultScanner",
    "StreamSplitter",
]

T = TypeVar("T")

_OPENER = re.compile(r"[\[{]")
_STRING_STOP = re.compile(r'["\\]')
_CAPTURE_STOP = re.compile(r'["{}\[\]]')
_LITERAL_CHARS = re.compile(r"[0-9A-Za-z.+\-]*")
_LITERAL_START = re.compile(r"[0-9A-Za-z.+\-]")
_LITERAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_WHITESPACE = " \t\n\r"

# Scanner modes.
_PROSE, _TOKENS, _STRING, _LITERAL_MODE, _CAPTURE = range(5)
# What a container expects next.
_KEY_OR_END, _KEY, _COLON, _VALUE, _VALUE_OR_END, _COMMA_OR_END = range(6)


class _Frame:
    __slots__ = ("expect", "is_object", "key", "results")

    def __init__(self, is_object: bool, results: bool) -> None:
        self.is_object = is_object
        # A results array (format 1: its objects are results) or a results object
        # (format 2: each member is a result, keyed by id).
        self.results = results
        self.expect = _KEY_OR_END if is_object else _VALUE_OR_END
        self.key: str | None = None


class ResultScanner:
    """Finds complete results in text fed chunk by chunk (see the module doc).

    Args:
        ids: The request's ids, to recognise a top-level object of results without
            the ``"results"`` wrapper.
    """

    def __init__(self, ids: Collection[str] = ()) -> None:
        self._ids = frozenset(ids)
        self._mode = _PROSE
        self._stack: list[_Frame] = []
        self._pieces: list[str] = []  # the key string or literal or result so far
        self._escape = False
        self._key = False  # the string being read is an object key
        self._depth = 0  # nesting inside the captured result
        self._in_string = False  # the capture is inside a string
        self._result_key: str | None = None  # the id of the keyed result being captured
        self._keyed_literal = False  # the literal being read is a keyed result

    @property
    def in_results(self) -> bool:
        """Whether the text so far ends inside the results (so a cut there truncates)."""
        return self._mode == _CAPTURE or any(f.results for f in self._stack)

    def feed(self, chunk: str) -> list[Found]:
        """Scan one more chunk; return each result it completed, in order: its text, and its
        key when it is a member of a results object (format 2)."""
        found: list[Found] = []
        pos, end = 0, len(chunk)
        while pos < end:
            pos = self._step(chunk, pos, found)
        return found

    def _step(self, chunk: str, pos: int, found: list[Found]) -> int:
        if self._mode == _CAPTURE:
            return self._capture(chunk, pos, found)
        if self._mode == _TOKENS:
            return self._token(chunk, pos)
        if self._mode == _STRING:
            return self._string(chunk, pos)
        if self._mode == _LITERAL_MODE:
            return self._literal(chunk, pos, found)
        return self._prose(chunk, pos)

    def _prose(self, chunk: str, pos: int) -> int:
        match = _OPENER.search(chunk, pos)
        if match is None:
            return len(chunk)
        # An array opened at top level is a bare list of results.
        self._push(is_object=match.group() == "{", results=match.group() == "[")
        return match.end()

    def _push(self, *, is_object: bool, results: bool) -> None:
        self._stack.append(_Frame(is_object, results))
        self._mode = _TOKENS

    def _reset(self, pos: int) -> int:
        # Not JSON after all: back to prose at this very character, which may open anew.
        self._stack.clear()
        self._mode = _PROSE
        return pos

    def _token(self, chunk: str, pos: int) -> int:
        char = chunk[pos]
        if char in _WHITESPACE:
            return pos + 1
        frame = self._stack[-1]
        expect = frame.expect
        if char in "}]":
            return self._close(frame, char, pos)
        if expect == _COLON:
            return self._expect(frame, char == ":", _VALUE, pos)
        if expect == _COMMA_OR_END:
            return self._expect(frame, char == ",", _KEY if frame.is_object else _VALUE, pos)
        if expect in (_KEY, _KEY_OR_END):
            return self._start_string(frame, key=True, pos=pos) if char == '"' else self._reset(pos)
        return self._value(frame, char, pos)

    def _expect(self, frame: _Frame, ok: bool, then: int, pos: int) -> int:
        if not ok:
            return self._reset(pos)
        frame.expect = then
        return pos + 1

    def _close(self, frame: _Frame, char: str, pos: int) -> int:
        # A trailing comma ("[1, 2,]") is tolerated: models write it when not constrained.
        allowed = (_KEY_OR_END, _KEY) if frame.is_object else (_VALUE_OR_END, _VALUE)
        if (char == "}") != frame.is_object or frame.expect not in (*allowed, _COMMA_OR_END):
            return self._reset(pos)
        self._stack.pop()
        if not self._stack:
            self._mode = _PROSE
        return pos + 1

    def _value(self, frame: _Frame, char: str, pos: int) -> int:
        frame.expect = _COMMA_OR_END  # once this value completes
        if len(self._stack) == 1 and frame.is_object and frame.key in self._ids:
            frame.results = True  # {"1": ..., "2": ...}: the "results" wrapper left out
        keyed = frame.results and frame.is_object  # a member of a results object
        if char in "{[" and (keyed or (char == "{" and frame.results)):
            return self._start_capture(frame.key if keyed else None, char, depth=1, pos=pos)
        if char == '"' and keyed:
            return self._start_capture(frame.key, char, depth=0, pos=pos)
        if char in "{[":
            results = frame.is_object and frame.key == "results"
            self._push(is_object=char == "{", results=results)
            return pos + 1
        if char == '"':
            return self._start_string(frame, key=False, pos=pos)
        if char in "-0123456789tfn" or (keyed and _LITERAL_START.match(char) is not None):
            # A keyed output may be a bare word (`high`): its id fails, the scan goes on.
            self._mode, self._pieces, self._keyed_literal = _LITERAL_MODE, [], keyed
            self._result_key = frame.key
            return pos
        return self._reset(pos)

    def _start_capture(self, key: str | None, char: str, *, depth: int, pos: int) -> int:
        # A string result is captured from inside its quotes, at depth 0.
        self._mode, self._depth, self._in_string = _CAPTURE, depth, depth == 0
        self._result_key, self._escape, self._pieces = key, False, [char]
        return pos + 1

    def _start_string(self, frame: _Frame, *, key: bool, pos: int) -> int:
        if key:
            frame.expect = _COLON
        self._mode, self._key, self._escape, self._pieces = _STRING, key, False, []
        return pos + 1

    def _string(self, chunk: str, pos: int) -> int:
        if self._escape:
            self._escape = False
            if self._key:
                self._pieces.append(chunk[pos])
            return pos + 1
        match = _STRING_STOP.search(chunk, pos)
        stop = len(chunk) if match is None else match.start()
        if self._key:
            self._pieces.append(chunk[pos:stop])
        if match is None:
            return stop
        if match.group() == "\\":
            self._escape = True
            if self._key:
                self._pieces.append("\\")
            return stop + 1
        self._mode = _TOKENS
        return self._end_key(stop + 1) if self._key else stop + 1

    def _end_key(self, pos: int) -> int:
        try:
            self._stack[-1].key = json.loads('"' + "".join(self._pieces) + '"', strict=False)
        except ValueError:
            return self._reset(pos)
        return pos

    def _literal(self, chunk: str, pos: int, found: list[Found]) -> int:
        match = _LITERAL_CHARS.match(chunk, pos)
        assert match is not None  # the pattern matches the empty string
        self._pieces.append(match.group())
        stop = match.end()
        if stop == len(chunk):
            return stop  # the literal may go on in the next chunk
        self._mode = _TOKENS
        text = "".join(self._pieces)
        if self._keyed_literal:
            found.append(Found(text, self._result_key))  # not JSON: its own id is invalid
            return stop
        return stop if _LITERAL.fullmatch(text) else self._reset(stop)

    def _capture(self, chunk: str, pos: int, found: list[Found]) -> int:
        i, end = pos, len(chunk)
        while i < end:
            if self._escape:
                self._escape, i = False, i + 1
                continue
            match = (_STRING_STOP if self._in_string else _CAPTURE_STOP).search(chunk, i)
            if match is None:
                i = end
                break
            i, char = match.end(), match.group()
            if self._in_string:
                self._escape, self._in_string = char == "\\", char == "\\"
                if not self._in_string and self._depth == 0:
                    return self._captured(chunk, pos, i, found)  # a string result ends
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:
                    return self._captured(chunk, pos, i, found)
        self._pieces.append(chunk[pos:i])
        return i

    def _captured(self, chunk: str, start: int, stop: int, found: list[Found]) -> int:
        self._pieces.append(chunk[start:stop])
        found.append(Found("".join(self._pieces), self._result_key))
        self._mode, self._pieces = _TOKENS, []
        return stop


class IgnoreReason(enum.Enum):
    """Why a result in a stream resolved nobody."""

    UNKNOWN = "unknown"
    """Its id is not one of the request's."""
    DUPLICATE = "duplicate"
    """Its id was already decided by an earlier occurrence."""


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """An id got its validated value."""

    id: str
    value: T


@dataclass(frozen=True)
class Failed:
    """An id failed; this is final for this reply."""

    id: str
    failure: ItemFailure


@dataclass(frozen=True)
class Ignored:
    """A result that resolved nobody (reported for statistics and logs)."""

    id: str
    reason: IgnoreReason
    raw: Any = None


StreamEvent = Union[Resolved[T], Failed, Ignored]  # noqa: UP007 - runtime alias on 3.10


class StreamSplitter(Generic[T]):
    """Splits a streamed reply into per-id events as each result completes.

    Args:
        ids: The request's ids (unique strings).
        validate: Converts one raw output to the caller's type; any exception it raises
            marks the output invalid.

    Raises:
        ConfigurationError: The ids are not unique strings.
    """

    def __init__(self, ids: Sequence[str], validate: Callable[[Any], T]) -> None:
        self._ids = check_ids(ids)
        self._pending = dict.fromkeys(self._ids)
        self._validate = validate
        self._scanner = ResultScanner(self._ids)
        self._unknown: list[str] = []
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<StreamSplitter {state}, {len(self._pending)}/{len(self._ids)} ids pending>"

    @property
    def pending(self) -> tuple[str, ...]:
        """Ids not decided yet, in request order."""
        return tuple(self._pending)

    @property
    def done(self) -> bool:
        """Whether every id is decided (the rest of the stream cannot change anything)."""
        return not self._pending

    @property
    def unknown_ids(self) -> tuple[str, ...]:
        """Ids seen that the request did not carry, in first-seen order."""
        return ordered_unique(self._unknown)

    def feed(self, chunk: str) -> list[StreamEvent[T]]:
        """Scan one more chunk of the reply.

        Args:
            chunk: The next piece of text, split anywhere.

        Returns:
            One event per result completed by this chunk.

        Raises:
            RuntimeError: The splitter was already closed.
        """
        if self._closed:
            raise RuntimeError("StreamSplitter.feed() called after close()")
        events: list[StreamEvent[T]] = []
        for found in self._scanner.feed(chunk):
            event = self._decide(found)
            if event is not None:
                events.append(event)
        return events

    def _decide(self, found: Found) -> StreamEvent[T] | None:
        occurrence = read_result(found)
        if occurrence is None:
            return None
        item_id = occurrence.id
        if item_id not in self._pending:
            known = item_id in self._ids
            if not known:
                self._unknown.append(item_id)
            reason = IgnoreReason.DUPLICATE if known else IgnoreReason.UNKNOWN
            return Ignored(item_id, reason, occurrence.raw)
        del self._pending[item_id]
        ok, outcome = judge(occurrence, self._validate)
        return Resolved(item_id, outcome) if ok else Failed(item_id, outcome)

    def close(self, truncated: bool = False) -> list[StreamEvent[T]]:
        """End the stream: every id still pending fails.

        Args:
            truncated: The provider said the reply was cut off (``finish_reason:
                length``). A reply that ends inside the results counts as cut off
                too. Pending ids then fail as ``TRUNCATED``, otherwise as ``MISSING``.

        Returns:
            One :class:`Failed` per pending id, in request order (empty if called twice).
        """
        if self._closed:
            return []
        self._closed = True
        cut = truncated or self._scanner.in_results
        events: list[StreamEvent[T]] = [Failed(i, absent(i, truncated=cut)) for i in self._pending]
        self._pending.clear()
        return events
