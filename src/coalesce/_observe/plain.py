"""Why calls went out as plain calls: the statistics part ``plain_calls``.

A user who sees "saved 0%" needs to know why calls were sent plain (their item alone).
:class:`PlainListener`, a listener of the group runner, reads each first request that
carries one item, with what the dispatch listener noted of its group, and counts its
calls in :class:`PlainCounts` by reason (the reasons are those of
:attr:`~coalesce.PromptStatistics.plain_calls`). Only first asks are counted: re-asks,
shadow calls and the vote's requests are counted in ``reasks``, ``shadow_requests``
and ``vote_requests``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .._calls import Job, NoObserver
from .dispatch import DispatchListener

__all__ = ["PLAIN_REASONS", "PlainCounts", "PlainListener"]

#: The reasons, in the order the statistics show them.
PLAIN_REASONS = ("alone", "below_paying", "cold", "screened", "pinned")


class PlainCounts:
    """The statistics part ``plain_calls``: calls sent plain, by reason (shared by the
    engines of one recorder)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def statistics(self) -> Mapping[str, Any]:
        """The field, its reasons in :data:`PLAIN_REASONS` order, unused ones left out."""
        ordered = {reason: self.counts[reason] for reason in PLAIN_REASONS if self.counts[reason]}
        return {"plain_calls": MappingProxyType(ordered)}

    def __repr__(self) -> str:
        return f"<PlainCounts {dict(self.counts)}>"


class PlainListener(NoObserver):
    """Counts the calls of one engine sent plain, by reason (see the module doc).

    Args:
        counts: Where they are counted.
        dispatch: What was noted of each call's group as it left its window.
        paying: The smallest group that pays for its packing now (``math.inf``: none).
    """

    def __init__(
        self, counts: PlainCounts, dispatch: DispatchListener, paying: Callable[[], float]
    ) -> None:
        self.counts, self.dispatch, self.paying = counts, dispatch, paying

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """A first request of one item: count its calls."""
        if reask or len(slots) != 1:
            return
        for jobs in slots.values():
            for job in jobs:
                self.counts.counts[self.reason(job)] += 1

    def reason(self, job: Job) -> str:
        """Why ``job`` was sent plain."""
        noted = self.dispatch.of(job)
        if job.alone:
            return "screened"
        if noted is not None and (noted.reason == "probe" or (noted.cold and noted.size > 1)):
            return "cold"
        if math.isinf(self.paying()):
            return "pinned"
        if noted is None or noted.size < 2:
            return "alone"
        return "below_paying"
