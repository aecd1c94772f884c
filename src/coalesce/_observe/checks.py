"""The bookkeeping of the requests that check answers: the shadow's and the vote's.

A :class:`CheckCounts` counts the plain calls made to check packed answers
(``shadow=``) and the requests of ``vote=True``, with their dollars, and adds up the
shadow guards' verdicts. It is a statistics part (see
:class:`~coalesce._observe.recorder.StatisticsPart`): what it counts reaches
:class:`~coalesce.PromptStatistics` through :meth:`CheckCounts.statistics`, so it
can live with the accuracy code that writes to it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .._accuracy.shadow import Agreement, ShadowGuard, wilson_interval
from .._accuracy.vote import disagreement

__all__ = ["CheckCounts", "merged_agreement"]


def merged_agreement(guards: Sequence[ShadowGuard]) -> dict[int, Agreement]:
    """Every guard's verdicts per group size, added up (one guard: its own)."""
    if len(guards) == 1:
        return guards[0].agreement()
    counts: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    for guard in guards:
        for size, agreement in guard.agreement().items():
            counts[size] += agreement.agreed
            totals[size] += agreement.total
    return {
        size: Agreement(counts[size], total, *wilson_interval(counts[size], total))
        for size, total in sorted(totals.items())
    }


class CheckCounts:
    """Counts of the shadow's and the vote's requests, and the shadow guards' verdicts.

    Args:
        priced: Whether the model has a price (else the dollar fields are NaN).
    """

    def __init__(self, priced: bool) -> None:
        self.priced = priced
        self.shadow_requests, self.shadow_cost = 0, 0.0
        self.vote_requests, self.vote_cost = 0, 0.0
        self.votes_settled = self.votes_unsettled = self.voted_items = 0
        #: The guards of the engines that shadow (``wrap`` makes one engine per kind
        #: of call, all recording into its model's recorder).
        self.guards: list[ShadowGuard] = []

    def watch(self, guard: ShadowGuard) -> None:
        """Report ``guard``'s agreement and cap with these counts."""
        self.guards.append(guard)

    def extra_done(self, kind: str, spent: float) -> None:
        """Count a request made to check (``kind="shadow"``) or settle (``"vote"``)
        answers, and its dollars (NaN: unknown)."""
        known = 0.0 if math.isnan(spent) else spent
        if kind == "vote":
            self.vote_requests += 1
            self.vote_cost += known
        else:
            self.shadow_requests += 1
            self.shadow_cost += known

    def voted(self, items: int) -> None:
        """Count a group of ``items`` asked in two orders."""
        self.voted_items += items

    def vote_disagreement(self) -> float:
        """The share of voted items whose two answers differed so far (see
        :func:`coalesce._accuracy.vote.disagreement`)."""
        return disagreement(self.votes_settled + self.votes_unsettled, self.voted_items)

    def vote_settled(self, asked: bool) -> None:
        """Count an item whose two orders' answers differed; ``asked``: a plain call
        settled it (else its budget left no time, and the usual order's answer stood)."""
        if asked:
            self.votes_settled += 1
        else:
            self.votes_unsettled += 1

    def statistics(self) -> Mapping[str, Any]:
        """The counts as :class:`~coalesce.PromptStatistics` fields; ``group_cap`` only
        when a guard is watched (the lowest of their caps)."""
        fields: dict[str, Any] = {
            "shadow_requests": self.shadow_requests,
            "shadow_cost": self.shadow_cost if self.priced else math.nan,
            "agreement_by_size": MappingProxyType(merged_agreement(self.guards)),
            "vote_requests": self.vote_requests,
            "vote_cost": self.vote_cost if self.priced else math.nan,
            "votes_settled": self.votes_settled,
            "votes_unsettled": self.votes_unsettled,
        }
        if self.guards:
            fields["group_cap"] = min(guard.cap for guard in self.guards)
        return fields

    def __repr__(self) -> str:
        return (
            f"<CheckCounts shadow={self.shadow_requests} vote={self.vote_requests}"
            f" settled={self.votes_settled} unsettled={self.votes_unsettled}>"
        )
