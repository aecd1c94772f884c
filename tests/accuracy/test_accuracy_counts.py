"""The accuracy counts: the shadow's and the vote's requests, the guards' verdicts and
the group cap, as a statistics part of the recorder (hand-fed, no event loop)."""

from __future__ import annotations

import math

import pytest

from coalesce._accuracy.counts import AccuracyCounts
from coalesce._accuracy.shadow import ShadowGuard
from coalesce._accuracy.vote import disagreement
from coalesce._observe.agreement import Agreement, wilson_interval
from coalesce._observe.recorder import PromptRecorder
from coalesce._pricing import Price
from coalesce.providers import Usage

ROUND = Price(1.0, 10.0)  # $ per million tokens


def recorder(prices: Price | None = None) -> PromptRecorder:
    return PromptRecorder("f", "no-such-model", prices=prices, telemetry=False)


def counts_of(rec: PromptRecorder, max_items: int = 16) -> AccuracyCounts:
    priced = rec.price is not None
    return rec.part(AccuracyCounts, lambda: AccuracyCounts(max_items, priced=priced))


def guard(cap: int, verdicts: dict[int, tuple[int, int]]) -> ShadowGuard:
    """A guard of max_items 16 whose verdicts are ``size: (agreed, total)``."""
    made = ShadowGuard(0.5, 0.9, 16, min_samples=10**6)  # never moves the cap itself
    made.cap = cap
    for size, (agreed, total) in verdicts.items():
        for index in range(total):
            made.record(size, index < agreed, True)
    return made


def test_guards_verdicts_add_up_and_the_lowest_cap_stands() -> None:
    rec = recorder()
    counts = counts_of(rec)
    assert rec.snapshot().group_cap == 16  # no guard: max_items
    counts.watch(guard(8, {4: (3, 4), 8: (1, 2)}))
    assert rec.snapshot().agreement_by_size == {
        4: Agreement(3, 4, *wilson_interval(3, 4)),
        8: Agreement(1, 2, *wilson_interval(1, 2)),
    }
    counts.watch(guard(4, {4: (5, 6)}))
    stats = rec.snapshot()
    assert stats.group_cap == 4
    assert stats.agreement_by_size == {
        4: Agreement(8, 10, *wilson_interval(8, 10)),
        8: Agreement(1, 2, *wilson_interval(1, 2)),
    }


def test_checking_requests_are_spent_and_counted_apart() -> None:
    rec = recorder(prices=ROUND)
    counts = counts_of(rec)
    counts.spent("shadow", rec.savings.spend(Usage(100, 10)))
    counts.spent("vote", rec.savings.spend(Usage(200, 0)))
    counts.spent("vote", rec.savings.spend(None))
    stats = rec.snapshot()
    assert (stats.shadow_requests, stats.vote_requests) == (1, 2)
    assert stats.shadow_cost == pytest.approx(200e-6)
    assert stats.vote_cost == pytest.approx(200e-6)
    assert stats.estimated_cost == pytest.approx(400e-6)
    assert stats.input_tokens == 300
    assert stats.estimated_cost_one_per_item == 0.0
    unpriced = recorder()
    counts_of(unpriced)
    assert math.isnan(unpriced.snapshot().vote_cost)


def test_vote_disagreement_is_the_votes_own_rule() -> None:
    rec = recorder()
    counts = counts_of(rec)
    assert counts.vote_disagreement() == disagreement(0, 0) == 0.0
    counts.voted(40)
    counts.vote_settled(True)
    counts.vote_settled(False)
    stats = rec.snapshot()
    assert (stats.votes_settled, stats.votes_unsettled) == (1, 1)
    assert counts.vote_disagreement() == disagreement(2, 40)


def test_one_recorder_keeps_one_set_of_counts() -> None:
    rec = recorder()
    assert counts_of(rec) is counts_of(rec, max_items=4)
    assert rec.snapshot().group_cap == 16  # the first engine's max_items
