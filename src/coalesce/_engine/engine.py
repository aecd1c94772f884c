"""The engine under ``@coalesce.prompt`` and ``coalesce.wrap``: one LLM function's calls.

An :class:`Engine` takes a function's calls in and answers them in real time. It owns
the function's :class:`~coalesce._engine.spec.FunctionSpec` and
:class:`~coalesce._engine.spec.Options`, the parts assembled from them
(:func:`~coalesce._engine.parts.assemble`: planner, admission, packing cost, trust,
listeners, and the group runner with the vote and the shadow guard around it), and a
:class:`~coalesce.Batcher` that groups the calls and hands each group to that runner.

``await engine.submit(item)`` is one call. The decorator and the drop-in client only
translate their callers' arguments into items and the results back; lanes other than
real time are the :class:`~coalesce._lanes.router.LaneRouter`'s, in front of it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

import anyio

from .._batching.batcher import Batcher, Resolve
from .._calls import Carried, GroupObserver, Job
from .._exceptions import InvalidInputError
from .._observe.dispatch import DispatchReasons
from .._observe.events import option_changes
from .._observe.recorder import PromptRecorder, PromptStatistics
from .._validate import encode_item
from .budget import budget_of
from .parts import assemble
from .spec import FunctionSpec, Options

__all__ = ["Engine"]


class Engine:
    """Serves the calls of one LLM function (see the module doc).

    Args:
        spec: What the function asks.
        options: How its calls coalesce.
        recorder: Where its statistics go (default: its own).
        observers: Further listeners of its requests.
        lane: The lane its requests go through, for their price (``"realtime"``; the
            flex lane is an engine of its own, sharing its function's recorder).
    """

    def __init__(
        self,
        spec: FunctionSpec,
        options: Options,
        *,
        recorder: PromptRecorder | None = None,
        observers: Sequence[GroupObserver] = (),
        lane: str = "realtime",
    ) -> None:
        self.spec = spec
        self.options = options
        self.recorder = recorder or PromptRecorder(
            spec.name, spec.model, prices=options.prices, on_event=options.on_event
        )
        self.parts = parts = assemble(spec, options, self.recorder, observers, lane)
        self.footprint, self.planning = parts.footprint, parts.planning
        self.admission, self.screen = parts.admission, parts.screen
        self.trust, self.cost, self.shadow = parts.trust, parts.cost, parts.shadow
        self.batcher: Batcher[Job, Any] = Batcher(
            self._run,
            # When no group can pay for its packing, calls go at once, plain.
            max_wait=options.window if self.pays_from is not None else 0.0,
            max_items=parts.max_items,
            max_concurrency=options.max_concurrency,
            partition=_partition,
            name=spec.name,
            policy=parts.policy,
            on_dispatch=parts.dispatch,
            resolve_early=True,
        )
        # The batcher counts why groups leave: the statistics read it there.
        self.recorder.part(DispatchReasons, DispatchReasons).batchers.append(self.batcher)

    @property
    def pays_from(self) -> int | None:
        """The smallest group packing pays for, or ``None`` if none does."""
        return self.cost.smallest

    def new_job(self, item: Any, *, budget: float | None = None, partition: Hashable = None) -> Job:
        """A call of ``item`` made now, not yet submitted.

        Its budget is ``budget`` if given, else the one
        :func:`~coalesce.latency_budget` set around the call, else the engine's
        ``latency_budget``.

        Raises:
            InvalidInputError: The item is not strict JSON, or too large for the model's
                context window (see :mod:`coalesce._engine.admission`): only this call fails.
        """
        budget = self.budget_of(budget)
        now = anyio.current_time()
        deadline = now + (budget if budget is not None else math.inf)
        try:
            key, size = encode_item(item)
            # A call without a budget has no deadline to plan for: the admission's
            # cheap plan (its UTF-8 size bounds its tokens) is enough.
            plan = None
            if budget is not None:
                plan = self.planning.plan_item(item, partition, deadline, now)
            plan = self.admission.admit(item, size, plan, deadline=deadline, arrival=now)
        except InvalidInputError:
            self.recorder.call_finished(0.0, budget=budget, ok=False)  # refused at once
            raise
        alone = self.screen is not None and self.screen(item)
        return Job(item, key, deadline, now, budget, partition, plan, alone=alone)

    def budget_of(self, budget: float | None) -> float | None:
        """A call's budget: its own, else the :func:`~coalesce.latency_budget` block's,
        else the engine's ``latency_budget``."""
        return budget_of(budget, self.options.latency_budget)

    def in_time(self, job: Job, left: float) -> bool:
        """Whether real time may still answer ``job`` with ``left`` seconds."""
        return self.parts.in_time(job, left)

    async def answer(
        self, job: Job, *, ask: Callable[[Carried], Awaitable[Any]] | None = None
    ) -> Any:
        """Submit ``job`` and await its own result, recording the call.

        ``ask``: how to get the result instead of this engine's :meth:`ask` (the lane
        router's flex lane, say), telling the :class:`~coalesce._calls.Carried` it is
        given what carried the call; the call is recorded here all the same."""
        carried: Carried | None = None  # made once answered (nothing kept while it waits)
        ok = False
        try:
            if ask is None:  # self.ask, inline: one coroutine fewer per call
                self.parts.statistics.follow(job)
                try:
                    result = await self.batcher(job)
                finally:
                    carried = self._carried(job, Carried())
            else:
                carried = Carried()
                result = await ask(carried)
            ok = True
        finally:
            done = carried if carried is not None else Carried()
            wait = None if job.dispatched_at is None else job.dispatched_at - job.arrival
            self.recorder.call_finished(
                anyio.current_time() - job.arrival,
                wait=wait,
                budget=job.budget,
                ok=ok,
                requests=done.requests,
                attempts=done.attempts,
                lane=done.lane,
            )
        return result

    async def ask(self, job: Job, carried: Carried) -> Any:
        """``job``'s own result, through this engine's batcher; the requests that
        carried it are added to ``carried``. Its listeners forget it once it is answered."""
        self.parts.statistics.follow(job)
        try:
            return await self.batcher(job)
        finally:
            self._carried(job, carried)

    def _carried(self, job: Job, carried: Carried) -> Carried:
        """``job`` is answered: what carried it goes to ``carried`` (returned); its
        listeners forget it."""
        parts = self.parts
        names = parts.statistics.requests_of(job)
        if names:
            carried.requests = (*carried.requests, *names)
        carried.attempts += job.attempts
        parts.dispatch.forget(job)
        return carried

    def call(
        self, item: Any, *, budget: float | None = None, partition: Hashable = None
    ) -> Awaitable[Any]:
        """One call, its job made now (see :meth:`new_job`): what to await for ``item``'s
        own validated output (:meth:`submit` without a coroutine of its own)."""
        return self.answer(self.new_job(item, budget=budget, partition=partition))

    async def submit(
        self, item: Any, *, budget: float | None = None, partition: Hashable = None
    ) -> Any:
        """One call, in real time: ``item``'s own validated output (see :meth:`new_job`
        for the budget)."""
        return await self.answer(self.new_job(item, budget=budget, partition=partition))

    def statistics(self) -> PromptStatistics:
        """The recorder's snapshot (see :class:`~coalesce.PromptStatistics`)."""
        return self.recorder.snapshot()

    async def aclose(self) -> None:
        """Send every pending call now, wait for all of them, refuse new calls."""
        await self.batcher.aclose()
        if self.shadow is not None:
            self.shadow.save()  # what this process learned, for the next one

    async def _run(self, jobs: list[Job], resolve: Resolve) -> None:
        await self.parts.runner(jobs, resolve)

    def group_cap(self) -> int:
        """The most items a group carries now: ``max_items``, or the learned cap."""
        limit = self.planning.limits.max_items
        return limit if self.shadow is None else min(limit, self.shadow.cap)

    def __repr__(self) -> str:
        limit = self.group_cap()
        early = self.options.stream and self.trust.enforced
        waiting = self.batcher.statistics().queue_depth
        return (
            f"<coalesce.Engine {self.spec.name} model={self.spec.model!r}"
            f"{option_changes(self.options)}: {self.recorder.summary(waiting)},"
            f" groups up to {limit}, answers {'stream early' if early else 'held'}>"
        )


def _partition(job: Job) -> Hashable:
    return job.partition
