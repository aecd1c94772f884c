"""What the batch APIs check on create, and how they page their lists: pure functions.

The endpoints (``_batch_routes``, ``_message_batch_routes``) turn what these return
into each API's own answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from ._context import ContextWindows, window_for
from ._http import HttpError

__all__ = [
    "OverLimit",
    "check_metadata",
    "duplicates",
    "invalid_anthropic_ids",
    "over_limit",
    "page",
    "page_body",
    "page_size",
]

_T = TypeVar("_T")

#: Anthropic's rule for a ``custom_id``.
_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class OverLimit(NamedTuple):
    """A batch that the enqueued-token limit refuses.

    Attributes:
        model: The model whose limit it exceeds.
        enqueued: Tokens of that model already in unfinished batches.
        tokens: Tokens of that model in the new batch.
        limit: The limit.
    """

    model: str
    enqueued: int
    tokens: int
    limit: int


def over_limit(
    limits: ContextWindows, tokens: Mapping[str, int], enqueued: Callable[[str], int]
) -> OverLimit | None:
    """Return why a new batch of ``tokens`` (prompt tokens per model) exceeds the
    enqueued-token ``limits`` (one for every model, one per model, or ``None``), given
    the tokens ``enqueued`` of a model, or ``None`` if it fits."""
    for model, count in sorted(tokens.items()):
        limit = window_for(limits, model)
        if limit is not None and enqueued(model) + count > limit:
            return OverLimit(model, enqueued(model), count, limit)
    return None


def duplicates(custom_ids: Sequence[str]) -> list[int]:
    """Return the indexes of the lines whose ``custom_id`` an earlier line already has."""
    seen: set[str] = set()
    repeated = []
    for index, custom_id in enumerate(custom_ids):
        if custom_id in seen:
            repeated.append(index)
        seen.add(custom_id)
    return repeated


def invalid_anthropic_ids(custom_ids: Sequence[str]) -> list[str]:
    """Return the custom ids Anthropic refuses (1 to 64 of ``a-zA-Z0-9_-``)."""
    return [custom_id for custom_id in custom_ids if not _ANTHROPIC_ID.fullmatch(custom_id)]


def check_metadata(value: Any) -> str | None:
    """Return what is wrong with OpenAI ``metadata``, or ``None`` if it is valid: at most
    16 pairs; keys are strings of at most 64 characters, values strings of at most 512."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return f"metadata must be an object of strings, got {value!r}"
    if len(value) > 16:
        return f"metadata holds at most 16 pairs, got {len(value)}"
    for key, item in value.items():
        if not isinstance(key, str) or len(key) > 64:
            return f"metadata keys are strings of at most 64 characters, got {key!r}"
        if not isinstance(item, str) or len(item) > 512:
            return f"metadata values are strings of at most 512 characters; {key!r} is not"
    return None


def page_size(query: Mapping[str, str], maximum: int) -> int:
    """Return the ``limit`` of a list request's ``query`` (default 20).

    Raises:
        HttpError: ``limit`` is not an integer from 1 to ``maximum``.
    """
    text = query.get("limit", "20")
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise HttpError(400, f"limit must be an integer from 1 to {maximum}, got {text!r}")
    return int(text)


def page(
    items: Sequence[_T],
    ids: Sequence[str],
    limit: int,
    *,
    after: str | None = None,
    before: str | None = None,
) -> tuple[Sequence[_T], bool]:
    """Return one page of ``limit`` ``items`` (newest first, with their ``ids``) and
    whether more follow: those right ``after`` one id (older), or right ``before`` one
    (newer).

    Raises:
        HttpError: A cursor names no item of the list.
    """
    cursor = after if after is not None else before
    if cursor is None:
        return items[:limit], len(items) > limit
    if cursor not in ids:
        raise HttpError(400, f"the cursor {cursor!r} names no batch of this list")
    index = list(ids).index(cursor)
    if after is not None:
        return items[index + 1 : index + 1 + limit], index + 1 + limit < len(items)
    start = max(0, index - limit)
    return items[start:index], start > 0


def page_body(data: Sequence[Mapping[str, Any]], more: bool) -> dict[str, Any]:
    """Return the fields both APIs give a page of a list: the objects (each with an
    ``id``), whether ``more`` follow, and the first and last ids (``None`` on an empty
    page)."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"data": list(data), "has_more": more, "first_id": first, "last_id": last}
