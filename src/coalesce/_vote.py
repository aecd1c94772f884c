"""Permutation voting (``vote=True``): every packed group is asked in two orders.

A packed answer can depend on where its item sits in the prompt: small models answer
items late in a group worse, and sometimes copy a neighbour's answer (see
``docs/accuracy.md``). With ``vote=True``, each packed group is sent twice at once,
the second request writing the same items in the reverse order. An item whose two
answers agree gets that answer; one whose answers differ is asked alone, as a plain
call, and gets that answer. The answers are held until both replies are in, so a
voting function's callers do not get their answer while the reply streams.

Voting is only done where it costs less than plain calls: two packed requests, and
a plain call for each item the orders disagree on, at the rate seen so far
(:func:`disagreement`, the low end of its interval; see :func:`coalesce._planning.cost.voting_pays`); otherwise
the group is asked as plain calls, which answer each item as it would be answered
alone, for less. Whether voting pays turns on the answers' size (each is paid twice),
so it is learned from the provider's replies (:class:`AnswerSizes`) rather than taken
from the estimate the function starts with. The decisions are pure (:func:`agreed`, :func:`settled`,
:func:`disagreement`); the engine sends the requests (``Engine._voted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._planning.tokens import OutputTokenTracker
from ._report import Job, RequestReport, Retry
from ._shadow import wilson_interval

__all__ = ["MISSING", "AnswerSizes", "agreed", "disagreement", "settled"]

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


def disagreement(differed: int, voted: int) -> float:
    """How often the two orders' answers differ, as far as voting is concerned: the
    lower end of the 95% interval of ``differed / voted`` (0 before any vote).

    Voting stops once it does not pay at this rate (see
    :func:`coalesce._planning.cost.voting_pays`), and a function that stopped voting
    learns nothing more about its disagreements: so it stops only when the rate is
    confidently too high, not on one unlucky group.
    """
    return wilson_interval(differed, voted)[0] if voted else 0.0


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


class AnswerSizes:
    """The output tokens one answer takes, learned from the replies the provider
    counted (a ``GroupObserver`` of the function's own requests).

    Each reply gives one observation: its output tokens per call it carried, the
    packed reply's per-item frame included. Until ``min_replies`` replies reported
    their usage, :meth:`expected` is ``prior`` (the declared or estimated size);
    then the median of the recent replies, so a few long answers do not swing the
    decision and a change in answer size is followed.

    Args:
        prior: Output tokens per answer to assume before the replies say.
        min_replies: Replies needed before the prior is dropped.
    """

    def __init__(self, prior: int, min_replies: int = 3) -> None:
        self._tracker = OutputTokenTracker(prior, quantile=0.5, window=50, min_samples=min_replies)

    def expected(self) -> int:
        """Output tokens per answer to count on."""
        return self._tracker.expected()

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """Nothing to learn before the reply."""

    def request_done(self, report: RequestReport) -> None:
        """Learn from a reply whose usage the provider reported."""
        completion = report.completion
        if completion is None or completion.usage is None or not report.slots:
            return
        self._tracker.observe(round(completion.usage.output_tokens / len(report.slots)))

    def retrying(self, retry: Retry) -> None:
        """Nothing to learn from a retry."""

    def group_done(self, jobs: Sequence[Job]) -> None:
        """Nothing to learn when a group is done."""
