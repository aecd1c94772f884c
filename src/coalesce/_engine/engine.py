"""The engine under ``@coalesce.prompt`` and ``coalesce.wrap``: one LLM function's calls.

An :class:`Engine` owns a function's :class:`~coalesce._engine.spec.FunctionSpec` and
:class:`~coalesce._engine.spec.Options`, and everything that serves its calls:

* a :class:`~coalesce.Batcher` that groups the calls (with a
  :class:`~coalesce._planning.policy.BudgetPolicy` when a latency budget is declared);
* the group runner, :func:`~coalesce._engine.group.run_group`, which asks the provider;
* the runner's listeners: statistics, the planner, and any the caller adds (the
  drop-in client's usage shares).

``await engine.submit(item)`` is one call. The decorator and the drop-in client only
translate their callers' arguments into items and the results back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cached_property, partial
from typing import Any

import anyio

from .._accuracy.shadow import ShadowGuard
from .._accuracy.trust import SchemaTrust, declared_enforcement
from .._accuracy.vote import MISSING, VoteCosts, agreed, settled
from .._batching.batcher import Batcher, Resolve
from .._batching.policy import DispatchReason
from .._batching.stats import BatcherStatistics
from .._calls import GroupObserver, Job, Observers, RequestReport, Retry
from .._exceptions import CoalesceWarning, ConfigurationError, InvalidInputError
from .._lanes.choose import Lane, LaneTimes, check_lane, choose_lane
from .._lanes.flex import FLEX_TIMEOUT, FlexProvider, flex_refused, flex_unsupported
from .._lanes.lane import BatchLane
from .._lanes.store import JobStore
from .._observe.events import option_changes
from .._observe.listeners import StatisticsListener, request_predictor
from .._observe.recorder import PromptRecorder, PromptStatistics
from .._planning.cost import PackingCost, voting_pays
from .._planning.footprint import Footprint, footprint
from .._planning.planner import PlanLimits
from .._planning.policy import BudgetPolicy
from .._planning.state import Planning
from .._planning.tokens import TokenEstimator, bounded_output_tokens, estimator_for
from .._pricing import PromptCache
from .._validate import check_seconds
from ..providers._client import as_provider
from .admission import ContextPolicy, admission_for, encode_item
from .group import Group, packs, run_group, run_plain
from .spec import FunctionSpec, Options, keyed_replies

__all__ = ["DEFAULT_EXPECTED_OUTPUT_TOKENS", "Engine", "budget_override", "latency_budget"]

#: Output tokens per item the planner assumes before it has seen any reply.
DEFAULT_EXPECTED_OUTPUT_TOKENS = 50

budget_override: ContextVar[float | None] = ContextVar("coalesce_latency_budget", default=None)


@contextmanager
def latency_budget(seconds: float | None) -> Iterator[None]:
    """Override the latency budget of the ``coalesce.prompt`` and ``coalesce.wrap`` calls
    made inside.

    ``with coalesce.latency_budget(0.5): await tag(ticket)`` gives that call 0.5 s,
    keeping the function's signature untouched. ``None`` restores each function's own
    budget. (Planning itself is switched on by a function's ``latency_budget=``.)

    Raises:
        ConfigurationError: If ``seconds`` is not a positive number or None.
    """
    value = check_seconds("latency_budget", seconds, positive=True, optional=True)
    token = budget_override.set(value)
    try:
        yield
    finally:
        budget_override.reset(token)


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
        self.estimator = estimator = options.token_estimator or estimator_for(spec.model)
        shape = {"structured": spec.provider.structured, "keyed": keyed_replies(spec, options)}
        self.footprint = footprint(spec.instructions, spec.output_schema, estimator, **shape)
        unpinned = footprint(spec.instructions, spec.output_schema, estimator, pin=False, **shape)
        self.recorder = recorder or PromptRecorder(
            spec.name, spec.model, prices=options.prices, on_event=options.on_event
        )
        self.trust = SchemaTrust(declared_enforcement(spec.provider, options.schema_enforced))
        self.planning = _planning(spec, options, self.footprint, estimator, self.trust.enforced)
        self.admission = admission_for(
            spec, options, self.footprint, estimator, DEFAULT_EXPECTED_OUTPUT_TOKENS
        )
        listeners: list[GroupObserver] = [
            StatisticsListener(
                self.recorder, self.footprint, self._learn_cache, unpinned, lane=lane
            ),
            self.trust,
            self.admission.window,
        ]
        if self.planning is not None:
            listeners.append(self.planning)
        self.vote_costs = VoteCosts(self._answer_tokens, self.footprint, estimator.count)
        if options.vote:
            listeners.append(self.vote_costs)
        observer = Observers(*listeners, *observers)
        self.cost = self._packing_cost()
        self.deferred = _deferred(spec, options.batch_client)
        self.lanes = offered_lanes(self.deferred)
        check_lane(options.lane, self.lanes)
        self.lane_times = LaneTimes(collect=options.batch_window)
        self._batch_lane: BatchLane | None = None
        self._flex: Engine | None = None
        self._group = Group(
            spec, options, observer, self.planning, self.trust, self.cost, cache_key(spec)
        )
        self.shadow = _shadow_guard(options)
        self.recorder.max_items = options.max_items
        if self.shadow is not None:
            self.recorder.watch(self.shadow)
        # Shadow calls (one item, asked as a plain call) and vote=True's second orders
        # and settling plain calls: counted apart, they save nothing.
        self._shadow_group = self._apart(_ShadowListener(self.recorder))
        self._vote_group = self._apart(
            Observers(_VoteListener(self.recorder), self.vote_costs), reverse=True
        )
        self.batcher: Batcher[Job, Any] = self._new_batcher()

    def _apart(self, observer: GroupObserver, *, reverse: bool = False) -> Group:
        """The function's group, its requests counted by ``observer`` alone: they plan
        nothing and save nothing."""
        return dataclasses.replace(
            self._group, observer=observer, planning=None, cost=None, reverse=reverse
        )

    def _new_batcher(self) -> Batcher[Job, Any]:
        options = self.options
        return Batcher(
            self._run,
            # When no group can pay for its packing, calls go at once, plain.
            max_wait=options.max_wait if self.pays_from is not None else 0.0,
            max_items=options.max_items,
            max_concurrency=options.max_concurrency,
            partition=_partition,
            name=self.spec.name,
            policy=ContextPolicy(
                self.admission,
                None if self.planning is None else BudgetPolicy(self.planning),
                None if self.shadow is None else self._cap,
            ),
            on_dispatch=self._dispatched,
            resolve_early=True,
        )

    def _packing_cost(self) -> PackingCost:
        """Whether packing pays for the function; warns once if it never does."""
        spec, options = self.spec, self.options
        cost = PackingCost(
            self.footprint,
            self.recorder.price,
            options.max_items,
            declared_cache(spec),
            auto=options.packing == "auto",
        )
        self.recorder.smallest_paying_group = cost.smallest
        if cost.smallest is None and options.max_items > 1:  # 1: packing is off anyway
            _warn_packing_cannot_pay(spec, self.footprint, options.max_items)
        return cost

    @property
    def pays_from(self) -> int | None:
        """The smallest group packing pays for, or ``None`` if none does."""
        return self.cost.smallest

    def _learn_cache(self, cached_tokens: int) -> int:
        """Note a reply's cached tokens; the prompt tokens a plain call would read from
        a warm cache (for the statistics' plain-call baseline)."""
        if self.cost.saw_cached(cached_tokens):
            self.recorder.smallest_paying_group = self.pays_from
        return self.cost.plain_cached_tokens()

    def new_job(self, item: Any, *, budget: float | None = None, partition: Hashable = None) -> Job:
        """A call of ``item`` made now, not yet submitted.

        Its budget is ``budget`` if given, else the one :func:`latency_budget` set around
        the call, else the engine's ``latency_budget``.

        Raises:
            InvalidInputError: The item is not strict JSON, or too large for the model's
                context window (see :mod:`coalesce._engine.admission`): only this call fails.
        """
        budget = self.budget_of(budget)
        now = anyio.current_time()
        deadline = now + (budget if budget is not None else math.inf)
        try:
            key, size = encode_item(item)
            job = Job(item, key, deadline, arrival=now, budget=budget, partition=partition)
            if self.planning is not None:
                job.plan = self.planning.plan_item(item, partition, deadline, now)
            self.admission.admit(job, size)
        except InvalidInputError:
            self.recorder.call_finished(0.0, budget=budget, ok=False)  # refused at once
            raise
        return job

    def budget_of(self, budget: float | None) -> float | None:
        """A call's budget: its own, else the :func:`latency_budget` block's, else the
        engine's ``latency_budget``."""
        if budget is None:
            budget = budget_override.get()
        return self.options.latency_budget if budget is None else budget

    async def answer(self, job: Job, *, flex: Engine | None = None) -> Any:
        """Submit ``job`` and await its own result, recording the call.

        With ``flex`` (the function's flex lane), ``job`` is that engine's and goes
        there first (see :meth:`_flex_first`)."""
        ok = False
        try:
            result = await (self.batcher(job) if flex is None else self._flex_first(flex, job))
            ok = True
        finally:
            wait = None if job.dispatched_at is None else job.dispatched_at - job.arrival
            latency = anyio.current_time() - job.arrival
            self.recorder.call_finished(
                latency,
                wait=wait,
                budget=job.budget,
                ok=ok,
                requests=job.requests,
                attempts=job.attempts,
                lane=job.lane,
            )
        return result

    async def _flex_first(self, flex: Engine, job: Job) -> Any:
        """``job`` through flex processing; if flex refuses it (no capacity, or no flex
        for the model), through real time with what is left of its budget."""
        job.lane = "flex"
        try:
            return await flex.batcher(job)
        except Exception as exc:
            if flex_unsupported(exc):
                self.lanes = self.lanes - {Lane.FLEX}  # not asked again
            left = job.deadline - anyio.current_time()
            if not flex_refused(exc) or not self._in_time(job, left):
                raise
        self.recorder.fell_back()
        budget = left if math.isfinite(left) else None
        again = self.new_job(job.item, budget=budget, partition=job.partition)
        job.lane = "realtime"
        try:
            return await self.batcher(again)
        finally:
            job.requests += again.requests
            job.attempts += again.attempts

    async def submit(
        self, item: Any, *, budget: float | None = None, partition: Hashable = None
    ) -> Any:
        """One call: ``item``'s own validated output (see :meth:`new_job` for the budget).

        A call whose budget allows it goes to the batch lane (``lane=``, see
        :mod:`coalesce._lanes.choose`)."""
        if self.options.lane != "realtime":
            budget = self.budget_of(budget)
            lane = choose_lane(self.options.lane, budget, self.lanes, self.lane_times)
            if lane is Lane.BATCH:
                return await self.batch_lane().submit(item)
            if lane is Lane.FLEX and Lane.FLEX in self.lanes:
                flex = self.flex_lane()
                job = flex.new_job(item, budget=budget, partition=partition)
                return await self.answer(job, flex=flex)
        return await self.answer(self.new_job(item, budget=budget, partition=partition))

    def _in_time(self, job: Job, left: float) -> bool:
        """Whether real time may still answer ``job`` with ``left`` seconds (as the
        planner predicts a request of it alone, when it plans)."""
        if left <= 0 or self.planning is None or not math.isfinite(left):
            return left > 0
        now = anyio.current_time()
        plan = self.planning.plan_item(job.item, job.partition, job.deadline, now)
        return request_predictor(self.planning)([plan]) <= left

    def flex_lane(self) -> Engine:
        """The function's flex lane: an engine asking with ``service_tier="flex"``,
        grouping for ``batch_window`` with no latency planning, sharing this engine's
        recorder (its requests billed at the flex price)."""
        if self._flex is None:
            spec, options = self.deferred, self.options
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
            self._flex = Engine(flex_spec, flex_options, recorder=self.recorder, lane="flex")
        return self._flex

    def batch_lane(self) -> BatchLane:
        """The function's batch lane, opened (and its store) on first use."""
        if self._batch_lane is None:
            given = self.options.store
            store = given if isinstance(given, JobStore) else JobStore(given)
            lines = StatisticsListener(self.recorder, self.footprint, lane="batch")
            self._batch_lane = BatchLane(
                self.deferred,
                store,
                window=self.options.batch_window,
                per_line=self.options.max_items,
                max_attempts=self.options.max_attempts,
                pays_from=lambda: self.pays_from,
                recorder=self.recorder,
                record_line=lines.line_done,
            )
        return self._batch_lane

    def statistics(self) -> PromptStatistics:
        """The recorder's snapshot (see :class:`~coalesce.PromptStatistics`)."""
        return self.recorder.snapshot()

    def batcher_statistics(self) -> BatcherStatistics:
        """The batcher's counters (windows, waits, dispatch reasons)."""
        return self.batcher.statistics()

    async def aclose(self) -> None:
        """Send every pending call now, wait for all of them, refuse new calls."""
        await self.batcher.aclose()
        if self._flex is not None:
            await self._flex.aclose()
        if self._batch_lane is not None:
            await self._batch_lane.aclose()

    async def _run(self, jobs: list[Job], resolve: Resolve) -> None:
        started = anyio.current_time()
        for job in jobs:
            job.dispatched_at = started
        ask: Callable[[list[Job], Resolve], Awaitable[None]] = partial(run_group, self._group)
        if self.options.vote and packs(self._group, len(jobs)):
            # Two orders where that costs less than plain calls; else plain calls.
            ask = self._voted if self._voting_pays(jobs) else partial(run_plain, self._group)
        if self.shadow is None:
            await ask(jobs, resolve)
            return
        answers: dict[int, Any] = {}

        def keep(index: int, outcome: Any) -> None:
            answers[index] = outcome
            resolve(index, outcome)

        await ask(jobs, keep)
        # Every caller has its answer: shadow a sample of the packed ones, after.
        async with anyio.create_task_group() as tg:
            for index, answer in answers.items():
                job = jobs[index]
                if not isinstance(answer, BaseException) and self.shadow.wants(job.company):
                    tg.start_soon(self._check, job, answer)

    def _cap(self) -> int:
        return self.options.max_items if self.shadow is None else self.shadow.cap

    @cached_property
    def _answer_tokens(self) -> int:
        """Tokens one answer is expected to take before any reply: declared, bounded
        by the output type (a classification), or the planner's default."""
        schema, estimator = self.spec.output_schema, self.estimator
        expected = self.options.expected_output_tokens or bounded_output_tokens(schema, estimator)
        return expected or DEFAULT_EXPECTED_OUTPUT_TOKENS

    def _voting_pays(self, jobs: list[Job]) -> bool:
        cost, learned = self.cost, self.vote_costs
        expected = learned.answer_tokens()
        return voting_pays(
            cost.costs,
            cost.price,
            cost.cache,
            item_tokens=sum(self.estimator.count(job.key) for job in jobs),
            output_tokens=len(jobs) * expected,
            items=len(jobs),
            disagreement=self.recorder.vote_disagreement(),
            overheads=learned.overheads(),
        )

    async def _voted(self, jobs: list[Job], resolve: Resolve) -> None:
        """``vote=True``: ask the group in both orders at once; where the answers
        differ, ask the item alone if its budget leaves time (see :mod:`coalesce._accuracy.vote`)."""
        twins = [Job(job.item, job.key, job.deadline, arrival=job.arrival) for job in jobs]
        self.recorder.voted(len(jobs))
        first: dict[int, Any] = {}
        second: dict[int, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_group, self._group, jobs, first.__setitem__)
            tg.start_soon(run_group, self._vote_group, twins, second.__setitem__)

        async def settle(index: int) -> None:
            one, other = first.get(index, MISSING), second.get(index, MISSING)
            alone: list[Any] = []
            job = jobs[index]
            if agreed(one, other, self.options.agree) is False:
                in_time = self._in_time(job, job.deadline - anyio.current_time())
                if in_time:  # else the usual order's answer, as without vote
                    lone = Job(job.item, job.key, job.deadline, arrival=job.arrival)
                    await run_group(self._vote_group, [lone], lambda _, o: alone.append(o))
                self.recorder.vote_settled(in_time)
            resolve(index, settled(one, other, *alone[:1]))

        async with anyio.create_task_group() as tg:
            for index in range(len(jobs)):
                tg.start_soon(settle, index)

    async def _check(self, job: Job, packed: Any) -> None:
        """Ask ``job``'s item alone and judge the packed answer against it."""
        assert self.shadow is not None
        alone = Job(job.item, job.key, math.inf, arrival=anyio.current_time())
        plain: list[Any] = []
        await run_group(self._shadow_group, [alone], lambda _, outcome: plain.append(outcome))
        if plain and not isinstance(plain[0], BaseException):
            agreed = self.shadow.record(job.company, packed, plain[0])
            self.recorder.shadow_judged(job.company, agreed, self.shadow.cap)

    def _dispatched(self, reason: DispatchReason, jobs: Sequence[Job]) -> None:
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

    def __repr__(self) -> str:
        limit = self.options.max_items if self.planning is None else self.planning.limits.max_items
        early = self.options.stream and self.trust.enforced
        waiting = self.batcher.statistics().queue_depth
        return (
            f"<coalesce.Engine {self.spec.name} model={self.spec.model!r}"
            f"{option_changes(self.options)}: {self.recorder.summary(waiting)},"
            f" groups up to {limit}, answers {'stream early' if early else 'held'}>"
        )


def _shadow_guard(options: Options) -> ShadowGuard | None:
    """The function's shadow guard, if it asked for one (``shadow=``) and packs."""
    if options.shadow <= 0 or options.max_items < 2:
        return None
    return ShadowGuard(options.shadow, options.min_agreement, options.max_items, options.agree)


class _ShadowListener:
    """Counts shadow calls apart: their cost is spent, and they save nothing."""

    kind = "shadow"

    def __init__(self, recorder: PromptRecorder) -> None:
        self.recorder = recorder

    def request_sent(self, slots: Any, reask: bool) -> None:
        """Nothing to count before the reply."""

    def request_done(self, report: RequestReport) -> None:
        """Count the call and its cost."""
        completion = report.completion
        self.recorder.extra_done(self.kind, None if completion is None else completion.usage)

    def retrying(self, retry: Retry) -> None:
        """Retries of shadow calls are not counted."""

    def group_done(self, jobs: Sequence[Job]) -> None:
        """Nothing to count."""


class _VoteListener(_ShadowListener):
    """Counts the second order's requests and the settling plain calls apart."""

    kind = "vote"


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
    api = getattr(spec.provider, "batch_api", None)
    if api == "openai":
        return frozenset(Lane)
    if api == "anthropic":
        return frozenset({Lane.REALTIME, Lane.BATCH})
    return frozenset({Lane.REALTIME})


def declared_cache(spec: FunctionSpec) -> PromptCache | None:
    """The prompt cache the provider declares for the function's model, if any."""
    declare = getattr(spec.provider, "prompt_cache", None)
    cache = declare(spec.model) if callable(declare) else None
    return cache if isinstance(cache, PromptCache) else None


def cache_key(spec: FunctionSpec) -> str:
    """A stable name for the function's shared prefix: its model, instructions and
    output schema (the same function in every process shares one cache entry)."""
    schema = json.dumps(spec.output_schema, sort_keys=True, default=str)
    digest = hashlib.sha256(f"{spec.model}\0{spec.instructions}\0{schema}".encode())
    return f"coalesce-{digest.hexdigest()[:16]}"


def _warn_packing_cannot_pay(spec: FunctionSpec, costs: Footprint, max_items: int) -> None:
    warnings.warn(
        f"{spec.name}: packing cannot pay for this function: each plain call pays"
        f" ~{costs.plain_shared} shared tokens (instructions and output schema), while"
        f" each packed item adds ~{costs.item_frame} in and ~{costs.answer_frame} out and"
        f" a packed request ~{costs.shared} shared; no group of up to {max_items} costs"
        " less than plain calls. Its calls are sent at once, as plain calls. Longer"
        " shared instructions (or a larger max_items) make packing pay.",
        CoalesceWarning,
        stacklevel=5,
    )


def _planning(
    spec: FunctionSpec,
    options: Options,
    costs: Footprint,
    estimator: TokenEstimator,
    early_answers: bool,
) -> Planning | None:
    """A budget planner for the function, if it declared a latency budget.

    ``early_answers``: streamed answers are handed over as each completes (the provider
    is trusted to enforce the schema); otherwise every caller waits for the whole reply.
    """
    if options.latency_budget is None:
        return None
    limits = PlanLimits(
        max_items=options.max_items,
        max_wait=options.max_wait,
        shared_tokens=costs.shared,
        max_output_tokens=options.max_output_tokens,
        per_item_overhead_tokens=costs.item_frame,
        per_item_output_overhead_tokens=costs.answer_frame,
        streaming=options.stream and early_answers,
    )
    # A bounded output (a classification, say) has a known longest answer.
    prior = options.expected_output_tokens or bounded_output_tokens(spec.output_schema, estimator)
    return Planning(
        limits, prior or DEFAULT_EXPECTED_OUTPUT_TOKENS, options.latency_prior, estimator
    )


def _partition(job: Job) -> Hashable:
    return job.partition
