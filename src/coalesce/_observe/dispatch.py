"""What is noted when a group leaves its window: the recorder's dispatch event, the
planner's prediction for it, and budgets that were unmeetable even alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio

from .._batching.policy import DispatchReason
from .._calls import Job
from .._planning.state import Planning
from .listeners import request_predictor
from .recorder import PromptRecorder

__all__ = ["DispatchListener"]


class DispatchListener:
    """The batcher's ``on_dispatch`` hook for one engine.

    Args:
        recorder: Told each dispatch (and each unmeetable budget).
        planning: The function's planner, if it plans against a budget.
    """

    def __init__(self, recorder: PromptRecorder, planning: Planning | None) -> None:
        self.recorder, self.planning = recorder, planning

    def __call__(self, reason: DispatchReason, jobs: Sequence[Job]) -> None:
        planning, predict, predicted = self.planning, None, None
        plans = [job.plan for job in jobs if job.plan is not None]
        if planning is not None and plans:
            predict = request_predictor(planning)
            predicted = predict(plans)
            if reason is DispatchReason.SOLO:  # as the planner predicted it, alone
                for plan in plans:
                    self.recorder.unmeetable(predict([plan]), plan.deadline - plan.arrival)
        left = min((job.deadline for job in jobs), default=math.inf) - anyio.current_time()
        number = self.recorder.dispatched(
            reason, len(jobs), predicted=predicted, time_left=left if math.isfinite(left) else None
        )
        for job in jobs:
            job.group, job.predictor = number, predict
