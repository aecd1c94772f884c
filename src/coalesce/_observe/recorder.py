"""Statistics of LLM calls: the counters, the quantiles and their snapshot.

One :class:`PromptRecorder` per decorated function (or wrapped client) is told what
happened, with the times already measured: the recorder reads no clock and needs no
event loop, so tests feed it hand-written numbers. It keeps counters and sliding
windows for :meth:`PromptRecorder.snapshot` and hands the rest to its parts: the
tokens and dollars to :class:`~coalesce._observe.savings.Savings`, each happening, as
a small frozen event, to an :class:`~coalesce._observe.events.EventSink` (the
``on_event`` hook and the ``"coalesce"`` logger), and to
:class:`~coalesce._observe.telemetry.Telemetry` when ``opentelemetry-api`` is
installed. Other bookkeeping adds its fields to the snapshot as a
:class:`StatisticsPart` (:meth:`PromptRecorder.add_part`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, TypeVar

from .._batching.quantile import WindowQuantile
from .._pricing import Price, price_of
from ..providers import Usage
from .agreement import Agreement, CapLearning, merged_agreement
from .events import (
    CallEvent,
    ContradictionEvent,
    DisagreementAlarm,
    DispatchEvent,
    Event,
    EventHook,
    EventSink,
    RequestEvent,
    RequestLabel,
    RetryEvent,
    ShadowEvent,
    UnmeetableEvent,
    plural,
)
from .savings import Savings, Shares, lane_cost
from .telemetry import Telemetry

__all__ = [
    "CallEvent",
    "ContradictionEvent",
    "Counts",
    "DisagreementAlarm",
    "DispatchEvent",
    "Event",
    "EventHook",
    "PromptRecorder",
    "PromptStatistics",
    "RequestEvent",
    "RetryEvent",
    "ShadowEvent",
    "StatisticsPart",
    "UnmeetableEvent",
    "merge_parts",
    "statistics_table",
]

P = TypeVar("P", bound="StatisticsPart")

#: A request reported without saying which one it was.
UNLABELLED = RequestLabel()

#: Calls (and requests) the latency, wait and TTFT quantiles are computed over.
DEFAULT_WINDOW = 4096


class PromptStatistics(NamedTuple):
    """An immutable snapshot of an LLM function's statistics.

    Times are in seconds; quantiles cover the most recent 4096 calls (or requests,
    for the time to first token) and are NaN before any. Costs are estimates in US
    dollars from the model's :class:`~coalesce.Price`, NaN when the model has no
    price, and count only requests whose provider reported token usage.
    """

    #: Calls finished, with a result or an exception.
    calls: int
    #: Calls finished with an exception.
    calls_failed: int
    #: Median latency of a call, from the call to its result.
    latency_p50: float
    #: 95th percentile call latency.
    latency_p95: float
    #: 99th percentile call latency.
    latency_p99: float
    #: Fraction of calls with a budget that got their result within it (NaN if no
    #: call had a budget).
    within_budget: float
    #: Calls, with a budget, that finished (result or exception) after it ran out.
    budget_misses: int
    #: Calls whose budget was already shorter than the predicted latency of asking
    #: for them alone.
    unmeetable_budgets: int
    #: Median wait for company, from the call to its first request.
    wait_p50: float
    #: 95th percentile wait.
    wait_p95: float
    #: 99th percentile wait.
    wait_p99: float
    #: Median time to the first reply token of a streamed request.
    ttft_p50: float
    #: 95th percentile time to first token.
    ttft_p95: float
    #: Requests sent (re-asks included, retries not counted twice), counted as each
    #: is sent: exact while replies stream. Their tokens and cost are added when each
    #: reply ends.
    requests: int
    #: Requests that failed as a whole after their retries.
    requests_failed: int
    #: Requests sent whose reply has not ended yet.
    requests_in_flight: int
    #: Mean items per request sent (NaN before any).
    items_per_request: float
    #: Prompt tokens the provider reported, cached ones included (shadow and vote
    #: requests too: they are spent).
    input_tokens: int
    #: Of those, tokens served from the provider's prompt cache.
    cached_input_tokens: int
    #: Reply tokens the provider reported.
    output_tokens: int
    #: Prompt tokens the same items would have used as plain calls, one per request,
    #: without coalesce (the instructions and output schema paid once per item, no
    #: packing format or frames): an estimate.
    input_tokens_one_per_item: int
    #: Estimated dollars spent.
    estimated_cost: float
    #: Estimated dollars the same items would have cost sent one per request.
    estimated_cost_one_per_item: float
    #: ``1 - estimated_cost / estimated_cost_one_per_item`` (NaN if either is unknown
    #: or zero); re-asks count against it.
    savings: float
    #: Groups dispatched, by reason (``"full"``, ``"window"``, ...).
    dispatch_reasons: Mapping[str, int]
    #: Requests sent again after failing as a whole (429, 5xx, timeouts...).
    retries: int
    #: Items asked again after a reply missed or garbled their output.
    reasks: int
    #: Answers already handed to their callers that the rest of a streamed reply
    #: contradicted (see :class:`ContradictionEvent`); 0 unless a provider declared to
    #: enforce the reply schema did not.
    contradictions: int
    #: Exceptions raised by the ``on_event`` hook (logged, then ignored).
    hook_errors: int
    #: The smallest group whose packed request costs less than its members as plain
    #: calls (smaller groups are sent plain); ``None`` when no group can pay, and every
    #: call is sent plain, at once (see ``docs/budget.md``).
    smallest_paying_group: int | None = 2
    #: Calls finished, by the lane that answered them (``"realtime"``, ``"flex"``,
    #: ``"batch"``; see ``docs/lanes.md``).
    calls_by_lane: Mapping[str, int] = MappingProxyType({})
    #: Estimated dollars spent, by lane, each at its lane's price (flex and batch at
    #: half the list price); ``estimated_cost`` is their sum, and the one-per-item
    #: baseline is real-time plain calls at list price.
    cost_by_lane: Mapping[str, float] = MappingProxyType({})
    #: Calls sent to flex processing that it refused for lack of capacity (429
    #: ``resource_unavailable``) and that real time answered instead.
    flex_fallbacks: int = 0
    #: Plain calls made to check packed answers (``shadow=``), and their estimated
    #: dollars (included in ``estimated_cost``, not in the one-per-item baseline).
    shadow_requests: int = 0
    #: See ``shadow_requests``.
    shadow_cost: float = 0.0
    #: Per group size, how often the packed answer agreed with the same item asked
    #: alone, with a 95% interval (:class:`~coalesce.Agreement`); empty without
    #: ``shadow=``. Under ``wrap``, added up over the model's kinds of call.
    agreement_by_size: Mapping[int, Agreement] = MappingProxyType({})
    #: The most items a request may carry now: ``max_items``, or lower where the
    #: shadow calls found packed answers disagreeing with plain ones (under ``wrap``,
    #: the lowest of the model's kinds of call).
    group_cap: int | None = None
    #: How the group cap was learned (:class:`~coalesce.CapLearning`: the cap, its
    #: evidence, its last moves and where it is kept); ``None`` without a guard.
    cap_learning: CapLearning | None = None
    #: ``vote=True``: the requests asking packed groups again in the reverse order,
    #: and the plain calls settling the items whose two answers differed; their
    #: estimated dollars are in ``estimated_cost``, not in the one-per-item baseline.
    vote_requests: int = 0
    #: See ``vote_requests``.
    vote_cost: float = 0.0
    #: Items whose two orders' answers differed, each settled by a plain call.
    votes_settled: int = 0
    #: Items whose two orders' answers differed with no time left in their latency
    #: budget for a plain call: they got the usual order's answer.
    votes_unsettled: int = 0
    #: Calls sent to flex processing that it refused for lack of capacity and that
    #: were asked in flex again after a backoff (each asking again counted once).
    flex_retries: int = 0
    #: Batch jobs an earlier process submitted and left unfinished, which this one
    #: attached to and collected (see ``docs/lanes.md``). Their lines and cost are
    #: not this run's: they are counted here, and not in ``requests``, the tokens,
    #: ``estimated_cost`` or ``cost_by_lane``.
    adopted_jobs: int = 0
    #: The lines (requests) of those jobs that got a reply.
    adopted_requests: int = 0
    #: Their estimated dollars, at the batch price (NaN when the model has no price).
    adopted_cost: float = 0.0
    #: Calls finished that had a latency budget (``within_budget``'s denominator).
    calls_with_budget: int = 0
    #: Calls sent as plain calls (their item alone), by reason: ``"alone"`` (nobody
    #: else came within the window), ``"below_paying"`` (the group was smaller than
    #: ``smallest_paying_group``), ``"cold"`` (before any reply: the cold start's probe,
    #: or a group the prior sized too small), ``"screened"`` (the item reads like
    #: instructions), ``"pinned"`` (no group can pay: ``smallest_paying_group`` is
    #: ``None`` or the group cap stands below it); reasons never seen left out.
    plain_calls: Mapping[str, int] = MappingProxyType({})
    #: Prompt tokens of the shadow calls (``shadow_requests``): what checking, and
    #: learning the group cap, cost in tokens (part of ``input_tokens``).
    shadow_input_tokens: int = 0

    def __str__(self) -> str:
        """The main figures as a short aligned table (``repr`` stays the full tuple)."""
        return "\n".join(statistics_table(self))

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        # The read-only mappings cannot be pickled: a snapshot travels as its dict
        # (to combine the snapshots of several processes).
        return PromptStatistics.from_dict, (self.as_dict(),)

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain data: every field, its mappings as ``dict`` (group
        sizes as keys of ``agreement_by_size``, each an :class:`~coalesce.Agreement`);
        ``json.dumps`` writes it (NaN as ``NaN``). :meth:`from_dict` reads it back."""
        data: dict[str, Any] = dict(zip(self._fields, self, strict=True))
        for name in _MAPPINGS:
            data[name] = dict(getattr(self, name))
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptStatistics:
        """A snapshot from :meth:`as_dict`'s data, or that data through JSON (whose
        keys are strings and whose tuples are lists). Fields it lacks take their
        defaults."""
        fields = dict(data)
        for name in _MAPPINGS:
            if name in fields:
                fields[name] = MappingProxyType(_mapping(name, fields[name]))
        return cls(**fields)

    @classmethod
    def combine(cls, *snapshots: PromptStatistics) -> PromptStatistics:
        """The snapshots of several processes (or functions) as one: counts, tokens and
        costs add up, by key for the mappings, and the rates are recomputed from the
        sums. Quantiles cannot be added: a combined ``latency_p95`` (and every other
        ``_p50``/``_p95``/``_p99``) is the largest of the snapshots', an estimate that
        errs high (the quantile of all their calls lies between the smallest and the
        largest of the snapshots', up to the interpolation between two neighbouring
        values). ``smallest_paying_group`` and ``group_cap`` take the smallest given.

        Raises:
            ValueError: No snapshot given.
        """
        if not snapshots:
            raise ValueError("PromptStatistics.combine() needs at least one snapshot")
        return cls(**{name: _COMBINE[name](name, snapshots) for name in cls._fields})


class StatisticsPart(Protocol):
    """Bookkeeping kept outside the recorder that adds fields to its snapshot.

    Register one with :meth:`PromptRecorder.add_part`; see :func:`merge_parts` for
    how the fields of several parts combine.
    """

    def statistics(self) -> Mapping[str, Any]:
        """Values of :class:`PromptStatistics` fields, by field name."""
        ...


def merge_parts(parts: Sequence[StatisticsPart]) -> dict[str, Any]:
    """The fields of every part, each given by exactly one of them.

    A field has one source: the caller registers one part per group of fields, and a
    part that stands for several sources (the engines of ``wrap``'s kinds of call,
    sharing their model's recorder) combines them itself, in the way the field means
    (counts add up, caps take the lowest).

    Raises:
        ValueError: Two parts give the same field, or a part gives a name that is not
            a :class:`PromptStatistics` field.
    """
    merged: dict[str, Any] = {}
    for part in parts:
        fields = part.statistics()
        unknown = sorted(set(fields) - set(PromptStatistics._fields))
        twice = sorted(set(fields) & set(merged))
        if unknown or twice:
            problem = f"unknown fields {unknown}" if unknown else f"fields {twice} already given"
            raise ValueError(f"statistics part {part!r}: {problem}")
        merged.update(fields)
    return merged


class Counts:
    """The recorder's counters and sliding windows: what a snapshot counts.

    Args:
        window: How many recent calls (and streamed requests) the quantiles cover.
    """

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self._latency = WindowQuantile(window)
        self._wait = WindowQuantile(window)
        self._ttft = WindowQuantile(window)
        self._lane_calls: Counter[str] = Counter()
        self.calls = self.calls_failed = self.budgeted = self.within = self.misses = 0
        self.requests = self.requests_failed = self.in_flight = self.items = 0
        self.groups = self.reasks = self.retries = self.unmeetable = 0
        self.contradictions = self.fallbacks = self.flex_retries = 0
        self.adopted_jobs = self.adopted_requests = 0
        self.adopted_cost = 0.0

    def call(
        self, latency: float, wait: float | None, budget: float | None, ok: bool, lane: str
    ) -> None:
        """Count a finished call (see :meth:`PromptRecorder.call_finished`)."""
        self.calls += 1
        self._lane_calls[lane] += 1
        self.calls_failed += not ok
        self._latency.extend((latency,))
        if wait is not None:
            self._wait.extend((wait,))
        if budget is not None:
            self.budgeted += 1
            self.within += ok and latency <= budget
            self.misses += latency > budget

    def dispatched(self, reason: str) -> int:
        """Number a group dispatched for ``reason`` (the batcher counts the reasons);
        return its number."""
        self.groups += 1
        return self.groups

    def request_sent(self, items: int, reask: bool) -> int:
        """Count a request as it is sent; return its local number."""
        self.requests += 1
        self.items += items
        self.in_flight += 1
        self.reasks += items if reask else 0
        return self.requests

    def request_ended(self, *, ttft: float | None = None, failed: bool = False) -> None:
        """Count a request's reply ended (``ttft``: streamed), or the request failed."""
        self.in_flight = max(0, self.in_flight - 1)
        self.requests_failed += failed
        if ttft is not None:
            self._ttft.extend((ttft,))

    def statistics(self) -> dict[str, Any]:
        """The counts and quantiles as :class:`PromptStatistics` fields."""
        p50, p95, p99 = self._latency.quantiles(0.5, 0.95, 0.99)
        w50, w95, w99 = self._wait.quantiles(0.5, 0.95, 0.99)
        t50, t95 = self._ttft.quantiles(0.5, 0.95)
        requests = self.requests
        return {
            "calls": self.calls,
            "calls_failed": self.calls_failed,
            "latency_p50": p50,
            "latency_p95": p95,
            "latency_p99": p99,
            "within_budget": self.within / self.budgeted if self.budgeted else math.nan,
            "budget_misses": self.misses,
            "unmeetable_budgets": self.unmeetable,
            "wait_p50": w50,
            "wait_p95": w95,
            "wait_p99": w99,
            "ttft_p50": t50,
            "ttft_p95": t95,
            "requests": requests,
            "requests_failed": self.requests_failed,
            "requests_in_flight": self.in_flight,
            "items_per_request": self.items / requests if requests else math.nan,
            # The batchers count why groups left (one source): the engine adds them as
            # a part (see coalesce._observe.dispatch.DispatchReasons).
            "dispatch_reasons": MappingProxyType({}),
            "retries": self.retries,
            "reasks": self.reasks,
            "contradictions": self.contradictions,
            "calls_by_lane": MappingProxyType(dict(self._lane_calls)),
            "flex_fallbacks": self.fallbacks,
            "flex_retries": self.flex_retries,
            "adopted_jobs": self.adopted_jobs,
            "adopted_requests": self.adopted_requests,
            "adopted_cost": self.adopted_cost,
            "calls_with_budget": self.budgeted,
        }

    def summary(self, waiting: int = 0) -> str:
        """See :meth:`PromptRecorder.summary`."""
        calls = plural(self.calls, "call") + (f" ({waiting} waiting)" if waiting else "")
        flight = f" ({self.in_flight} in flight)" if self.in_flight else ""
        line = f"{calls}, {plural(self.requests, 'request')}{flight}"
        if self.requests:
            line += f", {self.items / self.requests:.1f} items/request"
        return line

    def __repr__(self) -> str:
        return f"<Counts {self.summary()}>"


class PromptRecorder:
    """Collects the statistics of one LLM function; see :class:`PromptStatistics`.

    Every method is synchronous and cheap; times are measured by the caller.

    Args:
        function: The decorated function's (or wrapped client's) name.
        model: The model name, for the price and the metric attributes.
        prices: A :class:`~coalesce.Price` for ``model``, or a table of prices
            consulted before :data:`~coalesce.DEFAULT_PRICES` (see
            :func:`~coalesce.price_for`).
        on_event: Called synchronously with each event; an exception it raises is
            logged on the ``"coalesce"`` logger and otherwise ignored.
        window: How many recent calls the quantiles cover.
        meter_provider: OpenTelemetry ``MeterProvider`` to record metrics with
            (default: the global one, if ``opentelemetry-api`` is installed).
        telemetry: Set ``False`` to record no OpenTelemetry metrics.
    """

    def __init__(
        self,
        function: str,
        model: str,
        *,
        prices: Price | Mapping[str, Price] | None = None,
        on_event: EventHook | None = None,
        window: int = DEFAULT_WINDOW,
        meter_provider: Any = None,
        telemetry: bool = True,
    ) -> None:
        self.function = function
        self.model = model
        self.savings = Savings(price_of(model, prices))
        self.events = EventSink(function, on_event)
        self.counts = Counts(window)
        self._telemetry = Telemetry.create(function, model, meter_provider) if telemetry else None
        self._parts: list[StatisticsPart] = []

    @property
    def price(self) -> Price | None:
        """The model's price, or ``None`` when unknown."""
        return self.savings.price

    def add_part(self, part: StatisticsPart) -> None:
        """Add ``part``'s fields to every snapshot (see :func:`merge_parts`).

        A registered part's fields replace the recorder's own values of those fields:
        that is how bookkeeping moves out of the recorder, one group of fields at a
        time. Two registered parts never give the same field.
        """
        self._parts.append(part)

    def part(self, kind: type[P], make: Callable[[], P]) -> P:
        """The registered part of type ``kind``, registering ``make()`` first if there
        is none: the engines that share a recorder (``wrap``'s kinds of call, a
        function's flex lane) share its parts."""
        for part in self._parts:
            if isinstance(part, kind):
                return part
        made = make()
        self.add_part(made)
        return made

    def call_finished(
        self,
        latency: float,
        *,
        wait: float | None = None,
        budget: float | None = None,
        ok: bool,
        requests: Sequence[str] = (),
        attempts: int = 0,
        lane: str = "realtime",
    ) -> None:
        """Record one finished call.

        Args:
            latency: Seconds from the call to its result or exception.
            wait: Seconds it waited before its first request was sent, if known.
            budget: Its latency budget, or ``None``.
            ok: Whether it got a result.
            requests: The ids of the requests that carried it, in order.
            attempts: How many requests carried it.
            lane: The lane that answered it.
        """
        self.counts.call(latency, wait, budget, ok, lane)
        if self._telemetry is not None:
            missed = budget is not None and latency > budget
            self._telemetry.call(latency, wait, ok, missed=missed)
        if self.events.watched():
            ids = tuple(requests)
            self.events.emit(
                CallEvent(self.function, self.model, latency, wait, budget, ok, ids, attempts)
            )

    def dispatched(
        self,
        reason: str,
        items: int,
        *,
        predicted: float | None = None,
        time_left: float | None = None,
    ) -> int:
        """Record a group of ``items`` calls dispatched for ``reason`` (a
        :class:`~coalesce.DispatchReason`); return its number. ``predicted``: the planner's
        seconds for a request carrying it; ``time_left``: of its tightest budget, if any."""
        reason = str(reason)
        group = self.counts.dispatched(reason)
        if self._telemetry is not None:
            self._telemetry.dispatched(reason)
        if self.events.watched():
            model = self.model
            self.events.emit(
                DispatchEvent(self.function, model, reason, items, group, predicted, time_left)
            )
        return group

    def request_sent(self, items: int, *, reask: bool = False) -> int:
        """Count one request of ``items`` items (``reask``: asking again for items an earlier
        reply failed) as it is sent; return its local number (1 for the function's first)."""
        return self.counts.request_sent(items, reask)

    def contradicted(self, ids: tuple[str, ...]) -> None:
        """Record delivered answers that the rest of their streamed reply contradicted."""
        self.counts.contradictions += len(ids)
        self.events.emit(ContradictionEvent(self.function, self.model, ids), logging.WARNING)

    def request_finished(
        self,
        items: int,
        usage: Usage | None,
        *,
        shared_input_tokens: int,
        plain_shared_input_tokens: int | None = None,
        frame_tokens: int = 0,
        answer_frame_tokens: int = 0,
        plain_cached_input_tokens: int = 0,
        ttft: float | None = None,
        seconds: float | None = None,
        reask: bool = False,
        label: RequestLabel = UNLABELLED,
        lane: str = "realtime",
    ) -> float:
        """Record the reply of one request (counted by :meth:`request_sent`); its cost.

        Args:
            items, usage: Items in its prompt; the tokens reported, or ``None``.
            shared_input_tokens: Prompt tokens sent once per request whatever its
                items (the instructions and the packing format, an estimate).
            plain_shared_input_tokens: What a plain call of one item pays besides its
                item; ``None``: the same as ``shared_input_tokens`` (the packed
                format's requests of one). See :class:`~coalesce._observe.savings.Shares`
                for it and the next three.
            frame_tokens, answer_frame_tokens: Tokens each item and each answer add
                besides their own (a plain call pays neither).
            plain_cached_input_tokens: What each plain call would read from a warm
                prompt cache: the baseline is the best plain alternative.
            ttft, seconds: Seconds to the first reply text (streamed), to its end.
            reask: Whether it asked again for items an earlier reply failed.
            label: Which request it was (its id, group, attempt and prediction).
            lane: Its lane, whose price (``LANE_PRICE``) it is billed at.
        """
        self.counts.request_ended(ttft=ttft)
        plain = (
            shared_input_tokens if plain_shared_input_tokens is None else plain_shared_input_tokens
        )
        shares = Shares(
            shared_input_tokens, plain, frame_tokens, answer_frame_tokens, plain_cached_input_tokens
        )
        spent, baseline, plain_input = self.savings.add(
            items, usage, shares, reask=reask, lane=lane
        )
        if self._telemetry is not None:
            self._telemetry.request(items, usage, ttft, seconds, spent, baseline, reask)
        if self.events.watched():
            f, m = self.function, self.model
            event = RequestEvent(
                f, m, items, usage, ttft, seconds, spent, baseline, reask, None, *label, plain_input
            )
            self.events.emit(event)
        return spent

    def request_failed(
        self,
        items: int,
        error: BaseException,
        *,
        seconds: float | None = None,
        reask: bool = False,
        label: RequestLabel = UNLABELLED,
    ) -> None:
        """Record one request that failed as a whole, after its retries (``seconds`` from
        sending; ``reask`` and ``label`` as :meth:`request_finished`'s)."""
        self.counts.request_ended(failed=True)
        if self._telemetry is not None:
            self._telemetry.request_failed(reask)
        if self.events.watched():
            f, m = self.function, self.model
            event = RequestEvent(
                f, m, items, None, None, seconds, math.nan, 0.0, reask, error, *label
            )
            self.events.emit(event)

    def retried(self, attempt: int, delay: float, error: BaseException | None = None) -> None:
        """Record that attempt ``attempt`` of a request failed and will be resent after ``delay``."""
        self.counts.retries += 1
        if self._telemetry is not None:
            self._telemetry.retried()
        if self.events.watched():
            self.events.emit(RetryEvent(self.function, self.model, attempt, delay, error))

    def unmeetable(self, predicted: float, budget: float) -> None:
        """Record a call whose budget is shorter than the predicted latency of asking for it alone."""
        self.counts.unmeetable += 1
        if self._telemetry is not None:
            self._telemetry.unmeetable()
        if self.events.watched():
            self.events.emit(UnmeetableEvent(self.function, self.model, predicted, budget))

    def fell_back(self) -> None:
        """Record a call that flex processing refused and real time answered."""
        self.counts.fallbacks += 1

    def flex_retried(self) -> None:
        """Record a call that flex processing refused, asked in flex again after a backoff."""
        self.counts.flex_retries += 1

    def adopted(self, lines: Sequence[Usage], *, lane: str = "batch") -> float:
        """Record a job an earlier process submitted, collected by this one: its lines
        with a reply, counted apart from this run's requests (``adopted_*``); their
        cost at ``lane``'s price (NaN when the model has no price)."""
        spent = sum((lane_cost(usage, self.price, lane) for usage in lines), 0.0)
        self.counts.adopted_jobs += 1
        self.counts.adopted_requests += len(lines)
        self.counts.adopted_cost += spent
        return spent

    def snapshot(self) -> PromptStatistics:
        """The statistics so far, as an immutable :class:`PromptStatistics`: the
        recorder's own counters, replaced field by field by its parts' (see
        :meth:`add_part`).

        Raises:
            ValueError: Two registered parts give the same field (see
                :func:`merge_parts`).
        """
        fields = {
            **self.counts.statistics(),
            "hook_errors": self.events.hook_errors,
            **self.savings.statistics(),
            **merge_parts(self._parts),
        }
        return PromptStatistics(**fields)

    def summary(self, waiting: int = 0) -> str:
        """The calls and requests so far, for a live ``repr``: ``"412 calls, 61
        requests (1 in flight), 6.8 items/request"``; ``waiting``: calls not sent yet."""
        return self.counts.summary(waiting)

    def __repr__(self) -> str:
        return (
            f"<PromptRecorder {self.function} model={self.model!r} calls={self.counts.calls}"
            f" requests={self.counts.requests}>"
        )


# --- combining and showing snapshots -------------------------------------------------

#: The snapshot fields that are mappings.
_MAPPINGS = (
    "dispatch_reasons",
    "calls_by_lane",
    "cost_by_lane",
    "agreement_by_size",
    "plain_calls",
)


def _mapping(name: str, value: Mapping[Any, Any]) -> dict[Any, Any]:
    """A mapping field read back from plain data (or JSON: string keys, lists)."""
    if name == "agreement_by_size":
        return {int(size): Agreement(*numbers) for size, numbers in value.items()}
    return dict(value)


Combine = Callable[[str, Sequence[PromptStatistics]], Any]


def _sum(name: str, snapshots: Sequence[PromptStatistics]) -> Any:
    return sum(getattr(each, name) for each in snapshots)


def _by_key(name: str, snapshots: Sequence[PromptStatistics]) -> Mapping[str, Any]:
    total: dict[str, Any] = {}
    for each in snapshots:
        for key, value in getattr(each, name).items():
            total[key] = total.get(key, 0) + value
    return MappingProxyType(total)


def _agreements(name: str, snapshots: Sequence[PromptStatistics]) -> Mapping[int, Agreement]:
    return MappingProxyType(merged_agreement(each.agreement_by_size for each in snapshots))


def _largest(name: str, snapshots: Sequence[PromptStatistics]) -> float:
    known = [value for each in snapshots if not math.isnan(value := getattr(each, name))]
    return max(known) if known else math.nan


def _first_learning(name: str, snapshots: Sequence[PromptStatistics]) -> CapLearning | None:
    """The learning of the snapshot with the lowest cap: learning is per process and
    cannot be added up; the most cautious one stands for all."""
    given = [value for each in snapshots if (value := getattr(each, name)) is not None]
    return min(given, key=lambda learning: learning.cap) if given else None


def _smallest(name: str, snapshots: Sequence[PromptStatistics]) -> int | None:
    given = [value for each in snapshots if (value := getattr(each, name)) is not None]
    return min(given) if given else None


def _mean_of(count: str) -> Combine:
    """A mean over ``count`` (a field): the snapshots' means weighted by their counts."""

    def mean(name: str, snapshots: Sequence[PromptStatistics]) -> float:
        parts = [(getattr(each, name), getattr(each, count)) for each in snapshots]
        weight = sum(n for value, n in parts if n and not math.isnan(value))
        total = sum(value * n for value, n in parts if n and not math.isnan(value))
        return total / weight if weight else math.nan

    return mean


def _savings(name: str, snapshots: Sequence[PromptStatistics]) -> float:
    spent = _sum("estimated_cost", snapshots)
    baseline = _sum("estimated_cost_one_per_item", snapshots)
    return 1.0 - spent / baseline if baseline > 0 else math.nan


_QUANTILES = (
    *(f"{kind}_{q}" for kind in ("latency", "wait") for q in ("p50", "p95", "p99")),
    "ttft_p50",
    "ttft_p95",
)
_COMBINE: dict[str, Combine] = {
    **dict.fromkeys(PromptStatistics._fields, _sum),
    **dict.fromkeys(_QUANTILES, _largest),
    "within_budget": _mean_of("calls_with_budget"),
    "items_per_request": _mean_of("requests"),
    "savings": _savings,
    "dispatch_reasons": _by_key,
    "calls_by_lane": _by_key,
    "cost_by_lane": _by_key,
    "plain_calls": _by_key,
    "agreement_by_size": _agreements,
    "smallest_paying_group": _smallest,
    "group_cap": _smallest,
    "cap_learning": _first_learning,
}


def statistics_table(stats: PromptStatistics) -> list[str]:
    """``str(stats)``'s lines: a figure per line, aligned; rows about lanes, checks and
    adopted jobs only where they have something to say."""
    rows = [
        ("calls", f"{stats.calls:,} ({stats.calls_failed:,} failed){_lanes(stats)}"),
        ("latency", _quantiles(stats, "latency", "p50", "p95", "p99")),
        ("within budget", _within(stats)),
        ("waited", _quantiles(stats, "wait", "p50", "p95", "p99")),
        ("requests", _requests(stats)),
        ("retries, re-asks", f"{stats.retries:,}, {stats.reasks:,}"),
        ("tokens", _tokens(stats)),
        ("cost", _cost(stats)),
    ]
    if not math.isnan(stats.ttft_p50):
        rows.insert(4, ("first token", _quantiles(stats, "ttft", "p50", "p95")))
    if stats.flex_retries or stats.flex_fallbacks:
        flex = f"{stats.flex_retries:,} asked again, {stats.flex_fallbacks:,} to real time"
        rows.append(("flex refusals", flex))
    if stats.plain_calls:
        rows.append(("sent plain", _plain(stats)))
    if stats.shadow_requests or stats.vote_requests:
        shadow = f"{stats.shadow_requests:,} shadow ({stats.shadow_input_tokens:,} tokens in)"
        checks = f"{shadow}, {stats.vote_requests:,} vote requests"
        rows.append(("checks", f"{checks}, {_dollars(stats.shadow_cost + stats.vote_cost)}"))
    if stats.adopted_jobs:
        adopted = f"{stats.adopted_jobs:,} jobs, {stats.adopted_requests:,} lines"
        rows.append(("adopted", f"{adopted}, {_dollars(stats.adopted_cost)} (not this run's)"))
    width = max(len(name) for name, _ in rows)
    return [f"{name.ljust(width)}  {value}" for name, value in rows]


def _lanes(stats: PromptStatistics) -> str:
    lanes = ", ".join(f"{lane} {n:,}" for lane, n in sorted(stats.calls_by_lane.items()))
    return f"; {lanes}" if lanes else ""


def _quantiles(stats: PromptStatistics, kind: str, *names: str) -> str:
    return "  ".join(f"{name} {_seconds(getattr(stats, f'{kind}_{name}'))}" for name in names)


def _seconds(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f} s"


def _within(stats: PromptStatistics) -> str:
    share = "-" if math.isnan(stats.within_budget) else f"{stats.within_budget:.1%}"
    return f"{share} ({stats.budget_misses:,} missed, {stats.unmeetable_budgets:,} unmeetable)"


def _requests(stats: PromptStatistics) -> str:
    line = f"{stats.requests:,} ({stats.requests_failed:,} failed"
    line += f", {stats.requests_in_flight:,} in flight)"
    if not math.isnan(stats.items_per_request):
        line += f", {stats.items_per_request:.1f} items/request"
    return line


#: How ``str()`` names each reason of ``plain_calls``.
_PLAIN = {
    "alone": "alone in the window",
    "below_paying": "group below the paying size",
    "cold": "cold start",
    "screened": "screened",
    "pinned": "no group can pay",
}


def _plain(stats: PromptStatistics) -> str:
    """``"14 calls: 10 alone in the window, 4 group below the paying size (5)"``."""
    total = sum(stats.plain_calls.values())
    reasons = ", ".join(
        f"{n:,} {_PLAIN.get(reason, reason)}" for reason, n in stats.plain_calls.items()
    )
    paying = stats.smallest_paying_group
    return f"{plural(total, 'call')}: {reasons} (paying from {paying if paying else '-'})"


def _tokens(stats: PromptStatistics) -> str:
    cached = f" ({stats.cached_input_tokens:,} cached)" if stats.cached_input_tokens else ""
    return f"{stats.input_tokens:,} in{cached}, {stats.output_tokens:,} out"


def _cost(stats: PromptStatistics) -> str:
    line = f"{_dollars(stats.estimated_cost)} (one per item"
    line += f" {_dollars(stats.estimated_cost_one_per_item)}"
    if not math.isnan(stats.savings):
        line += f", saved {stats.savings:.0%}"
    return line + ")"


def _dollars(value: float) -> str:
    """Dollars to the cent's hundredth, or to the millionth below a cent."""
    if math.isnan(value):
        return "-"
    return f"${value:.4f}" if abs(value) >= 0.01 else f"${value:.6f}"
