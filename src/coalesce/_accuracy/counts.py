"""The statistics of accuracy: the shadow guard's and the vote's requests, their
dollars, the guards' verdicts and the group cap.

One :class:`AccuracyCounts` per recorder (``wrap``'s kinds of call, and a function's
flex lane, share their model's recorder, so they share these counts): it is a
statistics part (:meth:`~coalesce._observe.recorder.PromptRecorder.part`), so what it
counts reaches :class:`~coalesce.PromptStatistics` without the recorder knowing of
accuracy. Decisions read it here (the vote's disagreement rate), never the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from .._observe.agreement import merged_agreement
from .shadow import CapLearning, ShadowGuard
from .vote import disagreement

__all__ = ["AccuracyCounts"]


class AccuracyCounts:
    """Counts of the shadow's and the vote's requests, and the shadow guards' verdicts.

    Args:
        max_items: The functions' ``max_items``: the group cap without a guard.
        priced: Whether the model has a price (else the dollar fields are NaN).
    """

    def __init__(self, max_items: int, *, priced: bool) -> None:
        self.max_items, self.priced = max_items, priced
        self.shadow_requests, self.shadow_cost, self.shadow_input_tokens = 0, 0.0, 0
        self.vote_requests, self.vote_cost = 0, 0.0
        self.votes_settled = self.votes_unsettled = self.voted_items = 0
        #: The guards of the engines that shadow, one per kind of call under ``wrap``.
        self.guards: list[ShadowGuard] = []

    def watch(self, guard: ShadowGuard) -> None:
        """Report ``guard``'s agreement and cap with these counts."""
        self.guards.append(guard)

    def spent(self, kind: Literal["shadow", "vote"], dollars: float, input_tokens: int = 0) -> None:
        """Count a request made to check (``"shadow"``) or settle (``"vote"``) answers,
        its dollars (NaN: unknown) and its prompt tokens."""
        known = 0.0 if math.isnan(dollars) else dollars
        if kind == "vote":
            self.vote_requests += 1
            self.vote_cost += known
        else:
            self.shadow_requests += 1
            self.shadow_cost += known
            self.shadow_input_tokens += input_tokens

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

    def learning(self) -> CapLearning | None:
        """How the cap was learned: the guard with the lowest cap's account (``None``
        without a guard)."""
        guards = sorted(self.guards, key=lambda guard: guard.cap)
        return guards[0].learning() if guards else None

    def statistics(self) -> Mapping[str, Any]:
        """The counts as :class:`~coalesce.PromptStatistics` fields; ``group_cap`` is the
        lowest of the guards' caps, or ``max_items`` without a guard."""
        return {
            "cap_learning": self.learning(),
            "shadow_requests": self.shadow_requests,
            "shadow_cost": self.shadow_cost if self.priced else math.nan,
            "shadow_input_tokens": self.shadow_input_tokens,
            "agreement_by_size": MappingProxyType(
                merged_agreement(guard.agreement() for guard in self.guards)
            ),
            "group_cap": min((guard.cap for guard in self.guards), default=self.max_items),
            "vote_requests": self.vote_requests,
            "vote_cost": self.vote_cost if self.priced else math.nan,
            "votes_settled": self.votes_settled,
            "votes_unsettled": self.votes_unsettled,
        }

    def __repr__(self) -> str:
        return (
            f"<AccuracyCounts shadow={self.shadow_requests} vote={self.vote_requests}"
            f" settled={self.votes_settled} unsettled={self.votes_unsettled}>"
        )
