"""The lane router: hands each call of an LLM function to the lane its budget allows.

The engine answers calls in real time; it knows nothing of lanes. The router sits in
front of it, the way an HTTP client picks a transport for a URL: with ``lane="auto"``
(or ``"flex"``, ``"batch"``) it asks :func:`~coalesce._lanes.choose.choose_lane` where a
call goes, and sends it there:

* real time: the function's own engine;
* flex: a second engine asking with ``service_tier="flex"``, grouping for
  ``batch_window`` with no latency planning, sharing the function's recorder (its
  requests billed at the flex price); a call flex refuses goes back to real time with
  what is left of its budget;
* batch: the :class:`~coalesce._lanes.lane.BatchLane`, on its durable job store.

Flex and batch are opened on first use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

import anyio
from tenacity import AsyncRetrying, RetryCallState

from .._calls import Carried, GroupObserver, Job
from .._engine.engine import Engine
from .._engine.spec import FunctionSpec, Options
from .._exceptions import ConfigurationError
from .._observe.listeners import StatisticsListener
from ..providers._client import as_provider
from .choose import Lane, LaneTimes, check_lane, choose_lane, flex_again
from .flex import FLEX_BACKOFF, FLEX_TIMEOUT, FlexProvider, flex_refused, flex_unsupported
from .lane import BatchLane
from .results import Poll
from .resume import Owns
from .store import JobStore

__all__ = ["LaneRouter", "OnJob", "lanes_of", "offered_lanes"]

#: Told each job made for one call and the lane it goes through (``"flex"``, or
#: ``"realtime"`` after flex refused it): the drop-in client charges usage by job.
OnJob = Callable[[Job, str], object]


def _untold(job: Job, lane: str) -> None:
    """No one listens for a call's jobs."""


class LaneRouter:
    """Sends each call of one function to its lane (see the module doc).

    Args:
        engine: The function's real-time engine.

    Raises:
        ConfigurationError: ``lane=`` names a lane the provider does not offer, or
            ``batch_client=`` is not a client of the function's provider.
    """

    def __init__(self, engine: Engine, *, observers: Sequence[GroupObserver] = ()) -> None:
        self.engine = engine
        self.deferred = _deferred(engine.spec, engine.options.batch_client)
        self.offered = self.lanes = offered_lanes(self.deferred)
        check_lane(engine.options.lane, self.lanes)
        self.times = LaneTimes(collect=engine.options.batch_window)
        self.observers = observers
        self._flex: Engine | None = None
        self._batches: dict[str | None, BatchLane] = {}

    def lane_for(self, asked: str | None, budget: float | None) -> Lane:
        """The lane of a call asking for ``asked`` (``None``: the function's ``lane=``)
        with ``budget`` (its own, or ``None``: the engine's).

        Raises:
            ConfigurationError: ``asked`` names no lane, or one the provider lacks.
        """
        lane = self.engine.options.lane if asked is None else check_lane(asked, self.offered)
        if lane == "realtime":
            return Lane.REALTIME
        chosen = choose_lane(lane, self.engine.budget_of(budget), self.lanes, self.times)
        return Lane.REALTIME if chosen not in self.lanes else chosen

    def submit(
        self,
        item: Any,
        *,
        budget: float | None = None,
        partition: Hashable = None,
        lane: str | None = None,
    ) -> Awaitable[Any]:
        """One call: what to await for ``item``'s own validated output, from the lane its
        budget allows (``lane``: the lane it asks for, else the function's ``lane=``).
        The lane is chosen now; the lane's own awaitable is returned (no coroutine more)."""
        chosen = self.lane_for(lane, budget)
        if chosen is Lane.BATCH:
            return self.batch_lane().submit(item)
        if chosen is Lane.FLEX:
            return self.flex(item, budget=budget, partition=partition)
        return self.engine.call(item, budget=budget, partition=partition)

    async def flex(
        self,
        item: Any,
        *,
        budget: float | None = None,
        partition: Hashable = None,
        on_job: OnJob | None = None,
    ) -> Any:
        """``item``'s own validated output through the flex lane, or real time where flex
        refuses it (see the module doc). ``on_job`` is told each job made for the call
        and its lane, in order: the last one is the one that answered."""
        engine, flex = self.engine, self.flex_lane()
        job = flex.new_job(item, budget=engine.budget_of(budget), partition=partition)
        told = on_job or _untold
        told(job, "flex")
        return await engine.answer(
            job, ask=lambda carried: self._flex_first(flex, job, carried, told)
        )

    async def _flex_first(self, flex: Engine, job: Job, carried: Carried, told: OnJob) -> Any:
        """``job`` through flex processing. A refusal for capacity is asked in flex
        again after a backoff while the call's budget allows flex; then (or at once for
        a model without flex) the call goes to real time with what is left of its
        budget. ``carried`` learns the requests of every lane and the one that answered;
        ``told`` each new job."""
        carried.lane = "flex"
        deadline, jobs, left = job.deadline, [job], [math.inf]

        def again(state: RetryCallState) -> bool:
            """tenacity's ``retry``: after a refusal for capacity, while the budget allows."""
            error = state.outcome.exception() if state.outcome else None
            if not isinstance(error, Exception) or not flex_refused(error):
                return False
            left[0] = deadline - anyio.current_time()
            if flex_unsupported(error):
                self.lanes = self.lanes - {Lane.FLEX}  # not asked again
                return False
            return flex_again(left[0], FLEX_BACKOFF(state), state.attempt_number, self.times)

        def renew(state: RetryCallState) -> None:
            """Each attempt after the first is a new job, with what is left of the budget."""
            if state.attempt_number > 1:
                again_job = flex.new_job(
                    job.item, budget=_budget(deadline), partition=job.partition
                )
                jobs.append(again_job)
                told(again_job, "flex")

        retrying = AsyncRetrying(
            retry=again,
            wait=FLEX_BACKOFF,
            before=renew,
            before_sleep=lambda _: self.engine.recorder.flex_retried(),
            sleep=anyio.sleep,
        )

        async def ask() -> Any:
            return await flex.ask(jobs[-1], carried)

        try:
            return await retrying(ask)
        except Exception as exc:
            if not flex_refused(exc) or not self.engine.in_time(jobs[-1], left[0]):
                raise
        return await self._realtime_after_flex(jobs[-1], carried, left[0], told)

    async def _realtime_after_flex(
        self, job: Job, carried: Carried, left: float, told: OnJob
    ) -> Any:
        """``job``, which flex refused, asked in real time with ``left`` seconds."""
        engine = self.engine
        engine.recorder.fell_back()
        again = engine.new_job(
            job.item, budget=left if math.isfinite(left) else None, partition=job.partition
        )
        told(again, "realtime")
        carried.lane = "realtime"
        return await engine.ask(again, carried)

    def flex_lane(self) -> Engine:
        """The function's flex lane (see the module doc), made on first use."""
        if self._flex is None:
            spec, options = self.deferred, self.engine.options
            flex_spec = dataclasses.replace(
                spec,
                provider=FlexProvider(spec.provider),
                request_options={**spec.request_options, "service_tier": "flex"},
            )
            flex_options = options.replace(
                lane="realtime",
                latency_budget=None,
                max_wait=options.batch_window,
                timeout=options.timeout or FLEX_TIMEOUT,
            )
            recorder = self.engine.recorder
            self._flex = Engine(
                flex_spec, flex_options, recorder=recorder, observers=self.observers, lane="flex"
            )
        return self._flex

    def batch_lane(
        self, name: str | None = None, adopts: Owns | None = None, store: JobStore | None = None
    ) -> BatchLane:
        """The function's batch lane, opened (and its store) on first use.

        Args:
            name: A lane of its own under this name instead (the drop-in client keeps
                one per partition and credential): its items are keyed by this name, so
                they are apart from every other lane's in the store.
            adopts: The unfinished jobs of the store that lane finishes when it opens
                (``None``: those carrying only its own items).
            store: The store, open (default: the ``store=`` option's, opened now).
        """
        lane = self._batches.get(name)
        if lane is None:
            engine, options = self.engine, self.engine.options
            given = options.store if store is None else store
            store = given if isinstance(given, JobStore) else JobStore(given)
            lines = StatisticsListener(engine.recorder, engine.footprint, lane="batch")
            spec = self.deferred if name is None else dataclasses.replace(self.deferred, name=name)
            lane = self._batches[name] = BatchLane(
                spec,
                store,
                window=options.batch_window,
                per_line=options.most_items,
                max_attempts=options.max_attempts,
                pays_from=lambda: engine.pays_from,
                poll=Poll.every(_poll_interval(options)),
                recorder=engine.recorder,
                record_line=lines.line_done,
                adopts=adopts,
                screen=engine.screen,
            )
        return lane

    async def aclose(self) -> None:
        """Close every lane opened: send what waits, wait for it, refuse new calls."""
        await self.engine.aclose()
        if self._flex is not None:
            await self._flex.aclose()
        for lane in list(self._batches.values()):
            await lane.aclose()


def _budget(deadline: float) -> float | None:
    """The budget left now before ``deadline`` (``None``: no deadline)."""
    return deadline - anyio.current_time() if math.isfinite(deadline) else None


def _poll_interval(options: Options) -> float:
    """The longest wait between two polls of a batch (``poll_interval=``)."""
    return float(options.poll_interval)


def _deferred(spec: FunctionSpec, client: Any) -> FunctionSpec:
    """The function as the deferred lanes ask it: through ``client`` if given (the same
    provider's SDK, with its own API key), else through the function's own.

    Raises:
        ConfigurationError: ``client`` is not a client of the function's provider.
    """
    if client is None:
        return spec
    provider = as_provider(client)
    ours, theirs = (getattr(p, "batch_api", None) for p in (spec.provider, provider))
    if ours is None or theirs != ours:
        raise ConfigurationError(
            f"batch_client= must be an async client of the same provider as client= ({ours}),"
            f" for its batch API; got {client!r}"
        )
    return dataclasses.replace(spec, provider=provider)


def offered_lanes(spec: FunctionSpec) -> frozenset[Lane]:
    """Real time always; the batch lane where the provider has a batch API; flex on
    OpenAI's (a model without flex refuses it, and its calls then stay in real time)."""
    return lanes_of(spec.provider)


def lanes_of(provider: Any) -> frozenset[Lane]:
    """The lanes ``provider`` offers (see :func:`offered_lanes`)."""
    api = getattr(provider, "batch_api", None)
    if api == "openai":
        return frozenset(Lane)
    if api == "anthropic":
        return frozenset({Lane.REALTIME, Lane.BATCH})
    return frozenset({Lane.REALTIME})
