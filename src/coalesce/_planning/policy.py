"""The latency-budget planner as the batcher's dispatch policy.

:class:`BudgetPolicy` answers the batcher's two questions with the pure planner
functions (:func:`~coalesce._planning.planner.cold_start`,
:func:`~coalesce._planning.planner.admit`,
:func:`~coalesce._planning.planner.full_after_add`, :func:`~coalesce._planning.planner.due`,
:func:`~coalesce._planning.planner.can_pay`) over the calls' plans and what
:class:`~coalesce._planning.state.Planning` knows now.

Every engine has one: each call's own budget (its function's, a
``coalesce.latency_budget()`` block's, a per-call one, a drop-in call's
``x-coalesce-budget``) sizes its wait and its group. A window in which no call has a
budget is the batcher's own: it waits the default short window, ``max_wait``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .._batching.policy import DispatchReason, Due, Hold
from .planner import PlanItem, admit, can_pay, cold_start, due, full_after_add
from .reports import Planned
from .state import Planning

__all__ = ["BudgetPolicy", "unbudgeted"]


class BudgetPolicy:
    """Dispatch a window before any member's deadline would be missed.

    A call is planned with the answer size expected now, not when it arrived: a call
    held through a cold start is sized by what the first reply taught.

    Args:
        planning: The function's planner state (limits, latency model).
    """

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    def before_add(
        self, members: Sequence[Planned], item: Planned, now: float
    ) -> DispatchReason | Hold | None:
        """While the function is cold, ``PROBE`` or a :class:`Hold` where
        :func:`~coalesce._planning.planner.cold_start` says so; ``SOLO`` if ``item`` is
        predicted late even alone; else dispatch the window first if the item would make
        it full, too large or late. Nothing where no call has a budget."""
        planning = self.planning
        plan = self._plan(item)
        if math.isinf(plan.deadline) and unbudgeted(members):
            return None
        if planning.cold:
            cold = cold_start(
                plan,
                planning.limits,
                planning.predict,
                now,
                probing=planning.probing,
                central=planning.predict_typical,
                least=planning.least(),
            )
            if cold is not None and cold.probe:
                planning.probe_sent()
                return DispatchReason.PROBE
            if cold is not None:
                return Hold(cold.hold_until)
        admission = admit(self._plans(members), plan, planning.limits, planning.predict, now)
        return DispatchReason.SOLO if admission.solo else admission.dispatch_first

    def after_add(self, members: Sequence[Planned], now: float) -> Due | None:
        """At once if full, or if the window can no longer grow to a group that pays for
        its packing on time (it goes as plain calls: waiting would only make them
        later); else the latest time that keeps every member on time. ``None`` (the
        batcher's own ``max_wait``) where no member has a budget."""
        if unbudgeted(members):
            return None
        planning = self.planning
        plans = self._plans(members)
        reason = full_after_add(plans, planning.limits)
        if reason is not None:
            return Due(now, reason)
        least = planning.least()
        # When the request quota binds, packing pays whatever the tokens say.
        paid = can_pay(plans, least, planning.limits, planning.predict, now)
        if not paid and not planning.requests_bind(now):
            return Due(now, DispatchReason.DEADLINE)
        return due(plans, planning.limits, planning.predict)

    def _plan(self, job: Planned) -> PlanItem:
        if job.plan is None:
            raise ValueError("a call planned against a budget needs its plan")
        return self.planning.sized(job.plan, job.partition)

    def _plans(self, jobs: Sequence[Planned]) -> list[PlanItem]:
        return [self._plan(job) for job in jobs]

    def __repr__(self) -> str:
        return f"BudgetPolicy({self.planning!r})"


def unbudgeted(jobs: Sequence[Planned]) -> bool:
    """Whether no call of ``jobs`` has a budget (a deadline) to plan for."""
    for job in jobs:
        plan = job.plan
        if plan is not None and math.isfinite(plan.deadline):
            return False
    return True
