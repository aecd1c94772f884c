"""The latency-budget planner as the batcher's dispatch policy.

:class:`BudgetPolicy` answers the batcher's two questions with the pure planner
functions (:func:`~coalesce._planning.planner.admit`,
:func:`~coalesce._planning.planner.full_after_add`, :func:`~coalesce._planning.planner.due`)
over the calls' plans and what :class:`~coalesce._planning.state.Planning` knows now.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._batching.policy import DispatchReason, Due
from .planner import PlanItem, admit, due, full_after_add
from .reports import Planned
from .state import Planning

__all__ = ["BudgetPolicy"]


class BudgetPolicy:
    """Dispatch a window before any member's deadline would be missed.

    Args:
        planning: The function's planner state (limits, latency model).
    """

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    def before_add(
        self, members: Sequence[Planned], item: Planned, now: float
    ) -> DispatchReason | None:
        """``SOLO`` if ``item`` is predicted late even alone; else dispatch the window first
        if the item would make it full, too large or late."""
        planning = self.planning
        admission = admit(_plans(members), _plan(item), planning.limits, planning.predict, now)
        return DispatchReason.SOLO if admission.solo else admission.dispatch_first

    def after_add(self, members: Sequence[Planned], now: float) -> Due:
        """At once if full; else the latest time that keeps every member on time."""
        plans = _plans(members)
        reason = full_after_add(plans, self.planning.limits)
        if reason is not None:
            return Due(now, reason)
        return due(plans, self.planning.limits, self.planning.predict)

    def __repr__(self) -> str:
        return f"BudgetPolicy({self.planning!r})"


def _plan(job: Planned) -> PlanItem:
    if job.plan is None:
        raise ValueError("a call planned against a budget needs its plan")
    return job.plan


def _plans(jobs: Sequence[Planned]) -> list[PlanItem]:
    return [_plan(job) for job in jobs]
