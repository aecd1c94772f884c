"""What is noted when a group leaves its window: the recorder's dispatch event, the
planner's prediction for it, and budgets that were unmeetable even alone.

The listener keeps, for each call until its caller finishes, the number of the group
it left in and how the planner predicts that group's requests: the statistics
listener reads them to label each request (:class:`~coalesce.RequestEvent`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from .._batching.policy import DispatchReason
from .._batching.runtime import current_time
from .._batching.stats import BatcherStatistics
from .._calls import Job
from .._planning.planner import PlanItem, group_tokens
from .._planning.state import Planning
from .recorder import PromptRecorder

__all__ = ["DispatchListener", "DispatchReasons", "Dispatched", "request_predictor"]

#: The planner's predicted seconds (a p99) of one request carrying given members.
Predictor = Callable[[Sequence[PlanItem]], float]


@dataclass(frozen=True)
class Dispatched:
    """What was noted of a call's group as it left its window.

    Attributes:
        group: The group's number (the recorder's count of dispatches).
        predict: How the planner predicts the seconds of a request carrying given
            members (``None`` without a budget).
        size: How many calls the group held.
        cold: No reply of the function had been measured yet (its planner's prior
            sized the group).
        reason: Why it left (a :class:`~coalesce._batching.policy.DispatchReason`).
    """

    group: int
    predict: Predictor | None = None
    size: int = 0
    cold: bool = False
    reason: str = ""


class DispatchListener:
    """The batcher's ``on_dispatch`` hook for one engine.

    Args:
        recorder: Told each dispatch (and each unmeetable budget).
        planning: The function's planner, if it plans against a budget.
    """

    def __init__(self, recorder: PromptRecorder, planning: Planning | None) -> None:
        self.recorder, self.planning = recorder, planning
        self._groups: dict[Job, Dispatched] = {}

    def __call__(self, reason: DispatchReason, jobs: Sequence[Job]) -> None:
        planning, predict, predicted = self.planning, None, None
        # Planned (and predicted, sized by the cold prior) only if some member has a
        # budget: a group without one is the batcher's own window.
        budgeted = any(math.isfinite(job.deadline) for job in jobs)
        if planning is not None and budgeted and any(job.plan is not None for job in jobs):
            # Sized as the planner sizes them now (what replies taught since they came).
            plans = [planning.sized(job.plan, job.partition) for job in jobs if job.plan]
            predict = request_predictor(planning)
            # The group's prediction is for its event only: made when someone listens.
            predicted = predict(plans) if self.recorder.events.watched() else None
            if reason is DispatchReason.SOLO:  # as the planner predicted it, alone
                for plan in plans:
                    alone, budget = predict([plan]), plan.deadline - plan.arrival
                    if alone > budget:  # not one that waited (a hold) and is now late
                        self.recorder.unmeetable(alone, budget)
        left = min((job.deadline for job in jobs), default=math.inf) - current_time()
        number = self.recorder.dispatched(
            reason, len(jobs), predicted=predicted, time_left=left if math.isfinite(left) else None
        )
        cold = planning is not None and planning.cold and budgeted
        dispatched = Dispatched(number, predict, len(jobs), cold, str(reason))
        for job in jobs:
            self._groups[job] = dispatched

    def of(self, job: Job) -> Dispatched | None:
        """What was noted of ``job``'s group, if it was dispatched and its caller waits."""
        return self._groups.get(job)

    def forget(self, job: Job) -> None:
        """``job``'s caller has finished: drop what was noted of it."""
        self._groups.pop(job, None)


def request_predictor(planning: Planning) -> Predictor:
    """The planner's predicted seconds (a p99) of one request carrying given members."""

    def predict(members: Sequence[PlanItem]) -> float:
        return planning.predict(*group_tokens(members, planning.limits))

    return predict


class DispatchReasons:
    """The statistics part of ``dispatch_reasons``: the batchers of the engines that
    record here count why each group left its window, and are its one source (``wrap``'s
    kinds of call and a function's flex lane share their recorder: their counts add up).
    """

    def __init__(self) -> None:
        self.batchers: list[HasStatistics] = []

    def statistics(self) -> Mapping[str, Any]:
        """The field: every reason some group left for, with its count."""
        total: Counter[str] = Counter()
        for batcher in self.batchers:
            total.update({k: n for k, n in batcher.statistics().dispatch_reasons.items() if n})
        return {"dispatch_reasons": MappingProxyType(dict(total))}


class HasStatistics(Protocol):
    """A batcher, as :class:`DispatchReasons` reads it."""

    def statistics(self) -> BatcherStatistics:
        """Its statistics."""
        ...
