"""Per-item outcomes of splitting a packed reply.

Shared by the complete-reply split (:func:`coalesce._wire.packing.split_reply`) and the
streaming one (:class:`coalesce._wire.jsonstream.StreamSplitter`), so both read a result
object, name a failure and map it to an exception the same way.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from .._exceptions import (
    ConfigurationError,
    InvalidOutputError,
    ItemError,
    MissingOutputError,
    TruncatedOutputError,
)

T = TypeVar("T")

#: How much of a reply an error shows, in characters.
REPLY_EXCERPT = 200

# The id of a result object too malformed to parse, read only when it is the very first
# key: anywhere else it could be text inside an output, and would blame a neighbour.
_LEADING_ID = re.compile(r'\{\s*"id"\s*:\s*(?:"((?:[^"\\]|\\.)*)"|(-?[0-9]+))')
# A string (kept as is) or a comma right before a closing bracket (dropped).
_TRAILING_COMMA = re.compile(r'("(?:[^"\\]|\\.)*")|,(\s*[}\]])', re.DOTALL)


class FailureKind(enum.Enum):
    """Why one item got no answer from a reply."""

    MISSING = "missing"
    """The reply (complete) had no result with this id."""
    INVALID = "invalid"
    """The result for this id failed validation, had no output, or was not JSON."""
    DUPLICATE = "duplicate"
    """The reply gave this id two or more different outputs; none is trusted."""
    TRUNCATED = "truncated"
    """The reply was cut off before any result with this id."""


@dataclass(frozen=True)
class ItemFailure:
    """One item's failure in one reply.

    Attributes:
        kind: What went wrong.
        raw: The raw output the model gave for the item (``None`` if it gave none; for a
            result object that was not valid JSON, its text).
        error: A human-readable explanation (the validation error for ``INVALID``),
            written for the caller: it never names the item's id, which the caller
            never saw.
        reply: The whole reply's text, when it helps the caller to see it (the item's
            result was missing or cut off, or the reply was not JSON); its error shows
            the first :data:`REPLY_EXCERPT` characters. ``None`` otherwise.
    """

    kind: FailureKind
    raw: Any = None
    error: str = ""
    reply: str | None = None


@dataclass(frozen=True)
class Split(Generic[T]):
    """The outcome of splitting one reply: each requested id is in exactly one map.

    Attributes:
        ids: The request's ids, in request order.
        values: Validated output per id that got one.
        failures: Failure per id that did not.
        unknown_ids: Ids the reply carried that the request did not (first-seen order).
        truncated: Whether the reply was cut off (told by the caller, or evident from
            the text ending inside the results).
    """

    ids: tuple[str, ...]
    values: Mapping[str, T]
    failures: Mapping[str, ItemFailure]
    unknown_ids: tuple[str, ...] = ()
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether every requested id got a validated value."""
        return not self.failures


@dataclass(frozen=True)
class Occurrence:
    """One result read from a reply, before validation.

    Attributes:
        id: The result's id after ``str()``.
        raw: Its output (or the object's text if it was not JSON).
        has_output: Whether it carried a parseable ``"output"``.
        fingerprint: Canonical text of the output, to tell identical duplicates apart
            from differing ones.
    """

    id: str
    raw: Any
    has_output: bool
    fingerprint: str


class Found(NamedTuple):
    """One complete result as the scanner found it, not parsed yet.

    Attributes:
        text: Its JSON text: a result object ``{"id": ..., "output": ...}`` (format 1),
            or the output itself (format 2).
        key: The id it was written under in a results object (format 2), or ``None``.
    """

    text: str
    key: str | None = None


def read_result(found: Found) -> Occurrence | None:
    """Read one complete result: a keyed output (format 2), or a ``{"id": ..., "output":
    ...}`` object's text, braces included (format 1).

    Returns:
        The occurrence, or ``None`` when no id can be read from it, or it is an echo of
        a request item (``id`` and ``input``, no ``output``): it then blames nobody.
    """
    text = found.text
    try:
        obj = json.loads(text, strict=False)
    except ValueError:
        try:
            obj = json.loads(_drop_trailing_commas(text), strict=False)
        except ValueError:
            if found.key is not None:
                return Occurrence(found.key, text, False, "\x00malformed " + text)
            return _read_malformed(text)
    return _read_parsed(obj, found.key)


def _read_parsed(obj: Any, key: str | None) -> Occurrence | None:
    """A result parsed: the output written under ``key`` (format 2), or a result object
    (``key`` ``None``; see :func:`read_result`)."""
    if key is not None:
        return Occurrence(key, obj, True, _fingerprint(obj))
    if not isinstance(obj, dict) or "id" not in obj:
        return None
    item_id = str(obj["id"])
    if "output" not in obj:
        if "input" in obj:
            return None  # the model echoed a request item: not an answer, blames nobody
        return Occurrence(item_id, None, False, "\x00no output")
    raw = obj["output"]
    return Occurrence(item_id, raw, True, _fingerprint(raw))


class _KeyTwice(ValueError):
    """An object of the reply names a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _KeyTwice
    return obj


def read_whole(text: str, ids: Collection[str]) -> list[Occurrence | None] | None:
    """Each result of a reply that is, as a whole, one JSON object holding only its
    results: ``{"results": {"<id>": <output>, ...}}`` or ``{"results": [{...}, ...]}``,
    no key twice in any of its objects. Read as :func:`read_result` reads each result
    the scanner finds in it (in order), at the cost of one parse; ``None`` for any other
    reply, which the scanner must read (prose around it, a cut, a key given twice)."""
    if "results" in ids:  # the scanner would read the wrapper's own key as an id
        return None
    try:
        whole = json.loads(text, strict=False, object_pairs_hook=_unique_keys)
    except ValueError:
        return None
    if not isinstance(whole, dict) or len(whole) != 1 or "results" not in whole:
        return None
    results = whole["results"]
    if isinstance(results, dict):
        return [_read_parsed(value, key) for key, value in results.items()]
    if isinstance(results, list) and all(isinstance(result, dict) for result in results):
        return [_read_parsed(result, None) for result in results]
    return None


#: ``json.dumps(raw, sort_keys=True, ensure_ascii=False)``, one encoder for every result.
_FINGERPRINT = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


def _fingerprint(raw: Any) -> str:
    return _FINGERPRINT.encode(raw)


def _drop_trailing_commas(text: str) -> str:
    return _TRAILING_COMMA.sub(lambda m: m.group(1) or m.group(2), text)


def _read_malformed(text: str) -> Occurrence | None:
    match = _LEADING_ID.match(text)
    if match is None:
        return None
    if match.group(2) is not None:
        item_id = match.group(2)
    else:
        try:
            item_id = json.loads(f'"{match.group(1)}"', strict=False)
        except ValueError:
            return None
    return Occurrence(item_id, text, False, "\x00malformed " + text)


def judge(occurrence: Occurrence, validate: Callable[[Any], T]) -> tuple[bool, Any]:
    """Validate one occurrence: ``(True, value)`` or ``(False, ItemFailure)``; any
    exception of ``validate`` means invalid."""
    if not occurrence.has_output:
        reason = "not valid JSON" if isinstance(occurrence.raw, str) else "without an output"
        error = f"the reply's result for this call was {reason}"
        return False, ItemFailure(FailureKind.INVALID, occurrence.raw, error)
    try:
        return True, validate(occurrence.raw)
    except Exception as exc:  # any validator error means "invalid", by contract
        error = f"the reply's output for this call failed validation: {exc}"
        return False, ItemFailure(FailureKind.INVALID, occurrence.raw, error)


def absent(item_id: str, *, truncated: bool, reply: str | None = None) -> ItemFailure:
    """The failure of an id the reply (``reply``: its text or start, shown in the caller's
    error; cut off if ``truncated``) never gave a result for; the message does not name
    the id, which the caller never saw."""
    if truncated:
        error = "the reply was cut off before its result for this call"
        return ItemFailure(FailureKind.TRUNCATED, None, error, reply)
    return ItemFailure(FailureKind.MISSING, None, "the reply had no result for this call", reply)


def check_ids(ids: Iterable[str]) -> tuple[str, ...]:
    """Return a request's ids as a tuple, checking they are unique strings.

    Raises:
        ConfigurationError: An id is not a string or appears twice.
    """
    out = tuple(ids)
    if not all(isinstance(i, str) for i in out):
        raise ConfigurationError(f"item ids must be strings, got {out!r}")
    if len(set(out)) != len(out):
        raise ConfigurationError(f"item ids must be unique within a request, got {out!r}")
    return out


def failure_error(item_id: str, failure: ItemFailure, *, attempts: int = 1) -> ItemError:
    """The exception a caller receives for a failure it gives up on, after ``attempts``
    requests (``item_id``: its id in the last one).

    ``DUPLICATE`` maps to :class:`~coalesce.InvalidOutputError`: the caller's output
    exists but cannot be trusted.
    """
    classes: dict[FailureKind, type[ItemError]] = {
        FailureKind.MISSING: MissingOutputError,
        FailureKind.INVALID: InvalidOutputError,
        FailureKind.DUPLICATE: InvalidOutputError,
        FailureKind.TRUNCATED: TruncatedOutputError,
    }
    return classes[failure.kind](
        give_up_message(failure, attempts), item_id=item_id, raw=failure.raw, attempts=attempts
    )


def give_up_message(failure: ItemFailure, attempts: int) -> str:
    """What the caller is told: what went wrong, the start of the reply, the attempts.

    For example ``the reply had no result for this call (the reply began: 'Sorry, I
    cannot...'); gave up after 4 attempts``.
    """
    message = failure.error
    if failure.reply is not None:
        head = failure.reply[:REPLY_EXCERPT]
        shown = repr(head) + ("..." if len(failure.reply) > REPLY_EXCERPT else "")
        message += f" (the reply began: {shown})" if head.strip() else " (the reply was empty)"
    plural = "" if attempts == 1 else "s"
    return f"{message}; gave up after {attempts} attempt{plural}"


def ordered_unique(values: Sequence[str]) -> tuple[str, ...]:
    """The values without repeats, in first-seen order."""
    return tuple(dict.fromkeys(values))
