"""Statistics snapshots (issue 25, item 3): a readable ``str()``, and snapshots of
several processes combined into one. The recorder reads no clock: every figure is
hand-fed, and every assertion exact."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from types import MappingProxyType
from typing import Any

import pytest

from coalesce import Agreement, PromptStatistics
from coalesce._observe.recorder import PromptRecorder
from coalesce._pricing import Price
from coalesce.providers import Usage

ROUND = Price(1.0, 10.0, 0.1)


def same(a: PromptStatistics, b: PromptStatistics) -> bool:
    """Every field equal (NaN equal to NaN)."""
    return json.dumps(a.as_dict()) == json.dumps(b.as_dict())


def recorder() -> PromptRecorder:
    return PromptRecorder("tag", "my-model", prices=ROUND, telemetry=False)


def process(latencies: list[float], budget: float, items: int, lane: str = "realtime") -> Any:
    """A process's snapshot: one call per latency, one request of ``items`` items."""
    rec = recorder()
    rec.request_sent(items)
    rec.request_finished(items, Usage(1000, 100), shared_input_tokens=200, lane=lane)
    for latency in latencies:
        rec.call_finished(latency, wait=latency / 2, budget=budget, ok=True, lane=lane)
    rec.dispatched("full", items)
    return rec.snapshot()._replace(dispatch_reasons=MappingProxyType({"full": 1}))


# --- str() ---------------------------------------------------------------------------


def test_a_snapshot_prints_as_a_short_aligned_table() -> None:
    rec = recorder()
    rec.request_sent(4)
    rec.request_finished(4, Usage(1000, 100, 200), shared_input_tokens=200)
    for latency in (0.5, 1.0, 3.0):
        rec.call_finished(latency, wait=0.25, budget=2.0, ok=latency < 3, lane="realtime")
    rec.retried(1, 0.5)
    stats = rec.snapshot()
    assert str(stats).splitlines() == [
        "calls             3 (1 failed); realtime 3",
        "latency           p50 1.00 s  p95 2.80 s  p99 2.96 s",
        "within budget     66.7% (1 missed, 0 unmeetable)",
        "waited            p50 0.25 s  p95 0.25 s  p99 0.25 s",
        "requests          1 (0 failed, 0 in flight), 4.0 items/request",
        "retries, re-asks  1, 0",
        "tokens            1,000 in (200 cached), 100 out",
        f"cost              ${stats.estimated_cost:.6f} (one per item"
        f" ${stats.estimated_cost_one_per_item:.6f}, saved {stats.savings:.0%})",
    ]
    assert repr(stats).startswith("PromptStatistics(calls=3, ")  # the full tuple


def test_an_empty_snapshot_prints_dashes_for_what_is_not_known() -> None:
    lines = str(PromptRecorder("tag", "no-price-model", telemetry=False).snapshot()).splitlines()
    assert lines[1] == "latency           p50 -  p95 -  p99 -"
    assert lines[2] == "within budget     - (0 missed, 0 unmeetable)"
    assert lines[-1] == "cost              - (one per item -)"


def test_flex_checks_and_adopted_jobs_get_rows_only_when_they_happened() -> None:
    rec = recorder()
    rec.flex_retried()
    rec.fell_back()
    rec.adopted([Usage(1000, 100)])
    lines = str(rec.snapshot()).splitlines()
    assert lines[-2:] == [
        "flex refusals     1 asked again, 1 to real time",
        "adopted           1 jobs, 1 lines, $0.001000 (not this run's)",
    ]


# --- combine -------------------------------------------------------------------------


def test_combined_counts_add_up_and_rates_are_recomputed() -> None:
    a = process([1.0, 2.0, 9.0], budget=5.0, items=3)
    b = process([4.0], budget=5.0, items=1, lane="batch")
    both = PromptStatistics.combine(a, b)
    assert (both.calls, both.requests, both.calls_with_budget) == (4, 2, 4)
    assert both.input_tokens == a.input_tokens + b.input_tokens
    assert both.estimated_cost == pytest.approx(a.estimated_cost + b.estimated_cost)
    assert both.within_budget == 3 / 4  # 2 of 3, and 1 of 1
    assert both.budget_misses == 1
    assert both.items_per_request == 2.0  # 4 items in 2 requests
    assert both.savings == pytest.approx(1 - both.estimated_cost / both.estimated_cost_one_per_item)
    assert dict(both.calls_by_lane) == {"realtime": 3, "batch": 1}
    assert dict(both.cost_by_lane) == {
        "realtime": a.estimated_cost,
        "batch": b.estimated_cost,
    }
    assert dict(both.dispatch_reasons) == {"full": 2}


def test_combined_quantiles_are_the_largest_an_estimate_that_errs_high() -> None:
    a = process([1.0, 2.0, 9.0], budget=5.0, items=3)
    b = process([4.0], budget=5.0, items=1)
    empty = PromptRecorder("tag", "my-model", prices=ROUND, telemetry=False).snapshot()
    both = PromptStatistics.combine(a, b, empty)
    assert (a.latency_p50, a.latency_p95, b.latency_p50) == (2.0, pytest.approx(8.3), 4.0)
    assert (both.latency_p50, both.latency_p95) == (4.0, a.latency_p95)
    assert both.latency_p50 >= 3.0  # the median of all four calls: (2.0 + 4.0) / 2
    assert math.isnan(both.ttft_p50)  # no snapshot knows it
    assert both.calls == 4


def test_combined_agreement_caps_and_paying_groups() -> None:
    a = process([1.0], budget=5.0, items=2)._replace(
        agreement_by_size=MappingProxyType({4: Agreement(9, 10, 0.6, 0.98)}),
        group_cap=4,
        smallest_paying_group=2,
    )
    b = process([1.0], budget=5.0, items=2)._replace(
        agreement_by_size=MappingProxyType({4: Agreement(1, 10, 0.02, 0.4)}),
        group_cap=None,
        smallest_paying_group=None,
    )
    both = PromptStatistics.combine(a, b)
    assert both.agreement_by_size[4][:2] == (10, 20)
    assert (both.group_cap, both.smallest_paying_group) == (4, 2)
    assert PromptStatistics.combine(b).group_cap is None


def test_combining_one_snapshot_gives_it_back_and_none_is_refused() -> None:
    a = process([1.0, 2.0], budget=5.0, items=2)
    assert same(PromptStatistics.combine(a), a)
    with pytest.raises(ValueError, match="at least one snapshot"):
        PromptStatistics.combine()


def test_every_field_has_a_way_to_combine() -> None:
    a = process([1.0], budget=5.0, items=1)
    both = PromptStatistics.combine(a, a)
    for name in PromptStatistics._fields:
        value = getattr(both, name)
        assert type(value) is type(getattr(a, name)) or value is None, name


# --- across processes ----------------------------------------------------------------


def test_a_snapshot_pickles_and_goes_through_json() -> None:
    stats = process([1.0, 2.0], budget=5.0, items=2)._replace(
        agreement_by_size=MappingProxyType({4: Agreement(9, 10, 0.6, 0.98)})
    )
    again = pickle.loads(pickle.dumps(stats))
    assert same(again, stats)
    assert isinstance(again.calls_by_lane, MappingProxyType)
    through_json = PromptStatistics.from_dict(json.loads(json.dumps(stats.as_dict())))
    assert same(through_json, stats)
    assert through_json.agreement_by_size[4] == Agreement(9, 10, 0.6, 0.98)


CHILD = """
import pickle, sys
from coalesce._observe.recorder import PromptRecorder
from coalesce._pricing import Price
from coalesce.providers import Usage
rec = PromptRecorder("tag", "m", prices=Price(1.0, 10.0), telemetry=False)
rec.request_sent(2)
rec.request_finished(2, Usage(1000, 100), shared_input_tokens=200)
for latency in (1.0, 3.0):
    rec.call_finished(latency, budget=2.0, ok=True)
sys.stdout.buffer.write(pickle.dumps(rec.snapshot()))
"""


def test_snapshots_of_other_processes_combine() -> None:
    children = [
        pickle.loads(
            subprocess.run([sys.executable, "-c", CHILD], capture_output=True, check=True).stdout
        )
        for _ in range(2)
    ]
    both = PromptStatistics.combine(*children)
    assert (both.calls, both.requests, both.calls_with_budget) == (4, 2, 4)
    assert both.within_budget == 0.5
    assert both.estimated_cost == pytest.approx(2 * (1000 * 1.0 + 100 * 10.0) / 1e6)
