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
alone, for less. Whether voting pays turns on the answers' size (each is paid twice) and
on the margin between a packed request and plain calls, so both are learned from the
provider's token counts (:class:`VoteCosts`) rather than taken from the estimates the
function starts with. The decisions are pure (:func:`agreed`, :func:`settled`,
:func:`disagreement`); the engine sends the requests (``Engine._voted``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._batching.quantile import WindowQuantile
from .._calls import NoObserver, RequestReport
from .._observe.agreement import wilson_interval
from .._planning.footprint import Footprint
from .._planning.output import OutputTokenTracker

__all__ = ["MISSING", "VoteCosts", "agreed", "disagreement", "settled"]

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


class VoteCosts(NoObserver):
    """What the vote's cost check learns from the replies the provider counted (a
    ``GroupObserver`` of the function's requests, both orders and plain calls).

    coalesce prices a request from its own token estimates (tiktoken, the prompt's
    parts). Whether voting pays turns on the margin between a packed request and the
    plain calls it replaces, and on the answers' size (each is paid twice), so both
    are taken from the provider's counts once it has reported them:

    - **the answers' size:** each reply's output tokens per call it carried (the packed
      reply's per-item frame included); the prior (declared or estimated) until
      ``min_replies`` replies reported usage;
    - **what each request costs beyond the estimate**, for plain calls and for packed
      requests apart (the chat template a provider wraps every request in, and where its
      tokenizer counts differently): the median of the reported prompt tokens less the
      estimate. A kind not seen yet takes the other kind's; neither seen, nothing.

    Medians of recent replies, so a few odd ones do not swing the decision and a change
    is followed.

    Args:
        prior: Output tokens per answer to assume before the replies say.
        footprint: The function's token footprint (its estimates).
        count: The estimator's token count of an item's input text.
        min_replies: Replies needed before a prior is dropped.
    """

    def __init__(
        self, prior: int, footprint: Footprint, count: Callable[[str], int], min_replies: int = 3
    ) -> None:
        self._answers = OutputTokenTracker(prior, quantile=0.5, window=50, min_samples=min_replies)
        self._footprint, self._count, self._min = footprint, count, min_replies
        self._beyond = {True: WindowQuantile(50), False: WindowQuantile(50)}  # by plain

    def answer_tokens(self) -> int:
        """Output tokens per answer to count on."""
        return self._answers.expected()

    def overheads(self) -> tuple[float, float]:
        """Prompt tokens a plain call and a packed request cost beyond the estimate."""
        plain, packed = (self._median(kind) for kind in (True, False))
        return (
            plain if plain is not None else packed or 0.0,
            packed if packed is not None else plain or 0.0,
        )

    def _median(self, plain: bool) -> float | None:
        seen = self._beyond[plain]
        return seen.quantile(0.5) if len(seen) >= self._min else None

    def estimate(self, keys: Sequence[str]) -> int:
        """The estimated prompt tokens of a request asking these items' inputs."""
        footprint, items = self._footprint, sum(self._count(key) for key in keys)
        if len(keys) == 1:
            return footprint.plain_shared + items
        return footprint.shared + len(keys) * footprint.item_frame + items

    def request_done(self, report: RequestReport) -> None:
        """Learn from a reply whose usage the provider reported."""
        completion = report.completion
        if completion is None or completion.usage is None or not report.slots:
            return
        usage = completion.usage
        self._answers.observe(round(usage.output_tokens / len(report.slots)))
        if report.plain or report.items > 1:  # (a packed request of one item is neither)
            keys = [jobs[0].key for jobs in report.slots.values()]
            self._beyond[report.plain].add(usage.input_tokens - self.estimate(keys))
