"""The exceptions coalesce raises, under one root.

::

    CoalesceError
    ├── ConfigurationError (ValueError)   an option or argument is out of range
    │   └── UnknownOptionError (TypeError) ... a keyword that names no option
    ├── BatcherClosedError (RuntimeError) the batcher was closed; no new calls
    ├── QueueFull                         a non-waiting submit found the queue full
    ├── BatchError                        the batch function broke its contract
    │   └── ResultCountError              ... returned the wrong number of results
    ├── InvalidInputError (ValueError)    one call's item cannot be sent (refused alone)
    ├── RequestTimeoutError (TimeoutError) no answer by the caller's deadline or timeout
    └── ItemError                         one item's own answer could not be obtained
        ├── MissingOutputError            ... the reply had no output for its id
        ├── InvalidOutputError            ... its output failed validation
        └── TruncatedOutputError          ... the reply was cut off before it

    CoalesceWarning (UserWarning)         something degraded but still works

A provider's own exception (for example ``openai.RateLimitError``) is never wrapped:
it reaches every caller of the request it broke unchanged. "You closed it"
(:class:`BatcherClosedError`) is different from "it broke" (:class:`BatchError`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BatchError",
    "BatcherClosedError",
    "CoalesceError",
    "CoalesceWarning",
    "ConfigurationError",
    "InvalidInputError",
    "InvalidOutputError",
    "ItemError",
    "MissingOutputError",
    "QueueFull",
    "RequestTimeoutError",
    "ResultCountError",
    "TruncatedOutputError",
    "UnknownOptionError",
]


class CoalesceError(Exception):
    """Base class of every exception coalesce raises itself."""


class ConfigurationError(CoalesceError, ValueError):
    """An option or argument is invalid; the message names it and the allowed range."""


class UnknownOptionError(ConfigurationError, TypeError):
    """A keyword no option of that entry point has (``max_item=8``); the message names
    the closest option. A ``TypeError`` too, as Python's own for an unexpected keyword."""


class BatcherClosedError(CoalesceError, RuntimeError):
    """A call was made after the batcher was closed with ``aclose()``."""


class QueueFull(CoalesceError):
    """``submit_nowait()`` found ``max_pending`` items already waiting."""


class BatchError(CoalesceError):
    """The batch function broke its contract; every caller of that batch gets this."""


class ResultCountError(BatchError):
    """The batch function returned a result list of the wrong length.

    Attributes:
        expected: Number of items in the batch.
        received: Number of results returned.
    """

    def __init__(self, expected: int, received: int) -> None:
        self.expected = expected
        self.received = received
        super().__init__(
            f"the batch function returned {received} results for a batch of {expected} items;"
            f" it must return exactly one result per item, in the same order"
        )


class InvalidInputError(CoalesceError, ValueError):
    """One call's item cannot be sent; only that call fails, at once, before it is grouped.

    Raised for an item that is not JSON (NaN, infinity, a lone surrogate, bytes, an
    arbitrary object) or too large for the model's context window together with the
    instructions and its expected output. Its neighbours are unaffected.

    Attributes:
        field: Where in the item the problem is (``"$"`` for the item itself,
            ``"$.text"`` for a field), or ``None`` when it is about the whole item.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class RequestTimeoutError(CoalesceError, TimeoutError):
    """No answer reached the caller by its deadline (latency budget) or ``timeout``.

    The request may still be running for other callers; this caller is freed.

    Attributes:
        seconds: How long the caller waited.
    """

    def __init__(self, message: str, *, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(message)


class ItemError(CoalesceError):
    """One item's answer could not be obtained after every allowed attempt.

    Only the caller of that item receives it; its neighbours in the same prompt are
    unaffected.

    Attributes:
        item_id: The item's id in the last request that carried it.
        raw: The raw output the model gave for this item (``None`` if it gave none).
        attempts: How many requests carried this item.
    """

    def __init__(self, message: str, *, item_id: str, raw: Any = None, attempts: int = 1) -> None:
        self.item_id = item_id
        self.raw = raw
        self.attempts = attempts
        super().__init__(message)


class MissingOutputError(ItemError):
    """The reply carried no output for this item's id."""


class InvalidOutputError(ItemError):
    """The reply carried an output for this item that failed validation."""


class TruncatedOutputError(ItemError):
    """The reply was cut off (``finish_reason: length``) before this item's output."""


class CoalesceWarning(UserWarning):
    """Something degraded but still works (for example, an offline token estimate)."""
