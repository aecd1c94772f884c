"""The shadow guard around a group runner: after every caller has its answer, a
sample of the packed ones is asked again alone, and the verdicts move the group cap
(the decisions are :class:`~coalesce._accuracy.shadow.ShadowGuard`'s). Each answered
group's packed requests earn the guard's learning budget what they saved, and each
shadow call is priced before it is sent (:class:`LearningCosts`)."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from .._calls import Job, NoObserver, Runner
from .._observe.events import DisagreementAlarm, ShadowEvent
from .._observe.recorder import PromptRecorder
from .._planning.cost import PackingCost, packing_saves, plain_call_cost
from .shadow import ShadowGuard

__all__ = ["LearningCosts", "Positions", "Shadowing"]


class LearningCosts:
    """What a packed request saves and what a shadow call costs, for the learning
    budget: estimates from the function's footprint, price and prompt cache, in
    input-token equivalents.

    Args:
        cost: The function's packing cost (its footprint, price and cache).
        count: Counts an item's tokens (from its canonical JSON).
        answer_tokens: Output tokens expected of one answer.
    """

    def __init__(
        self, cost: PackingCost, count: Callable[[str], int], answer_tokens: Callable[[], int]
    ) -> None:
        self.cost, self.count, self.answer_tokens = cost, count, answer_tokens

    def saved(self, size: int) -> float:
        """What one packed request of ``size`` items saved against their plain calls."""
        cost = self.cost
        return packing_saves(cost.footprint, cost.price, size, cost.cache)

    def price(self, job: Job) -> float:
        """What asking ``job``'s item alone costs."""
        cost = self.cost
        return plain_call_cost(
            cost.footprint,
            cost.price,
            cost.cache,
            item_tokens=self.count(job.key),
            output_tokens=self.answer_tokens(),
        )


class Positions(NoObserver):
    """Where each call sat in the last request that carried it: ``(size, position)``,
    position 1 for the first item written. A listener of the group runner; the shadow
    guard takes each call's entry once its group is answered."""

    def __init__(self) -> None:
        self.where: dict[Job, tuple[int, int]] = {}

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """Note each call's place (a request's ids are in writing order)."""
        for position, jobs in enumerate(slots.values(), 1):
            for job in jobs:
                self.where[job] = (len(slots), position)

    def take(self, job: Job) -> tuple[int, int]:
        """``job``'s place in its last request, forgotten now (``(company, 0)`` if
        not noted)."""
        return self.where.pop(job, (job.company, 0))


class Shadowing:
    """A :data:`~coalesce._calls.Runner` that runs ``ask``, then shadows a sample.

    Args:
        ask: The runner whose answers are checked.
        alone: Asks an item alone, as a plain call counted apart.
        guard: Samples the packed answers and judges them.
        recorder: Told each verdict (a :class:`~coalesce.ShadowEvent`).
        positions: Where each call sat in its request (told by the runner ``ask``).
        costs: Prices the learning budget's earnings and spending (``None``: the guard
            has no budget).
    """

    def __init__(
        self,
        ask: Runner,
        alone: Runner,
        guard: ShadowGuard,
        recorder: PromptRecorder,
        positions: Positions | None = None,
        costs: LearningCosts | None = None,
    ) -> None:
        self.ask, self.alone, self.guard, self.recorder = ask, alone, guard, recorder
        self.costs = costs
        self.positions = positions or Positions()
        self._events = recorder.events
        # Items are offered to the sampler in a shuffled order, so that a fixed rate
        # and a fixed group size do not always pick the same position.
        self._rng = random.Random(0)

    async def __call__(self, jobs: list[Job], resolve: Callable[[int, Any], None]) -> None:
        answers: dict[int, Any] = {}

        def keep(index: int, outcome: Any) -> None:
            answers[index] = outcome
            resolve(index, outcome)

        await self.ask(jobs, keep)
        places = [self._place(job) for job in jobs]
        self._earn(places)
        order = list(answers)
        self._rng.shuffle(order)
        # Every caller has its answer: shadow a sample of the packed ones, after.
        async with anyio.create_task_group() as tg:
            for index in order:
                answer, (size, position) = answers[index], places[index]
                if isinstance(answer, BaseException):
                    continue
                price = 0.0 if self.costs is None or size < 2 else self.costs.price(jobs[index])
                if self.guard.wants(size, position, price):
                    tg.start_soon(self._check, jobs[index], answer, position)

    def _place(self, job: Job) -> tuple[int, int]:
        """``job``'s ``(size, position)`` in the request that answered it."""
        size, position = self.positions.take(job)
        return (size, position) if size == job.company else (job.company, 0)

    def _earn(self, places: Sequence[tuple[int, int]]) -> None:
        """Tell the guard what the group's packed requests saved (each packed item its
        request's saving shared out)."""
        costs = self.costs
        if costs is None:
            return
        saved = sum(costs.saved(size) / size for size, _ in places if size >= 2)
        if saved:
            self.guard.earn(saved)

    async def _check(self, job: Job, packed: Any, position: int) -> None:
        """Ask ``job``'s item alone and judge the packed answer against it."""
        alone = Job(job.item, job.key, math.inf, arrival=anyio.current_time())
        plain: list[Any] = []
        await self.alone([alone], lambda _, outcome: plain.append(outcome))
        if plain and not isinstance(plain[0], BaseException):
            moves = len(self.guard.moves)
            agreed = self.guard.record(job.company, packed, plain[0], position)
            self._judged(job.company, agreed)
            if len(self.guard.moves) != moves:
                self._moved(*self.guard.moves[-1])
        else:
            self.guard.dropped()

    def _judged(self, size: int, agreed: bool) -> None:
        """Tell the verdict: at DEBUG when the answers agreed, else at INFO."""
        level = logging.DEBUG if agreed else logging.INFO
        if self._events.watched(level):
            recorder = self.recorder
            event = ShadowEvent(recorder.function, recorder.model, size, agreed, self.guard.cap)
            self._events.emit(event, level)

    def _moved(self, old: int, cap: int, reason: str) -> None:
        """A lower cap is an alarm (``WARNING``): packed answers went wrong."""
        if cap < old and self._events.watched(logging.WARNING):
            recorder = self.recorder
            alarm = DisagreementAlarm(recorder.function, recorder.model, old, cap, reason)
            self._events.emit(alarm, logging.WARNING)
