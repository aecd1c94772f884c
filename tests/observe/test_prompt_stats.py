"""Statistics of LLM calls: prices, the recorder, the event hook, OpenTelemetry.

The recorder reads no clock, so every test feeds it hand-written times and checks
exact figures, with no event loop.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coalesce import Batcher, BatcherStatistics, ConfigurationError, DispatchReason
from coalesce._observe.dispatch import DispatchReasons
from coalesce._observe.events import EventSink
from coalesce._observe.recorder import (
    CallEvent,
    ContradictionEvent,
    DispatchEvent,
    Event,
    PromptRecorder,
    PromptStatistics,
    RequestEvent,
    RetryEvent,
    UnmeetableEvent,
    merge_parts,
)
from coalesce._observe.telemetry import Telemetry
from coalesce._pricing import DEFAULT_PRICES, Price, cost, price_for
from coalesce.providers import Usage

# A round price makes the expected dollars easy to write: $1 per million input
# tokens, $10 per million output tokens, $0.10 per million cached input tokens.
ROUND = Price(1.0, 10.0, 0.1)


# (100 + 1 * 40) input tokens at $1/Mtok plus 10 output tokens at $10/Mtok.
APPROX_240: float = pytest.approx(240e-6)  # type: ignore[assignment]
# NaN equals nothing, so the unknown cost of a failed request is compared as this.
FAILED_COST = -1.0


def recorder(**options: Any) -> PromptRecorder:
    options.setdefault("telemetry", False)
    return PromptRecorder("tag", "my-model", **options)


# --- prices -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("openai/gpt-4.1-mini", "gpt-4.1-mini"),
    ],
)
def test_price_for_matches_exact_names_and_dated_variants(model: str, expected: str) -> None:
    assert price_for(model) == DEFAULT_PRICES[expected]


@pytest.mark.parametrize("model", ["gpt-4o-audio-preview", "gpt-4", "llama-3", "gpt-4oo"])
def test_price_for_does_not_price_a_different_model_by_its_prefix(model: str) -> None:
    assert price_for(model) is None


def test_a_user_table_adds_models_and_overrides_defaults() -> None:
    mine = Price(9.0, 9.0)
    table = {"gpt-4o": mine, "local-llm": Price(0.0, 0.0)}
    assert price_for("gpt-4o-2024-11-20", table) == mine
    assert price_for("local-llm", table) == Price(0.0, 0.0)
    # A longer default entry still wins over a shorter override.
    assert price_for("gpt-4o-mini", table) == DEFAULT_PRICES["gpt-4o-mini"]


def test_default_prices_are_read_only() -> None:
    with pytest.raises(TypeError):
        DEFAULT_PRICES["x"] = ROUND  # type: ignore[index]


def test_cost_bills_cached_input_at_the_cached_rate() -> None:
    assert cost(1_000_000, 100_000, ROUND) == pytest.approx(2.0)
    assert cost(1_000_000, 0, ROUND, cached_input_tokens=400_000) == pytest.approx(0.6 + 0.04)
    # No cache discount: cached tokens cost what other input tokens cost.
    assert cost(1_000_000, 0, Price(1.0, 1.0), cached_input_tokens=400_000) == pytest.approx(1.0)
    # A free cache is a discount too, not the absence of one.
    assert cost(1_000_000, 0, Price(1.0, 1.0, 0.0), cached_input_tokens=400_000) == pytest.approx(
        0.6
    )
    # More cached tokens than input tokens is a provider quirk, not a negative bill.
    assert cost(10, 0, ROUND, cached_input_tokens=50) == pytest.approx(10 * 0.1 / 1e6)


@pytest.mark.parametrize(
    "price",
    [
        {"input_per_mtok": -1.0, "output_per_mtok": 1.0},
        {"input_per_mtok": 1.0, "output_per_mtok": math.nan},
        {"input_per_mtok": 1.0, "output_per_mtok": math.inf},
        {"input_per_mtok": 1.0, "output_per_mtok": 1.0, "cached_input_per_mtok": -0.5},
    ],
)
def test_price_rejects_negative_or_non_finite_values(price: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="per_mtok"):
        Price(**price)


# --- the recorder -------------------------------------------------------------


def test_an_empty_snapshot_has_zeros_and_nans() -> None:
    stats = recorder(prices=ROUND).snapshot()
    assert (stats.calls, stats.requests, stats.input_tokens, stats.budget_misses) == (0, 0, 0, 0)
    for name in ("latency_p50", "wait_p99", "ttft_p95", "within_budget", "items_per_request"):
        assert math.isnan(getattr(stats, name)), name
    assert stats.estimated_cost == 0.0
    assert math.isnan(stats.savings)
    assert stats.dispatch_reasons == {}


def test_calls_give_latency_and_wait_quantiles() -> None:
    rec = recorder()
    for latency in (0.4, 0.1, 0.3, 0.2, 0.5):
        rec.call_finished(latency, wait=latency / 10, ok=True)
    rec.call_finished(1.0, ok=False)  # no wait known: a latency only
    stats = rec.snapshot()
    assert (stats.calls, stats.calls_failed) == (6, 1)
    assert stats.latency_p50 == pytest.approx(0.35)
    assert stats.latency_p99 == pytest.approx(0.975)
    assert stats.wait_p50 == pytest.approx(0.03)


def test_quantiles_cover_a_sliding_window() -> None:
    rec = recorder(window=2)
    for latency in (9.0, 1.0, 3.0):
        rec.call_finished(latency, ok=True)
    assert rec.snapshot().latency_p50 == pytest.approx(2.0)
    assert rec.snapshot().calls == 3


def test_within_budget_counts_only_calls_answered_in_time() -> None:
    rec = recorder()
    rec.call_finished(0.5, budget=1.0, ok=True)  # within
    rec.call_finished(1.0, budget=1.0, ok=True)  # within: exactly at the budget
    rec.call_finished(1.5, budget=1.0, ok=True)  # late
    rec.call_finished(0.5, budget=1.0, ok=False)  # in time, but no answer
    rec.call_finished(2.0, budget=1.0, ok=False)  # late and no answer
    rec.call_finished(9.0, ok=True)  # no budget: not counted either way
    stats = rec.snapshot()
    assert stats.within_budget == pytest.approx(2 / 5)
    assert stats.budget_misses == 2


def test_requests_give_tokens_items_and_ttft() -> None:
    rec = recorder(prices=ROUND)
    for items in (4, 2, 3):
        rec.request_sent(items)
    assert rec.snapshot().requests_in_flight == 3
    rec.request_finished(4, Usage(1000, 200, 100), shared_input_tokens=300, ttft=0.2, seconds=1.0)
    rec.request_finished(2, Usage(500, 100), shared_input_tokens=300, ttft=0.4, seconds=0.5)
    rec.request_finished(3, None, shared_input_tokens=300)  # the provider reported no usage
    stats = rec.snapshot()
    assert (stats.requests, stats.requests_in_flight) == (3, 0)
    assert stats.items_per_request == pytest.approx(3.0)
    assert (stats.input_tokens, stats.cached_input_tokens, stats.output_tokens) == (1500, 100, 300)
    assert stats.ttft_p50 == pytest.approx(0.3)
    assert stats.ttft_p95 == pytest.approx(0.39)


def test_one_request_per_item_pays_the_shared_tokens_per_item() -> None:
    rec = recorder(prices=ROUND)
    # 4 items, 300 shared tokens: alone, each item would have paid them again.
    rec.request_finished(4, Usage(1000, 200), shared_input_tokens=300)
    stats = rec.snapshot()
    assert stats.input_tokens_one_per_item == 1000 + 3 * 300
    assert stats.estimated_cost == pytest.approx((1000 * 1.0 + 200 * 10.0) / 1e6)
    assert stats.estimated_cost_one_per_item == pytest.approx((1900 * 1.0 + 200 * 10.0) / 1e6)
    assert stats.savings == pytest.approx(1 - 3000 / 3900)


def test_a_reask_costs_money_and_saves_nothing() -> None:
    rec = recorder(prices=ROUND)
    rec.request_sent(4)
    rec.request_sent(2, reask=True)
    rec.request_finished(4, Usage(1000, 0), shared_input_tokens=300)
    rec.request_finished(2, Usage(600, 0), shared_input_tokens=300, reask=True)
    stats = rec.snapshot()
    assert stats.reasks == 2
    assert stats.input_tokens == 1600
    assert stats.input_tokens_one_per_item == 1900
    assert stats.estimated_cost == pytest.approx(1600 / 1e6)
    assert stats.savings == pytest.approx(1 - 1600 / 1900)


def test_a_single_item_request_saves_nothing() -> None:
    rec = recorder(prices=ROUND)
    rec.request_finished(1, Usage(400, 50, 100), shared_input_tokens=300)
    stats = rec.snapshot()
    assert stats.estimated_cost == stats.estimated_cost_one_per_item
    assert stats.savings == 0.0


def test_without_a_price_tokens_are_counted_and_costs_are_nan() -> None:
    rec = recorder()  # "my-model" is in no table
    assert rec.price is None
    rec.request_finished(2, Usage(100, 10), shared_input_tokens=50)
    stats = rec.snapshot()
    assert (stats.input_tokens, stats.input_tokens_one_per_item) == (100, 150)
    assert math.isnan(stats.estimated_cost)
    assert math.isnan(stats.estimated_cost_one_per_item)
    assert math.isnan(stats.savings)


def test_the_price_comes_from_the_model_name_or_a_table() -> None:
    assert (
        PromptRecorder("f", "gpt-4o-2024-08-06", telemetry=False).price == DEFAULT_PRICES["gpt-4o"]
    )
    table = {"my-model": ROUND}
    assert recorder(prices=table).price == ROUND


def test_dispatches_failures_retries_and_unmeetable_budgets_are_counted() -> None:
    rec = recorder()
    rec.dispatched(DispatchReason.WINDOW, 3)
    rec.dispatched(DispatchReason.FULL, 8)
    rec.dispatched("window", 2)
    rec.request_sent(3)
    rec.request_sent(1, reask=True)
    rec.request_failed(3, RuntimeError("503"), seconds=2.0)
    rec.request_failed(1, RuntimeError("503"), reask=True)
    rec.retried(1, 0.5, RuntimeError("429"))
    rec.retried(2, 1.0)
    rec.unmeetable(predicted=2.5, budget=1.0)
    stats = rec.snapshot()
    assert stats.dispatch_reasons == {}  # counted by the batchers (a part), not here
    assert (stats.requests, stats.requests_failed, stats.requests_in_flight) == (2, 2, 0)
    assert (stats.retries, stats.reasks, stats.unmeetable_budgets) == (2, 1, 1)


def test_a_snapshot_is_immutable_and_does_not_change_later() -> None:
    rec = recorder()
    rec.add_part(Part(dispatch_reasons=MappingProxyType({"full": 1})))
    stats = rec.snapshot()
    rec.call_finished(1.0, ok=True)
    assert stats.dispatch_reasons == {"full": 1}
    assert stats.calls == 0
    with pytest.raises(TypeError):
        stats.dispatch_reasons["full"] = 5  # type: ignore[index]
    with pytest.raises(AttributeError):
        stats.calls = 5  # type: ignore[misc]


def test_repr_shows_live_counts() -> None:
    rec = recorder()
    rec.call_finished(1.0, ok=True)
    assert repr(rec) == "<PromptRecorder tag model='my-model' calls=1 requests=0>"


@given(
    requests=st.lists(
        st.tuples(
            st.integers(1, 16),
            st.integers(0, 10**6),
            st.integers(0, 10**5),
            st.integers(0, 10**4),
        ),
        min_size=1,
    )
)
def test_packing_never_costs_more_than_one_request_per_item(
    requests: list[tuple[int, int, int, int]],
) -> None:
    rec = recorder(prices=ROUND)
    for items, input_tokens, output_tokens, shared in requests:
        rec.request_finished(items, Usage(input_tokens, output_tokens), shared_input_tokens=shared)
    stats = rec.snapshot()
    assert stats.input_tokens_one_per_item >= stats.input_tokens
    assert stats.estimated_cost <= stats.estimated_cost_one_per_item * (1 + 1e-12)
    assert math.isnan(stats.savings) or 0.0 <= stats.savings + 1e-12 < 1.0


# --- the event hook -----------------------------------------------------------


def test_the_hook_receives_each_event_as_it_happens() -> None:
    events: list[Event] = []
    rec = recorder(prices=ROUND, on_event=events.append)
    error = RuntimeError("503")
    rec.dispatched(DispatchReason.WINDOW, 2)
    rec.retried(1, 0.5, error)
    rec.request_finished(2, Usage(100, 10), shared_input_tokens=40, ttft=0.1, seconds=0.3)
    rec.request_failed(1, error, seconds=0.2, reask=True)
    rec.unmeetable(2.0, 1.0)
    rec.call_finished(1.5, wait=0.05, budget=1.0, ok=True)
    assert isinstance(events[3], RequestEvent)
    assert math.isnan(events[3].cost)
    events[3] = dataclasses.replace(events[3], cost=FAILED_COST)
    assert events == [
        DispatchEvent("tag", "my-model", "window", 2, group=1),
        RetryEvent("tag", "my-model", 1, 0.5, error),
        RequestEvent(
            "tag",
            "my-model",
            2,
            Usage(100, 10),
            0.1,
            0.3,
            200e-6,
            APPROX_240,
            False,
            input_tokens_one_per_item=140,
        ),
        RequestEvent("tag", "my-model", 1, None, None, 0.2, FAILED_COST, 0.0, True, error),
        UnmeetableEvent("tag", "my-model", 2.0, 1.0),
        CallEvent("tag", "my-model", 1.5, 0.05, 1.0, True),
    ]
    assert isinstance(events[5], CallEvent)
    assert events[5].missed_budget
    assert not CallEvent("f", "m", 1.0, None, None, False).missed_budget


def test_events_are_frozen() -> None:
    event = CallEvent("f", "m", 1.0, None, None, True)
    with pytest.raises(AttributeError):
        event.latency = 2.0  # type: ignore[misc]


def test_a_failing_hook_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    def hook(event: Event) -> None:
        raise ValueError("bug in the user's hook")

    rec = recorder(on_event=hook)
    with caplog.at_level(logging.DEBUG, logger="coalesce"):
        rec.call_finished(1.0, ok=True)
        rec.dispatched("full", 8)
        rec.call_finished(2.0, ok=True)
    stats = rec.snapshot()
    assert stats.calls == 2
    assert stats.hook_errors == 3
    records = [r for r in caplog.records if "on_event hook" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert "on_event hook of tag raised on CallEvent" in records[0].getMessage()
    assert records[0].exc_info is not None
    assert isinstance(records[0].exc_info[1], ValueError)


# --- OpenTelemetry ------------------------------------------------------------


def test_no_telemetry_without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.metrics", None)  # import fails
    assert Telemetry.create("tag", "my-model", None) is None
    rec = PromptRecorder("tag", "my-model")
    assert rec._telemetry is None
    rec.call_finished(1.0, ok=True)
    assert rec.snapshot().calls == 1


def _metrics(reader: Any) -> dict[str, list[Any]]:
    """Data points by metric name."""
    data = reader.get_metrics_data()
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            assert scope.scope.name == "coalesce"
            for metric in scope.metrics:
                found[metric.name] = list(metric.data.data_points)
    return found


@pytest.fixture
def otel_reader() -> Any:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    return reader, MeterProvider(metric_readers=[reader])


def test_metrics_are_recorded_with_opentelemetry(otel_reader: Any) -> None:
    reader, provider = otel_reader
    rec = PromptRecorder("tag", "my-model", prices=ROUND, meter_provider=provider)
    rec.dispatched(DispatchReason.FULL, 4)
    rec.request_finished(4, Usage(1000, 200), shared_input_tokens=300, ttft=0.2, seconds=1.0)
    rec.request_finished(1, Usage(100, 20), shared_input_tokens=300, reask=True)
    rec.request_failed(2, RuntimeError("503"))
    rec.retried(1, 0.5)
    rec.unmeetable(2.0, 1.0)
    rec.call_finished(1.5, wait=0.05, budget=1.0, ok=True)
    rec.call_finished(0.5, ok=False)
    metrics = _metrics(reader)
    base = {"coalesce.function": "tag", "gen_ai.request.model": "my-model"}

    durations = {
        p.attributes["coalesce.outcome"]: (p.count, p.sum)
        for p in metrics["coalesce.call.duration"]
    }
    assert durations == {"ok": (1, 1.5), "error": (1, 0.5)}
    assert [(p.count, p.sum) for p in metrics["coalesce.call.wait"]] == [(1, 0.05)]
    items = {p.attributes["coalesce.reask"]: p.sum for p in metrics["coalesce.request.items"]}
    assert items == {False: 4, True: 1}
    tokens = {p.attributes["gen_ai.token.type"]: p.value for p in metrics["coalesce.tokens"]}
    assert tokens == {"input": 1100, "output": 220}
    assert metrics["coalesce.cost"][0].value == pytest.approx((1100 + 2200) / 1e6)
    assert metrics["coalesce.cost.one_per_item"][0].value == pytest.approx((1900 + 2000) / 1e6)
    assert metrics["coalesce.dispatches"][0].attributes == {
        **base,
        "coalesce.dispatch.reason": "full",
    }
    for name in ("budget.misses", "budget.unmeetable", "retries", "request.failures"):
        assert [p.value for p in metrics[f"coalesce.{name}"]] == [1], name
    assert [p.value for p in metrics["coalesce.reasks"]] == [1]
    assert [p.sum for p in metrics["coalesce.request.ttft"]] == [0.2]
    assert [p.sum for p in metrics["coalesce.request.duration"]] == [1.0]
    assert metrics["coalesce.cost"][0].attributes == base


def test_recorders_share_instruments_without_warnings(
    otel_reader: Any, caplog: pytest.LogCaptureFixture
) -> None:
    reader, provider = otel_reader
    with caplog.at_level(logging.WARNING):
        first = PromptRecorder("a", "m", meter_provider=provider)
        second = PromptRecorder("b", "m", meter_provider=provider)
    assert caplog.records == []
    first.call_finished(1.0, ok=True)
    second.call_finished(2.0, ok=True)
    points = _metrics(reader)["coalesce.call.duration"]
    assert {p.attributes["coalesce.function"]: p.sum for p in points} == {"a": 1.0, "b": 2.0}


def test_telemetry_can_be_turned_off(otel_reader: Any) -> None:
    reader, provider = otel_reader
    rec = PromptRecorder("tag", "m", meter_provider=provider, telemetry=False)
    rec.call_finished(1.0, ok=True)
    assert _metrics(reader) == {}


# --- documentation ------------------------------------------------------------


def test_the_statistics_page_describes_every_field() -> None:
    page = (Path(__file__).parents[2] / "docs" / "statistics.md").read_text()
    missing = [name for name in PromptStatistics._fields if f"`{name}`" not in page]
    assert missing == []


def test_a_contradiction_is_counted_logged_and_sent_to_the_hook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[Any] = []
    rec = PromptRecorder("tag", "my-model", on_event=events.append, telemetry=False)
    with caplog.at_level(logging.WARNING, logger="coalesce"):
        rec.contradicted(("2", "5"))
    assert rec.snapshot().contradictions == 2
    assert events == [ContradictionEvent("tag", "my-model", ("2", "5"))]
    assert "contradicted 2 answer(s)" in caplog.text


# --- the event sink -----------------------------------------------------------


def test_the_sink_logs_then_calls_the_hook_and_counts_its_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Event] = []
    sink = EventSink("tag", seen.append)
    assert sink.watched(logging.INFO)  # a hook always listens
    event = RetryEvent("tag", "m", 1, 0.5, None)
    with caplog.at_level(logging.DEBUG, logger="coalesce"):
        sink.emit(event, logging.INFO)
    assert seen == [event]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, str(event))]

    def broken(event: Event) -> None:
        raise RuntimeError("oops")

    sink.on_event = broken
    sink.emit(event)
    assert sink.hook_errors == 1


def test_an_unwatched_sink_says_so() -> None:
    logging.getLogger("coalesce").setLevel(logging.WARNING)
    try:
        sink = EventSink("tag")
        assert not sink.watched()
        assert sink.watched(logging.ERROR)
    finally:
        logging.getLogger("coalesce").setLevel(logging.NOTSET)


# --- statistics parts ---------------------------------------------------------


class Part:
    """A statistics part giving fixed fields, counting how often it is asked."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        self.asked = 0

    def statistics(self) -> dict[str, Any]:
        self.asked += 1
        return self.fields


def test_a_part_adds_its_fields_to_every_snapshot() -> None:
    rec = recorder(prices=ROUND)
    part = Part(vote_requests=3, votes_settled=1)
    rec.add_part(part)
    rec.call_finished(1.0, ok=True)
    stats = rec.snapshot()
    assert (stats.vote_requests, stats.votes_settled, stats.calls) == (3, 1, 1)
    part.fields["vote_requests"] = 4
    assert (rec.snapshot().vote_requests, part.asked) == (4, 2)


def test_a_part_replaces_the_recorders_own_fields() -> None:
    rec = recorder(prices=ROUND)
    rec.dispatched(DispatchReason.FULL, 4)
    rec.add_part(Part(dispatch_reasons={"window": 2}))
    stats = rec.snapshot()
    assert stats.dispatch_reasons == {"window": 2}


def test_engines_sharing_a_recorder_share_its_parts() -> None:
    rec = recorder()
    made: list[Part] = []

    def make() -> Part:
        made.append(Part(vote_requests=len(made)))
        return made[-1]

    first = rec.part(Part, make)
    assert rec.part(Part, make) is first  # the second engine finds the first's
    assert (len(made), rec.snapshot().vote_requests) == (1, 0)


def test_parts_give_separate_fields() -> None:
    rec = recorder()
    rec.add_part(Part(shadow_requests=1))
    rec.add_part(Part(vote_requests=2))
    assert (rec.snapshot().shadow_requests, rec.snapshot().vote_requests) == (1, 2)
    rec.add_part(Part(vote_requests=5, votes_settled=1))
    with pytest.raises(ValueError, match=r"fields \['vote_requests'\] already given"):
        rec.snapshot()


def test_a_part_gives_only_statistics_fields() -> None:
    with pytest.raises(ValueError, match=r"unknown fields \['vote_rate'\]"):
        merge_parts([Part(vote_rate=0.5)])
    assert merge_parts([]) == {}


# --- one name for dispatch reasons ---------------------------------------------


def test_batcher_and_prompt_statistics_name_dispatch_reasons_alike() -> None:
    assert "dispatch_reasons" in BatcherStatistics._fields
    assert "dispatch_reasons" in PromptStatistics._fields
    assert "batches_by_reason" not in BatcherStatistics._fields


def test_batches_by_reason_is_a_deprecated_alias() -> None:
    nan = math.nan
    stats = BatcherStatistics(1, 1, 0, 0, 1, {"full": 1}, 1.0, 1, 0, 0, nan, nan, nan)
    with pytest.warns(DeprecationWarning, match="use dispatch_reasons"):
        assert stats.batches_by_reason == {"full": 1}
    assert stats.dispatch_reasons == {"full": 1}


async def _no_op(items: list[int]) -> list[int]:
    return items


@pytest.mark.anyio
async def test_dispatch_reasons_come_from_the_batchers_alone() -> None:
    """One source: the part adds up the batchers' non-zero counts (an engine and its
    flex lane, or wrap's kinds of call, share a recorder)."""
    rec = recorder()
    first, second = Batcher(_no_op, max_items=2), Batcher(_no_op, max_items=2, max_wait=0.0)
    reasons = rec.part(DispatchReasons, DispatchReasons)
    reasons.batchers += [first, second]
    async with anyio.create_task_group() as tg:
        for item in range(4):
            tg.start_soon(first, item)
        tg.start_soon(second, 9)
    await first.aclose()
    await second.aclose()
    expected = {
        reason: first.statistics().dispatch_reasons[reason]
        + second.statistics().dispatch_reasons[reason]
        for reason in ("full", "window")
    }
    assert rec.snapshot().dispatch_reasons == {k: n for k, n in expected.items() if n}
    assert sum(rec.snapshot().dispatch_reasons.values()) == 3  # two full pairs, one alone
