"""After a reply: who gets a value, who gets an error, who is asked again. Pure.

:func:`settle` is the one re-ask rule, a function of the outcomes, how many requests
carried each item, and the time left; the group runner applies what it decides.
Tested by hand, like tenacity's strategies, with no event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .._exceptions import ItemError
from .._wire.outcomes import FailureKind, ItemFailure, failure_error

__all__ = ["Settlement", "give_up_error", "settle"]


class Settlement(NamedTuple):
    """What to do with each id of one reply.

    Attributes:
        values: Ids whose callers get their validated output now.
        give_up: Ids whose callers get an error now, with the failure that ended them.
        reask: Ids to carry in a new request, in the order given.
    """

    values: Mapping[str, Any]
    give_up: Mapping[str, ItemFailure]
    reask: tuple[str, ...]


def settle(
    outcomes: Mapping[str, Any],
    attempts: Mapping[str, int],
    *,
    max_attempts: int,
    took: float,
    time_left: float,
    may_reask: Callable[[Sequence[str]], bool] | None = None,
) -> Settlement:
    """Decide, for every id of a reply, between its value, an error and a re-ask.

    A failed item is asked again while it has attempts left and a request like the
    one that failed it (``took`` seconds) still fits in ``time_left``; otherwise its
    caller gets the error. ``may_reask`` (the token quota) may refuse the whole re-ask,
    which then gives every one of them up.

    Args:
        outcomes: Per id, a validated output or an :class:`ItemFailure`.
        attempts: Requests that have carried each id, this one included.
        max_attempts: Requests allowed per item (1: never ask again).
        took: Seconds the request that answered took.
        time_left: Seconds until the most urgent caller's budget runs out.
        may_reask: Whether a re-ask of these ids may be sent (default: yes).
    """
    values = {i: o for i, o in outcomes.items() if not isinstance(o, ItemFailure)}
    failures = {i: o for i, o in outcomes.items() if isinstance(o, ItemFailure)}
    fits = took <= time_left
    reask = tuple(i for i, _ in failures.items() if attempts[i] < max_attempts and fits)
    if reask and may_reask is not None and not may_reask(reask):
        reask = ()  # tokens are the binding quota and this re-ask could not be on time
    give_up = {i: f for i, f in failures.items() if i not in reask}
    return Settlement(values, give_up, reask)


def give_up_error(
    item_id: str, failure: ItemFailure, attempts: int, max_attempts: int
) -> ItemError:
    """The error a caller gets for ``failure`` after ``attempts`` requests."""
    error = failure_error(item_id, failure, attempts=attempts)
    if failure.kind is FailureKind.INVALID and max_attempts > attempts:
        error.args = (f"{error.args[0]}; no time left in the latency budget to ask again",)
    return error
