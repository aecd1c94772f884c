"""The shadow guard around a group runner: after every caller has its answer, a
sample of the packed ones is asked again alone, and the verdicts move the group cap
(the decisions are :class:`~coalesce._accuracy.shadow.ShadowGuard`'s)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import anyio

from .._calls import Job, Runner
from .._observe.events import ShadowEvent
from .._observe.recorder import PromptRecorder
from .shadow import ShadowGuard

__all__ = ["Shadowing"]


class Shadowing:
    """A :data:`~coalesce._calls.Runner` that runs ``ask``, then shadows a sample.

    Args:
        ask: The runner whose answers are checked.
        alone: Asks an item alone, as a plain call counted apart.
        guard: Samples the packed answers and judges them.
        recorder: Told each verdict (a :class:`~coalesce.ShadowEvent`).
    """

    def __init__(
        self, ask: Runner, alone: Runner, guard: ShadowGuard, recorder: PromptRecorder
    ) -> None:
        self.ask, self.alone, self.guard, self.recorder = ask, alone, guard, recorder
        self._events = recorder.events

    async def __call__(self, jobs: list[Job], resolve: Callable[[int, Any], None]) -> None:
        answers: dict[int, Any] = {}

        def keep(index: int, outcome: Any) -> None:
            answers[index] = outcome
            resolve(index, outcome)

        await self.ask(jobs, keep)
        # Every caller has its answer: shadow a sample of the packed ones, after.
        async with anyio.create_task_group() as tg:
            for index, answer in answers.items():
                job = jobs[index]
                if not isinstance(answer, BaseException) and self.guard.wants(job.company):
                    tg.start_soon(self._check, job, answer)

    async def _check(self, job: Job, packed: Any) -> None:
        """Ask ``job``'s item alone and judge the packed answer against it."""
        alone = Job(job.item, job.key, math.inf, arrival=anyio.current_time())
        plain: list[Any] = []
        await self.alone([alone], lambda _, outcome: plain.append(outcome))
        if plain and not isinstance(plain[0], BaseException):
            agreed = self.guard.record(job.company, packed, plain[0])
            self._judged(job.company, agreed)

    def _judged(self, size: int, agreed: bool) -> None:
        """Tell the verdict: at DEBUG when the answers agreed, else at INFO."""
        level = logging.DEBUG if agreed else logging.INFO
        if self._events.watched(level):
            recorder = self.recorder
            event = ShadowEvent(recorder.function, recorder.model, size, agreed, self.guard.cap)
            self._events.emit(event, level)
