"""Statistics of LLM calls: counters, quantiles, cost, an event hook and OpenTelemetry.

One :class:`PromptRecorder` per decorated function (or wrapped client) is told what
happened, with the times already measured: the recorder reads no clock and needs no
event loop, so tests feed it hand-written numbers. It keeps counters and sliding
windows for :meth:`PromptRecorder.snapshot`, passes each happening to the user's
``on_event`` hook as a small frozen event (:mod:`coalesce._observe.events`) and writes it as one
line on the ``"coalesce"`` logger at ``DEBUG``, and records OpenTelemetry metrics when
``opentelemetry-api`` is installed (imported lazily; a no-op otherwise).
"""

from __future__ import annotations

import importlib
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from .._accuracy.shadow import Agreement, ShadowGuard, wilson_interval
from .._accuracy.vote import disagreement
from .._batching.quantile import WindowQuantile
from .._pricing import LANE_PRICE, Price, cost, price_for
from ..providers import Usage
from .events import (
    CallEvent,
    ContradictionEvent,
    DispatchEvent,
    Event,
    EventHook,
    RequestEvent,
    RequestLabel,
    RetryEvent,
    ShadowEvent,
    UnmeetableEvent,
    logger,
)

__all__ = [
    "CallEvent",
    "ContradictionEvent",
    "DispatchEvent",
    "Event",
    "EventHook",
    "PromptRecorder",
    "PromptStatistics",
    "RequestEvent",
    "RetryEvent",
    "ShadowEvent",
    "UnmeetableEvent",
]

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


def merged_agreement(guards: Sequence[ShadowGuard]) -> dict[int, Agreement]:
    """Every guard's verdicts per group size, added up (one guard: its own)."""
    if len(guards) == 1:
        return guards[0].agreement()
    counts: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    for guard in guards:
        for size, agreement in guard.agreement().items():
            counts[size] += agreement.agreed
            totals[size] += agreement.total
    return {
        size: Agreement(counts[size], total, *wilson_interval(counts[size], total))
        for size, total in sorted(totals.items())
    }


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
        self.price = prices if isinstance(prices, Price) else price_for(model, prices)
        self._on_event = on_event
        self._otel = _Telemetry.create(function, model, meter_provider) if telemetry else None
        self._latency = WindowQuantile(window)
        self._wait = WindowQuantile(window)
        self._ttft = WindowQuantile(window)
        self._reasons: Counter[str] = Counter()
        self._calls = self._calls_failed = self._budgeted = self._within = self._misses = 0
        self._unmeetable = self._requests = self._requests_failed = self._items = 0
        self._input = self._cached = self._output = self._input_baseline = 0
        self._cost = self._cost_baseline = 0.0
        self._retries = self._reasks = self._hook_errors = 0
        self._in_flight = self._contradictions = self._groups = self._fallbacks = 0
        self._lane_calls: Counter[str] = Counter()
        self._lane_cost: dict[str, float] = {}
        self._shadow_requests, self._shadow_cost = 0, 0.0
        self._vote_requests, self._vote_cost = 0, 0.0
        self._vote_settled = self._vote_unsettled = self._voted_items = 0
        #: The guards of the engines that record here and shadow (``wrap`` makes one
        #: engine per kind of call, all recording into its model's recorder).
        self._guards: list[ShadowGuard] = []
        #: Set by the engine: its ``max_items``.
        self.max_items: int | None = None
        #: Set by the engine from its cost decision (see PromptStatistics).
        self.smallest_paying_group: int | None = 2

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
        self._calls += 1
        self._lane_calls[lane] += 1
        self._calls_failed += not ok
        self._latency.extend((latency,))
        if wait is not None:
            self._wait.extend((wait,))
        if budget is not None:
            self._budgeted += 1
            self._within += ok and latency <= budget
            self._misses += latency > budget
        if self._otel is not None:
            self._otel.call(latency, wait, ok, missed=budget is not None and latency > budget)
        if self._watched():
            ids = tuple(requests)
            self._emit(
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
        """Record a group of ``items`` calls dispatched for ``reason``; return its number.

        Args:
            reason: Why it left its window (a :class:`~coalesce.DispatchReason`).
            items: Calls in it.
            predicted: The planner's predicted seconds for a request carrying it.
            time_left: Seconds left of its tightest budget, if any call had one.
        """
        reason = str(reason)
        self._reasons[reason] += 1
        self._groups += 1
        if self._otel is not None:
            self._otel.dispatched(reason)
        if self._watched():
            group, model = self._groups, self.model
            self._emit(
                DispatchEvent(self.function, model, reason, items, group, predicted, time_left)
            )
        return self._groups

    def request_sent(self, items: int, *, reask: bool = False) -> int:
        """Count one request of ``items`` items as it is sent; return its local number
        (1 for the function's first request).

        Args:
            items: Items in its prompt.
            reask: Whether it asks again for items an earlier reply failed.
        """
        self._requests += 1
        self._items += items
        self._in_flight += 1
        self._reasks += items if reask else 0
        return self._requests

    def contradicted(self, ids: tuple[str, ...]) -> None:
        """Record delivered answers that the rest of their streamed reply contradicted."""
        self._contradictions += len(ids)
        self._emit(ContradictionEvent(self.function, self.model, ids), level=logging.WARNING)

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
            plain_shared_input_tokens: What a plain call of one item, without
                coalesce, pays besides its item (instructions and output schema, an
                estimate); one call per item pays it ``items`` times. ``None``: the
                same as ``shared_input_tokens`` (the packed format's requests of one).
            frame_tokens, answer_frame_tokens: Prompt tokens each item adds besides
                its own input (its wrapper, its entry in the reply schema), and reply
                tokens each answer adds besides its output (its key): a plain call
                pays neither.
            plain_cached_input_tokens: What each plain call would read from a warm
                prompt cache: the baseline is the best plain alternative.
            ttft, seconds: Seconds to the first reply text (streamed), to its end.
            reask: Whether it asked again for items an earlier reply failed.
            label: Which request it was (its id, group, attempt and prediction).
            lane: Its lane, whose price (``LANE_PRICE``) it is billed at.
        """
        self._in_flight = max(0, self._in_flight - 1)
        if ttft is not None:
            self._ttft.extend((ttft,))
        plain = (
            shared_input_tokens if plain_shared_input_tokens is None else plain_shared_input_tokens
        )
        spent, baseline, plain_input = self._add_usage(
            items,
            usage,
            (shared_input_tokens, plain, frame_tokens, answer_frame_tokens),
            plain_cached_input_tokens,
            reask,
            lane,
        )
        if self._otel is not None:
            self._otel.request(items, usage, ttft, seconds, spent, baseline, reask)
        if self._watched():
            f, m = self.function, self.model
            event = RequestEvent(
                f, m, items, usage, ttft, seconds, spent, baseline, reask, None, *label, plain_input
            )
            self._emit(event)
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
        """Record one request that failed as a whole, after its retries.

        Args:
            items: Items in its prompt.
            error: What failed it.
            seconds: Seconds from sending to the failure.
            reask: Whether it asked again for items an earlier reply failed.
            label: Which request it was (its id, group, attempt and prediction).
        """
        self._requests_failed += 1
        self._in_flight = max(0, self._in_flight - 1)
        if self._otel is not None:
            self._otel.request_failed(reask)
        if self._watched():
            f, m = self.function, self.model
            event = RequestEvent(
                f, m, items, None, None, seconds, math.nan, 0.0, reask, error, *label
            )
            self._emit(event)

    def retried(self, attempt: int, delay: float, error: BaseException | None = None) -> None:
        """Record that attempt ``attempt`` of a request failed and will be resent after ``delay``."""
        self._retries += 1
        if self._otel is not None:
            self._otel.retried()
        if self._watched():
            self._emit(RetryEvent(self.function, self.model, attempt, delay, error))

    def unmeetable(self, predicted: float, budget: float) -> None:
        """Record a call whose budget is shorter than the predicted latency of asking for it alone."""
        self._unmeetable += 1
        if self._otel is not None:
            self._otel.unmeetable()
        if self._watched():
            self._emit(UnmeetableEvent(self.function, self.model, predicted, budget))

    def snapshot(self) -> PromptStatistics:
        """The statistics so far, as an immutable :class:`PromptStatistics`."""
        latency = self._latency.quantiles(0.5, 0.95, 0.99)
        wait = self._wait.quantiles(0.5, 0.95, 0.99)
        ttft = self._ttft.quantiles(0.5, 0.95)
        known = self.price is not None
        spent = self._cost if known else math.nan
        baseline = self._cost_baseline if known else math.nan
        return PromptStatistics(
            calls=self._calls,
            calls_failed=self._calls_failed,
            latency_p50=latency[0],
            latency_p95=latency[1],
            latency_p99=latency[2],
            within_budget=self._within / self._budgeted if self._budgeted else math.nan,
            budget_misses=self._misses,
            unmeetable_budgets=self._unmeetable,
            wait_p50=wait[0],
            wait_p95=wait[1],
            wait_p99=wait[2],
            ttft_p50=ttft[0],
            ttft_p95=ttft[1],
            requests=self._requests,
            requests_failed=self._requests_failed,
            requests_in_flight=self._in_flight,
            items_per_request=self._items / self._requests if self._requests else math.nan,
            input_tokens=self._input,
            cached_input_tokens=self._cached,
            output_tokens=self._output,
            input_tokens_one_per_item=self._input_baseline,
            estimated_cost=spent,
            estimated_cost_one_per_item=baseline,
            savings=1.0 - spent / baseline if baseline > 0 else math.nan,
            dispatch_reasons=MappingProxyType(dict(self._reasons)),
            retries=self._retries,
            reasks=self._reasks,
            contradictions=self._contradictions,
            hook_errors=self._hook_errors,
            smallest_paying_group=self.smallest_paying_group,
            calls_by_lane=MappingProxyType(dict(self._lane_calls)),
            cost_by_lane=MappingProxyType(
                {lane: spent if known else math.nan for lane, spent in self._lane_cost.items()}
            ),
            flex_fallbacks=self._fallbacks,
            shadow_requests=self._shadow_requests,
            shadow_cost=self._shadow_cost if known else math.nan,
            agreement_by_size=MappingProxyType(merged_agreement(self._guards)),
            group_cap=min((guard.cap for guard in self._guards), default=self.max_items),
            vote_requests=self._vote_requests,
            vote_cost=self._vote_cost if known else math.nan,
            votes_settled=self._vote_settled,
            votes_unsettled=self._vote_unsettled,
        )

    def watch(self, guard: ShadowGuard) -> None:
        """Report ``guard``'s agreement and cap with this recorder's statistics."""
        self._guards.append(guard)

    def extra_done(self, kind: str, usage: Usage | None) -> None:
        """Record the reply of a request made to check or settle answers (``kind``:
        ``"shadow"`` or ``"vote"``): its cost is spent, and no saving."""
        if kind == "vote":
            self._vote_requests += 1
        else:
            self._shadow_requests += 1
        if usage is not None:  # tokens the provider reported, spent like any others
            self._input += usage.input_tokens
            self._cached += usage.cached_input_tokens
            self._output += usage.output_tokens
        if usage is not None and self.price is not None:
            spent = cost(
                usage.input_tokens,
                usage.output_tokens,
                self.price,
                cached_input_tokens=usage.cached_input_tokens,
                cache_write_tokens=usage.cache_write_tokens,
            )
            if kind == "vote":
                self._vote_cost += spent
            else:
                self._shadow_cost += spent
            self._cost += spent
            self._lane_cost["realtime"] = self._lane_cost.get("realtime", 0.0) + spent

    def voted(self, items: int) -> None:
        """Record a group of ``items`` asked in two orders."""
        self._voted_items += items

    def vote_disagreement(self) -> float:
        """The share of voted items whose two answers differed so far (see
        :func:`coalesce._accuracy.vote.disagreement`)."""
        return disagreement(self._vote_settled + self._vote_unsettled, self._voted_items)

    def vote_settled(self, asked: bool) -> None:
        """Record an item whose two orders' answers differed; ``asked``: a plain call
        settled it (else its budget left no time, and the usual order's answer stood)."""
        if asked:
            self._vote_settled += 1
        else:
            self._vote_unsettled += 1

    def shadow_judged(self, size: int, agreed: bool, cap: int) -> None:
        """Record a shadow verdict (see :class:`ShadowEvent`)."""
        level = logging.DEBUG if agreed else logging.INFO
        if self._on_event is not None or logger.isEnabledFor(level):
            self._emit(ShadowEvent(self.function, self.model, size, agreed, cap), level)

    def fell_back(self) -> None:
        """Record a call that flex processing refused and real time answered."""
        self._fallbacks += 1

    def _add_usage(
        self,
        items: int,
        usage: Usage | None,
        shares: tuple[int, int, int, int],
        plain_cached: int,
        reask: bool,
        lane: str = "realtime",
    ) -> tuple[float, float, int]:
        """Add one reply's tokens and costs; return its cost, its one-per-item cost and
        its one-per-item prompt tokens.

        ``shares`` is (shared tokens of this request, what a plain call pays besides its
        item, the frame around each item, the frame around each answer): one call per
        item would have sent each item's own tokens with the plain shared part, and no
        frames; with a warm prompt cache, each would have read ``plain_cached`` of its
        prompt tokens from it.
        """
        if usage is None:
            return math.nan, math.nan, 0
        shared, plain, frame, answer_frame = (max(0, n) for n in shares)
        # A re-ask's items were counted when first asked: one request per item would
        # not have needed it, so it adds to the cost and not to the comparison.
        own_input = max(0, usage.input_tokens - shared - items * frame)
        baseline_input = 0 if reask else own_input + items * plain
        baseline_output = 0 if reask else max(0, usage.output_tokens - items * answer_frame)
        self._input += usage.input_tokens
        self._cached += usage.cached_input_tokens
        self._output += usage.output_tokens
        self._input_baseline += baseline_input
        if self.price is None:
            return math.nan, math.nan, baseline_input
        spent = cost(
            usage.input_tokens,
            usage.output_tokens,
            self.price.scaled(LANE_PRICE.get(lane, 1.0)),
            cached_input_tokens=usage.cached_input_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        # A request of one item is its own plain call, cache and all.
        warm = max(items * max(0, plain_cached), usage.cached_input_tokens if items == 1 else 0)
        baseline_cached = 0 if reask else min(baseline_input, warm)
        baseline = cost(
            baseline_input, baseline_output, self.price, cached_input_tokens=baseline_cached
        )
        self._cost += spent
        self._lane_cost[lane] = self._lane_cost.get(lane, 0.0) + spent
        self._cost_baseline += baseline
        return spent, baseline, baseline_input

    def summary(self, waiting: int = 0) -> str:
        """The calls and requests so far, for a live ``repr``: ``"412 calls, 61
        requests (1 in flight), 6.8 items/request"``.

        Args:
            waiting: Calls not sent yet (in a window, or queued for a request slot).
        """
        calls = _plural(self._calls, "call") + (f" ({waiting} waiting)" if waiting else "")
        flight = f" ({self._in_flight} in flight)" if self._in_flight else ""
        line = f"{calls}, {_plural(self._requests, 'request')}{flight}"
        if self._requests:
            line += f", {self._items / self._requests:.1f} items/request"
        return line

    def _watched(self) -> bool:
        """Whether anyone listens for events: the hook, or the logger at ``DEBUG``."""
        return self._on_event is not None or logger.isEnabledFor(logging.DEBUG)

    def _emit(self, event: Event, level: int = logging.DEBUG) -> None:
        """Log ``event`` as one line at ``level``, then pass it to the hook, if any."""
        if logger.isEnabledFor(level):
            logger.log(level, "%s", event)
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:
            # A broken hook must not break the calls it watches.
            self._hook_errors += 1
            first = self._hook_errors == 1
            logger.log(
                logging.ERROR if first else logging.DEBUG,
                "the on_event hook of %s raised on %s; ignored%s",
                self.function,
                type(event).__name__,
                " (further hook errors are logged at DEBUG)" if first else "",
                exc_info=True,
            )

    def __repr__(self) -> str:
        return (
            f"<PromptRecorder {self.function} model={self.model!r} calls={self._calls}"
            f" requests={self._requests}>"
        )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class _Telemetry:
    """OpenTelemetry instruments for one recorder (shared per meter), and its attributes."""

    def __init__(self, instruments: Mapping[str, Any], function: str, model: str) -> None:
        self._i = instruments
        self._attrs = {"coalesce.function": function, "gen_ai.request.model": model}
        self._ok = {**self._attrs, "coalesce.outcome": "ok"}
        self._error = {**self._attrs, "coalesce.outcome": "error"}
        self._input = {**self._attrs, "gen_ai.token.type": "input"}
        self._output = {**self._attrs, "gen_ai.token.type": "output"}
        self._reask = {**self._attrs, "coalesce.reask": True}
        self._first = {**self._attrs, "coalesce.reask": False}

    @classmethod
    def create(cls, function: str, model: str, meter_provider: Any) -> _Telemetry | None:
        """Instruments from ``meter_provider`` (or the global one); ``None`` without OTel."""
        try:
            metrics: Any = importlib.import_module("opentelemetry.metrics")
        except ImportError:
            return None
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        return cls(_instruments(provider), function, model)

    def call(self, latency: float, wait: float | None, ok: bool, *, missed: bool) -> None:
        self._i["call.duration"].record(latency, self._ok if ok else self._error)
        if wait is not None:
            self._i["call.wait"].record(wait, self._attrs)
        if missed:
            self._i["budget.misses"].add(1, self._attrs)

    def dispatched(self, reason: str) -> None:
        self._i["dispatches"].add(1, {**self._attrs, "coalesce.dispatch.reason": reason})

    def request(
        self,
        items: int,
        usage: Usage | None,
        ttft: float | None,
        seconds: float | None,
        spent: float,
        baseline: float,
        reask: bool,
    ) -> None:
        attrs = self._reask if reask else self._first
        self._i["request.items"].record(items, attrs)
        if seconds is not None:
            self._i["request.duration"].record(seconds, attrs)
        if ttft is not None:
            self._i["request.ttft"].record(ttft, attrs)
        if usage is not None:
            self._i["tokens"].add(usage.input_tokens, self._input)
            self._i["tokens"].add(usage.output_tokens, self._output)
        if not math.isnan(spent):
            self._i["cost"].add(spent, self._attrs)
            self._i["cost.one_per_item"].add(baseline, self._attrs)
        if reask:
            self._i["reasks"].add(items, self._attrs)

    def request_failed(self, reask: bool) -> None:
        self._i["request.failures"].add(1, self._reask if reask else self._first)

    def retried(self) -> None:
        self._i["retries"].add(1, self._attrs)

    def unmeetable(self) -> None:
        self._i["budget.unmeetable"].add(1, self._attrs)


# Instruments by meter provider: creating the same instrument twice on one meter
# makes the SDK log a warning, and there is one recorder per decorated function.
_INSTRUMENTS: dict[int, tuple[Any, Mapping[str, Any]]] = {}


def _instruments(provider: Any) -> Mapping[str, Any]:
    cached = _INSTRUMENTS.get(id(provider))
    if cached is not None and cached[0] is provider:
        return cached[1]
    meter = provider.get_meter("coalesce")
    h, c = meter.create_histogram, meter.create_counter
    instruments = {
        "call.duration": h("coalesce.call.duration", "s", "Latency of a call, end to end"),
        "call.wait": h("coalesce.call.wait", "s", "Wait for company before the first request"),
        "request.duration": h("coalesce.request.duration", "s", "Duration of a request"),
        "request.ttft": h("coalesce.request.ttft", "s", "Time to the first reply token"),
        "request.items": h("coalesce.request.items", "{item}", "Items per request"),
        "request.failures": c("coalesce.request.failures", "{request}", "Requests failed"),
        "tokens": c("coalesce.tokens", "{token}", "Tokens reported by the provider"),
        "cost": c("coalesce.cost", "USD", "Estimated cost"),
        "cost.one_per_item": c(
            "coalesce.cost.one_per_item", "USD", "Estimated cost of one request per item"
        ),
        "dispatches": c("coalesce.dispatches", "{request}", "Groups dispatched, by reason"),
        "budget.misses": c("coalesce.budget.misses", "{call}", "Calls finished after budget"),
        "budget.unmeetable": c(
            "coalesce.budget.unmeetable", "{call}", "Calls whose budget could not be met alone"
        ),
        "retries": c("coalesce.retries", "{request}", "Requests sent again"),
        "reasks": c("coalesce.reasks", "{item}", "Items asked again"),
    }
    _INSTRUMENTS[id(provider)] = (provider, instruments)
    return instruments
