"""Permutation voting (``vote=True``): every packed group is asked in two orders.

A packed answer can depend on where its item sits in the prompt: small models answer
items late in a group worse, and sometimes copy a neighbour's answer (see
``docs/accuracy.md``). With ``vote=True``, each packed group is sent twice at once,
the second request writing the same items in the reverse order. An item whose two
answers agree gets that answer; one whose answers differ is asked alone, as a plain
call, and gets that answer. The answers are held until both replies are in, so a
voting function's callers do not get their answer while the reply streams.

The decisions are pure (:func:`agreed`, :func:`settled`); the engine sends the
requests (``Engine._voted``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MISSING", "agreed", "settled"]

#: The outcome of an item a reply never decided (not expected: ``run_group`` gives
#: every call an outcome).
MISSING: Any = object()


def _answered(outcome: Any) -> bool:
    return outcome is not MISSING and not isinstance(outcome, BaseException)


def agreed(first: Any, second: Any, agree: Callable[[Any, Any], bool] | None) -> bool | None:
    """Whether the two orders' outcomes of one item agree.

    Returns:
        ``True`` or ``False`` when both are answers; ``None`` when either is an error
        (the request that failed already asked it alone: there is nothing to settle).
    """
    if not (_answered(first) and _answered(second)):
        return None
    return bool(first == second if agree is None else agree(first, second))


def settled(first: Any, second: Any, alone: Any = MISSING) -> Any:
    """The outcome to give the caller.

    Args:
        first: The outcome from the usual order.
        second: The outcome from the reverse order.
        alone: The plain call's outcome, where the two disagreed and one was made.

    The plain call's answer when there is one; otherwise the usual order's answer, or
    the reverse order's when the usual one failed; when both failed, the usual
    order's error.
    """
    for outcome in (alone, first, second):
        if _answered(outcome):
            return outcome
    return first
