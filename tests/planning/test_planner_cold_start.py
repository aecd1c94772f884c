"""The cold start: before any reply, a probe goes alone and later calls are held.

Pure decisions (:func:`cold_start`) and the budget policy over hand-built planner state
(:class:`Planning`, no event loop, no clock): the probe, the hold and its end, and how a
reply ends the cold start and sizes the held calls with what it taught.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coalesce._batching.policy import DispatchReason, Due, Hold
from coalesce._planning.latency import LatencyPrior
from coalesce._planning.planner import (
    HOLD_GUARD,
    ColdStart,
    PlanItem,
    PlanLimits,
    Predict,
    cold_start,
    group_tokens,
    latest_start,
)
from coalesce._planning.policy import BudgetPolicy
from coalesce._planning.state import Planning
from coalesce._planning.tokens import CharacterEstimator
from coalesce.providers import Completion, Usage


def linear(overhead: float = 0.5, prefill: float = 0.0, decode: float = 0.02) -> Predict:
    return lambda i, o: overhead + prefill * i + decode * o


# One item alone: 0.5 + 0.02 * (40 + 10) = 1.5 s; two, streamed or not, at least 2.5 s.
PREDICT = linear()
LIMITS = PlanLimits(
    max_items=8, max_wait=0.05, per_item_overhead_tokens=10, per_item_output_overhead_tokens=10
)


def item(deadline: float = 2.0, arrival: float = 0.0, out: int = 40) -> PlanItem:
    return PlanItem(input_tokens=20, output_tokens=out, deadline=deadline, arrival=arrival)


# -- the pure decision ----------------------------------------------------------------


def test_the_first_call_goes_alone_as_a_probe_when_no_pair_fits_but_one_call_leaves_slack() -> None:
    assert latest_start([item(), item()], LIMITS, PREDICT) < 0  # the prior admits no pair
    decision = cold_start(item(), LIMITS, PREDICT, 0.0, probing=False)
    assert decision == ColdStart(probe=True, hold_until=pytest.approx(0.5 - HOLD_GUARD))


def test_while_the_probe_is_out_later_calls_are_held_until_they_could_only_just_leave_alone() -> (
    None
):
    decision = cold_start(item(2.1, arrival=0.1), LIMITS, PREDICT, 0.1, probing=True)
    assert decision == ColdStart(probe=False, hold_until=pytest.approx(2.1 - 1.5 - HOLD_GUARD))


def test_a_budget_the_prior_can_pack_is_planned_as_usual() -> None:
    assert cold_start(item(deadline=5.0), LIMITS, PREDICT, 0.0, probing=False) is None
    assert cold_start(item(deadline=5.0), LIMITS, PREDICT, 0.0, probing=True) is None


@pytest.mark.parametrize("deadline", [1.5, 1.5 + HOLD_GUARD / 2, 1.0])
def test_without_slack_beyond_one_call_nothing_is_held(deadline: float) -> None:
    # Just enough for one call, or not even that (then admit() sends it alone: SOLO).
    assert cold_start(item(deadline), LIMITS, PREDICT, 0.0, probing=False) is None
    assert cold_start(item(deadline), LIMITS, PREDICT, 0.0, probing=True) is None


def test_groups_of_one_and_calls_without_budget_have_no_cold_start() -> None:
    alone = PlanLimits(max_items=1)
    assert cold_start(item(), alone, PREDICT, 0.0, probing=False) is None
    assert cold_start(item(math.inf), LIMITS, PREDICT, 0.0, probing=False) is None


# A typical duration, below the p95. One item alone: 0.6 + 0.01 * (40 + 10) = 1.1 s.
CENTRAL = linear(0.6, decode=0.01)


def test_with_a_typical_duration_the_hold_lasts_until_a_typical_call_could_only_just_leave() -> (
    None
):
    # The p95 says one call takes 1.5 s; typically 1.1 s: hold until 2.0 - 1.1.
    decision = cold_start(item(), LIMITS, PREDICT, 0.0, probing=True, central=CENTRAL)
    assert decision == ColdStart(probe=False, hold_until=pytest.approx(0.9 - HOLD_GUARD))


def test_the_hold_never_passes_the_midpoint_a_probe_replying_then_would_leave_no_room() -> None:
    # A typical 0.3 s would hold until 1.7 s; a reply at 1.7 s would mean calls take 1.7 s.
    decision = cold_start(item(), LIMITS, PREDICT, 0.0, probing=True, central=linear(0.0, 0, 0.005))
    assert decision == ColdStart(probe=False, hold_until=pytest.approx(1.0 - HOLD_GUARD))


def test_a_typical_duration_never_ends_a_hold_earlier_than_the_p95_would() -> None:
    slower = linear(1.0, decode=0.02)  # "typical" above the p95: the p95's hold stands
    decision = cold_start(item(), LIMITS, PREDICT, 0.0, probing=True, central=slower)
    assert decision == ColdStart(probe=False, hold_until=pytest.approx(0.5 - HOLD_GUARD))


@given(
    deadline=st.floats(0.0, 30.0),
    now=st.floats(0.0, 10.0),
    out=st.integers(0, 500),
    overhead=st.floats(0.0, 3.0),
    decode=st.floats(0.0, 0.05),
    share=st.floats(0.1, 1.0),
)
def test_a_typical_hold_ends_by_the_midpoint_and_by_a_typical_calls_last_moment(
    deadline: float, now: float, out: int, overhead: float, decode: float, share: float
) -> None:
    new, predict = item(deadline, arrival=now, out=out), linear(overhead, decode=decode)
    central = linear(overhead * share, decode=decode * share)
    decision = cold_start(new, LIMITS, predict, now, probing=True, central=central)
    if decision is not None:
        by_p95 = new.deadline - predict(*group_tokens([new], LIMITS)) - HOLD_GUARD
        by_typical = new.deadline - central(*group_tokens([new], LIMITS)) - HOLD_GUARD
        midpoint = now + (new.deadline - now) / 2 - HOLD_GUARD
        assert now < decision.hold_until
        assert decision.hold_until == pytest.approx(max(by_p95, min(by_typical, midpoint)))


@given(
    deadline=st.floats(0.0, 30.0),
    now=st.floats(0.0, 10.0),
    out=st.integers(0, 500),
    overhead=st.floats(0.0, 3.0),
    decode=st.floats(0.0, 0.05),
    probing=st.booleans(),
)
def test_a_hold_never_outlasts_the_last_moment_the_call_could_leave_alone(
    deadline: float, now: float, out: int, overhead: float, decode: float, probing: bool
) -> None:
    new, predict = item(deadline, arrival=now, out=out), linear(overhead, decode=decode)
    decision = cold_start(new, LIMITS, predict, now, probing=probing)
    if decision is not None:
        assert decision.probe is not probing
        solo = predict(*group_tokens([new], LIMITS))
        assert now < decision.hold_until <= new.deadline - solo - HOLD_GUARD + 1e-9


# -- the policy over the planner's state ------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A call as planning sees it (:class:`~coalesce._planning.reports.Planned`)."""

    item: Any
    plan: PlanItem | None
    partition: Any = None


@dataclass(frozen=True)
class Reply:
    """One request's report, as planning reads it (:class:`~coalesce._planning.reports.Report`)."""

    completion: Completion | None
    now: float
    items: int = 1
    plain: bool = True
    text: bool = False
    streamed: bool = True
    partition: Any = None
    schema_broken: bool = False
    contradicted: tuple[str, ...] = ()
    error: BaseException | None = None
    error_headers: dict[str, str] | None = None
    slots: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_headers", self.error_headers or {})


def planning(*, guessed_output: bool = True, cold_start: bool = True) -> Planning:
    limits = PlanLimits(max_items=20, max_wait=0.05, shared_tokens=600, streaming=True)
    return Planning(
        limits, 50, LatencyPrior(), CharacterEstimator(), guessed_output=guessed_output,
        cold_start=cold_start,
    )  # fmt: skip


def call(state: Planning, now: float = 0.0, budget: float = 2.0) -> Call:
    return Call("q", state.plan_item("q", None, now + budget, now))


def fast_reply(now: float) -> Reply:
    """A plain call answered in 0.3 s, 0.2 s to its first token, 12 tokens written."""
    usage = Usage(input_tokens=640, output_tokens=12)
    return Reply(Completion("an answer", "stop", usage, ttft=0.2, seconds=0.3), now=now)


def test_a_cold_policy_probes_then_holds_then_plans_with_what_the_probe_taught() -> None:
    state = planning()
    policy = BudgetPolicy(state)
    first, second, third = call(state), call(state), call(state)
    assert policy.before_add([], first, 0.0) is DispatchReason.PROBE
    assert state.probing
    hold = policy.before_add([], second, 0.0)
    assert isinstance(hold, Hold)
    tokens = group_tokens([second.plan], state.limits)  # type: ignore[list-item]
    typical = 2.0 - state.predict_typical(*tokens)  # below the prior's p95
    assert typical > 2.0 - state.predict(*tokens)
    assert hold.until == pytest.approx(min(typical, 1.0) - HOLD_GUARD)
    # The probe's reply ends the cold start; the held calls, offered again, group.
    assert state.warmed is None
    state.request_done(fast_reply(now=0.3))  # type: ignore[arg-type]
    assert not state.cold
    assert not state.probing
    assert state.warmed == 0.3  # the calls made before then were held through it
    state.request_done(fast_reply(now=0.5))  # type: ignore[arg-type]
    assert state.warmed == 0.3
    assert policy.before_add([], second, 0.3) is None
    assert policy.before_add([second], third, 0.3) is None  # a pair fits now
    # They waited past max_wait already: the pair is due at once.
    assert policy.after_add([second, third], 0.3) == Due(0.05, DispatchReason.WINDOW)


def test_held_calls_are_sized_with_the_answer_size_the_first_reply_taught() -> None:
    state = planning()
    held = call(state)
    assert held.plan is not None
    assert held.plan.output_tokens == 50  # the guess for free text
    state.request_done(fast_reply(now=0.3))  # type: ignore[arg-type]
    assert state.outputs.expected(None) == 12  # one reply replaces the guess
    due = BudgetPolicy(state).after_add([held], 0.3)
    fresh = Planning.plan_item(state, "q", None, 2.0, 0.0)
    assert due == BudgetPolicy(state).after_add([Call("q", fresh)], 0.3)


def test_a_declared_or_bounded_answer_size_is_not_replaced_by_one_reply() -> None:
    state = planning(guessed_output=False)
    state.request_done(fast_reply(now=0.3))  # type: ignore[arg-type]
    assert state.outputs.expected(None) == 50  # ten replies are needed, as before


def test_a_reply_that_failed_also_ends_the_cold_start() -> None:
    state = planning()
    policy = BudgetPolicy(state)
    assert policy.before_add([], call(state), 0.0) is DispatchReason.PROBE
    state.request_done(Reply(None, now=0.4, error=RuntimeError("500")))  # type: ignore[arg-type]
    assert not state.cold
    # Planned by the prior from now on: no pair fits, so the window goes first.
    assert policy.before_add([call(state)], call(state), 0.4) is DispatchReason.DEADLINE


def test_when_packing_cannot_pay_there_is_no_cold_start() -> None:
    state = planning(cold_start=False)
    policy = BudgetPolicy(state)
    assert policy.before_add([], call(state), 0.0) is None
    assert policy.before_add([call(state)], call(state), 0.0) is DispatchReason.DEADLINE


def test_after_the_hold_a_cold_call_is_planned_as_the_prior_says() -> None:
    state = planning()
    policy = BudgetPolicy(state)
    assert policy.before_add([], call(state), 0.0) is DispatchReason.PROBE
    held = call(state)
    hold = policy.before_add([], held, 0.0)
    assert isinstance(hold, Hold)
    # Released at the end of its hold, the probe still out: no second hold; it leaves
    # alone at once, in time as the prior typically is (its p95 says late: SOLO).
    assert policy.before_add([], held, hold.until) is DispatchReason.SOLO
    assert held.plan is not None
    tokens = group_tokens([held.plan], state.limits)
    assert hold.until + state.predict_typical(*tokens) < held.plan.deadline
    assert hold.until + state.predict(*tokens) > held.plan.deadline


# -- packing where it pays (issue 35) -------------------------------------------------


def quick(overhead: float = 0.2, decode: float = 0.005) -> Predict:
    """A prior that admits a pair of ``item()`` (0.2 + 0.005 * 100 = 0.7 s) but not five
    (0.2 + 0.005 * 250 = 1.45 s, over a 1.2 s budget)."""
    return linear(overhead, 0.0, decode)


def test_a_cold_call_probes_when_the_prior_admits_a_pair_but_no_paying_group() -> None:
    new = item(deadline=1.2)
    assert latest_start([new, new], LIMITS, quick()) >= 0  # a pair fits...
    assert latest_start([new] * 5, LIMITS, quick()) < 0  # ...a paying group does not
    assert cold_start(new, LIMITS, quick(), 0.0, probing=False) is None  # pairs: as before
    decision = cold_start(new, LIMITS, quick(), 0.0, probing=False, least=5)
    assert decision == ColdStart(probe=True, hold_until=pytest.approx(1.2 - 0.45 - HOLD_GUARD))
    held = cold_start(new, LIMITS, quick(), 0.0, probing=True, least=5)
    assert held == ColdStart(probe=False, hold_until=pytest.approx(1.2 - 0.45 - HOLD_GUARD))


def test_no_cold_start_when_the_prior_admits_a_paying_group_or_none_can_pay() -> None:
    new = item(deadline=3.0)
    assert latest_start([new] * 5, LIMITS, quick()) >= 0
    assert cold_start(new, LIMITS, quick(), 0.0, probing=False, least=5) is None
    # No group pays (or none within max_items): calls go at once, never held.
    assert cold_start(item(1.2), LIMITS, quick(), 0.0, probing=False, least=math.inf) is None
    assert cold_start(item(1.2), LIMITS, quick(), 0.0, probing=False, least=9) is None


def test_a_window_that_cannot_grow_to_a_paying_group_on_time_cannot_pay() -> None:
    from coalesce._planning.planner import can_pay

    lone = [item(deadline=1.2)]
    assert can_pay(lone, 2, LIMITS, quick(), 0.0)
    assert not can_pay(lone, 5, LIMITS, quick(), 0.0)  # five would finish at 1.45 s
    assert can_pay([item(deadline=3.0)], 5, LIMITS, quick(), 0.0)
    assert not can_pay([item(deadline=3.0)], 5, LIMITS, quick(), 1.6)  # later, too late
    assert can_pay([item()] * 5, 5, LIMITS, quick(), 0.0)  # already that large
    assert not can_pay(lone, math.inf, LIMITS, quick(), 0.0)
    assert can_pay([item(math.inf)], 5, LIMITS, quick(), 100.0)  # no deadline


def paying_planning(least: float) -> Planning:
    limits = PlanLimits(max_items=20, max_wait=0.5, shared_tokens=100, streaming=False)
    return Planning(limits, 10, LatencyPrior(), CharacterEstimator(), paying=lambda: least)


def test_a_window_below_the_paying_size_goes_at_once_when_it_cannot_grow() -> None:
    # The default prior: one call ~1 s at the p99. With 1.5 s, no group of 8 is on time:
    # the lone call would go plain whatever it waited for, so it goes now.
    state = paying_planning(8)
    state.cold = False
    policy = BudgetPolicy(state)
    lone = call(state, budget=1.5)
    assert policy.after_add([lone], 0.0) == Due(0.0, DispatchReason.DEADLINE)
    # A group of 2 that pays waits for company as before (the window's max_wait).
    state = paying_planning(2)
    state.cold = False
    waited = BudgetPolicy(state).after_add([call(state, budget=1.5)], 0.0)
    assert waited.at > 0.0
