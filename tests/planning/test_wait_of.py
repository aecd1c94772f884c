"""Every budget sizes the wait (issue 35): each call's own budget bounds its wait for
company, however it was given; a call without one waits the default short window.

Pure decisions (:func:`wait_of`, :func:`due`) and the budget policy over hand-built
planner state (:class:`Planning`): no event loop, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from coalesce._batching.policy import DispatchReason, Due
from coalesce._exceptions import ConfigurationError
from coalesce._planning.latency import LatencyPrior
from coalesce._planning.planner import Pace, PlanItem, PlanLimits, due, pack_more, wait_of
from coalesce._planning.policy import BudgetPolicy, unbudgeted
from coalesce._planning.state import Planning
from coalesce._planning.tokens import CharacterEstimator
from coalesce.providers._ratelimit import Quota, RateLimitState

LIMITS = PlanLimits(max_items=8, max_wait=0.05, budget_share=0.25)
NO_SHARE = replace(LIMITS, budget_share=None)  # a max_wait given: every call's wait


def fast(input_tokens: int, output_tokens: int) -> float:
    return 0.2


def item(arrival: float = 0.0, budget: float | None = 2.0) -> PlanItem:
    deadline = math.inf if budget is None else arrival + budget
    return PlanItem(input_tokens=20, output_tokens=10, deadline=deadline, arrival=arrival)


def test_a_call_waits_a_share_of_its_own_budget() -> None:
    assert wait_of(item(budget=2.0), LIMITS) == 0.5
    assert wait_of(item(arrival=7.0, budget=8.0), LIMITS) == 2.0


def test_a_call_without_a_budget_waits_the_default_window() -> None:
    assert wait_of(item(budget=None), LIMITS) == 0.05


def test_a_tight_budget_waits_no_less_than_the_default_window() -> None:
    # Its deadline still binds: the planner sends it before it would be late.
    assert wait_of(item(budget=0.1), LIMITS) == 0.05


def test_a_given_max_wait_is_every_calls_wait() -> None:
    assert wait_of(item(budget=2.0), NO_SHARE) == 0.05
    assert wait_of(item(budget=None), replace(NO_SHARE, max_wait=1.0)) == 1.0


def test_a_window_is_due_when_its_first_members_wait_ends() -> None:
    assert due([item(0.0), item(0.3)], LIMITS, fast) == Due(0.5, DispatchReason.WINDOW)
    # A later member with a tighter budget ends the wait sooner: 0.2 + 0.25.
    window = [item(0.0), item(0.2, budget=1.0)]
    assert due(window, LIMITS, fast) == Due(0.45, DispatchReason.WINDOW)
    # A member without a budget waits the default window.
    assert due([item(0.0), item(0.1, budget=None)], LIMITS, fast).at == pytest.approx(0.15)
    assert due([item(0.0)], NO_SHARE, fast) == Due(0.05, DispatchReason.WINDOW)


def test_a_binding_request_quota_stretches_the_wait_past_the_budgets_share() -> None:
    quota = RateLimitState(requests=Quota(limit=60, remaining=1, reset_at=30.0))
    stretched = pack_more(quota, LIMITS, Pace(request_rate=10.0, tokens_per_request=100), 0.0)
    assert stretched.max_wait == 30.0
    assert wait_of(item(budget=2.0), stretched) == 30.0  # the deadline still binds


def test_the_share_is_a_fraction() -> None:
    with pytest.raises(ConfigurationError, match="budget_share"):
        PlanLimits(budget_share=1.5)


# -- the policy ----------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    item: str
    plan: PlanItem | None
    partition: None = None


def planning() -> Planning:
    return Planning(LIMITS, 10, LatencyPrior(), CharacterEstimator(), cold_start=False)


def call(state: Planning, now: float, budget: float | None) -> Call:
    deadline = math.inf if budget is None else now + budget
    return Call("q", state.plan_item("q", None, deadline, now))


def test_a_window_without_a_budget_is_left_to_the_batcher() -> None:
    state = planning()
    policy = BudgetPolicy(state)
    first, second = call(state, 0.0, None), call(state, 0.01, None)
    assert unbudgeted([first, second])
    assert policy.before_add([first], second, 0.01) is None
    assert policy.after_add([first, second], 0.01) is None  # the batcher's max_wait


def test_a_budgeted_call_is_planned_by_its_own_budget() -> None:
    state = planning()
    policy = BudgetPolicy(state)
    first = call(state, 0.0, 8.0)
    assert not unbudgeted([first])
    assert policy.before_add([], first, 0.0) is None
    assert policy.after_add([first], 0.0) == Due(2.0, DispatchReason.WINDOW)
    # A call without a budget joining it waits the default window.
    second = call(state, 0.5, None)
    assert not unbudgeted([second, first])
    assert policy.after_add([first, second], 0.5) == Due(0.55, DispatchReason.WINDOW)
