"""Learning paid for by what packing saves (issue 35, item 2): the learning budget on
its own (pure), then the shadow guard spending from it, by hand, without an event loop."""

from __future__ import annotations

import pytest

from coalesce._accuracy.learning import LEARNING_SHARE, LearningBudget, verdicts_to_rise
from coalesce._accuracy.shadow import ShadowGuard

PRICE = 100.0  # one shadow call, in input-token equivalents
STEP = verdicts_to_rise(0.9)  # 25: the least a step of the cap costs


def test_the_budget_spends_a_share_of_the_savings_and_reserves_a_whole_step() -> None:
    budget = LearningBudget()
    assert not budget.affords(PRICE)  # nothing saved: nothing to spend
    budget.earn(2 * PRICE / LEARNING_SHARE)
    assert budget.affords(PRICE, 2)
    assert not budget.affords(PRICE, 3)  # a step is begun only once all of it is paid
    budget.spend(PRICE)
    assert budget.affords(PRICE)
    assert not budget.affords(PRICE, 2)
    assert budget.left() == pytest.approx(PRICE)
    budget.earn(float("nan"))  # an unknown saving adds nothing
    assert budget.left() == pytest.approx(PRICE)


def learning_guard(rate: float = 0.0, **options: object) -> ShadowGuard:
    return ShadowGuard(rate, 0.9, 32, learn=True, start=4, budget=LearningBudget(), **options)  # type: ignore[arg-type]


def feed(guard: ShadowGuard, items: int, saved_per_item: float) -> int:
    """``items`` packed items in full groups at the cap, each saving
    ``saved_per_item``, every shadowed one agreeing; how many were shadowed."""
    shadowed = 0
    for n in range(items):
        size = guard.cap
        guard.earn(saved_per_item)
        position = 1 + n % size
        if guard.wants(size, position, PRICE):
            shadowed += 1
            guard.record(size, "a", "a", position)
    return shadowed


def test_learning_waits_until_half_the_savings_pay_for_a_whole_step() -> None:
    guard = learning_guard()
    # Each packed item saves a fifth of a shadow call: a step (25 calls) is paid for by
    # half the savings of 250 items; before that, learning shadows nothing.
    assert STEP == 25
    assert feed(guard, 10 * STEP - 10, PRICE / 5) == 0
    assert guard.learning_requests == 0
    assert guard.cap == 4
    feed(guard, 2000, PRICE / 5)
    assert guard.learning_requests > 0
    assert guard.cap > 4  # learning happened, paid for
    budget = guard.budget
    assert budget is not None
    assert budget.spent <= LEARNING_SHARE * budget.saved
    assert budget.spent == pytest.approx(guard.learning_requests * PRICE)


def test_without_savings_nothing_is_learned_and_the_cap_holds() -> None:
    guard = learning_guard()
    assert feed(guard, 5000, 0.0) == 0
    assert guard.cap == 4
    assert guard.learning_requests == 0


def test_the_default_rate_is_spent_from_the_budget_a_given_rate_is_kept() -> None:
    owed = learning_guard(0.05, rate_budgeted=True)
    assert feed(owed, 100, 0.0) == 0  # nothing saved: the default rate waits
    kept = learning_guard(0.05)
    assert feed(kept, 100, 0.0) == 5  # a rate the user gave is exact


def test_the_starting_cap_rises_to_the_paying_size_until_evidence_moves_it() -> None:
    guard = learning_guard()
    guard.at_least(6)  # a prompt cache found: packing now pays from 6
    assert guard.cap == 6
    guard.at_least(64)  # beyond the learning's ceiling: left alone
    assert guard.cap == 6
    guard.moves.append((6, 3, "disagreed"))
    guard.cap = 3
    guard.at_least(6)  # evidence brought it down: it stays
    assert guard.cap == 3


def test_after_a_fall_the_lowered_cap_is_checked_without_waiting_for_savings() -> None:
    # Packed answers go wrong past position 2: the cap falls from 4. The checks of the
    # lowered cap's tail are the guard's, not learning's investment in a rise: with no
    # savings left to spend, they are still made (and counted as spent).
    guard = learning_guard()
    guard.earn(100 * PRICE)  # enough for the first step
    for n in range(400):
        position = 1 + n % 4
        if guard.cap == 4 and guard.wants(4, position, PRICE):
            guard.record(4, "a", "a" if position <= 2 else "b", position)
    assert guard.cap < 4
    assert guard.budget is not None
    guard.budget.spent = guard.budget.share * guard.budget.saved  # nothing left to spend
    before = guard.learning_requests
    cap = guard.cap
    checked = sum(guard.wants(cap, 1 + n % cap, PRICE) for n in range(400))
    assert checked > 0
    assert guard.learning_requests > before
    assert guard.budget.left() < 0  # spent past the share: the alarm bought its checks


def test_without_a_fall_an_exhausted_budget_stops_learning() -> None:
    guard = learning_guard()
    guard.earn(100 * PRICE)
    feed(guard, 2000, 0.0)  # every verdict agrees: the cap only rises
    assert guard.budget is not None
    guard.budget.spent = guard.budget.share * guard.budget.saved
    before = guard.learning_requests
    cap = guard.cap
    assert sum(guard.wants(cap, 1 + n % cap, PRICE) for n in range(400)) == 0
    assert guard.learning_requests == before
