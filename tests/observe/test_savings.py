"""Savings accounting (coalesce._observe.savings): pure, on hand-built token counts.

A round price keeps the dollars easy to write: $1 per million input tokens, $10 per
million output tokens, $0.10 per million cached input tokens.
"""

from __future__ import annotations

import math

import pytest

from coalesce import PromptStatistics
from coalesce._observe.savings import Savings, Shares, Spent
from coalesce._pricing import Price
from coalesce.providers import Usage

ROUND = Price(1.0, 10.0, 0.1)


def approx(value: float) -> float:
    """``pytest.approx``, typed as the float it compares equal to."""
    result: float = pytest.approx(value)  # type: ignore[assignment]
    return result


def test_a_packed_reply_is_compared_with_one_plain_call_per_item() -> None:
    savings = Savings(ROUND)
    # 4 items: 1000 prompt tokens = 300 shared + 4 * 25 frame + 600 of the items' own;
    # 200 reply tokens = 4 * 5 answer keys + 180 of the answers' own.
    spent = savings.add(4, Usage(1000, 200), Shares(300, 100, frame=25, answer_frame=5))
    # Plain calls: 600 own + 4 * 100 instructions = 1000 prompt tokens, 180 output.
    assert spent == Spent(approx(1000e-6 + 2000e-6), approx(1000e-6 + 1800e-6), 1000)
    assert savings.statistics()["input_tokens_one_per_item"] == 1000
    assert savings.statistics()["savings"] == approx(1 - 3000 / 2800)


def test_totals_add_up_over_replies_and_lanes() -> None:
    savings = Savings(ROUND)
    savings.add(2, Usage(500, 100), Shares(300, 300))  # plain: 200 + 2 * 300 = 800
    savings.add(2, Usage(500, 100), Shares(300, 300), lane="flex")  # billed at half price
    stats = savings.statistics()
    assert (stats["input_tokens"], stats["output_tokens"]) == (1000, 200)
    assert stats["input_tokens_one_per_item"] == 1600
    assert stats["estimated_cost"] == approx(1500e-6 + 750e-6)
    assert dict(stats["cost_by_lane"]) == {"realtime": approx(1500e-6), "flex": approx(750e-6)}
    # The baseline is real-time plain calls at list price, whatever the lane.
    assert stats["estimated_cost_one_per_item"] == approx(2 * (800e-6 + 1000e-6))


def test_a_reask_costs_and_adds_nothing_to_the_baseline() -> None:
    savings = Savings(ROUND)
    spent = savings.add(1, Usage(400, 10, cached_input_tokens=100), Shares(300, 300), reask=True)
    assert spent == Spent(approx(300e-6 + 10e-6 + 100e-6), 0.0, 0)
    assert savings.cost_one_per_item == 0.0
    assert savings.cached_input_tokens == 100


def test_the_baseline_reads_a_warm_cache_as_plain_calls_would() -> None:
    savings = Savings(ROUND)
    # 3 plain calls of 100 own + 200 instructions, each reading 150 from the cache.
    spent = savings.add(3, Usage(500, 0), Shares(200, 200, plain_cached=150))
    assert spent.input_tokens_one_per_item == 900
    assert spent.cost_one_per_item == approx((900 - 450) * 1e-6 + 450 * 0.1e-6)
    # A request of one item is its own plain call: its cache counts for the baseline.
    single = savings.add(1, Usage(300, 0, cached_input_tokens=280), Shares(200, 200))
    assert single.cost == approx(single.cost_one_per_item)


def test_negative_estimates_count_as_zero() -> None:
    savings = Savings(ROUND)
    spent = savings.add(2, Usage(100, 10), Shares(500, -5, frame=-1, answer_frame=-1))
    assert spent.input_tokens_one_per_item == 0
    assert spent.cost_one_per_item == approx(10 * 10e-6)


def test_without_usage_nothing_is_added() -> None:
    savings = Savings(ROUND)
    spent = savings.add(3, None, Shares(100, 100))
    assert math.isnan(spent.cost)
    assert math.isnan(spent.cost_one_per_item)
    assert spent.input_tokens_one_per_item == 0
    assert math.isnan(savings.spend(None))
    assert (savings.input_tokens, savings.cost) == (0, 0.0)


def test_without_a_price_tokens_count_and_dollars_are_nan() -> None:
    savings = Savings(None)
    spent = savings.add(2, Usage(500, 100), Shares(300, 300))
    assert math.isnan(spent.cost)
    assert spent.input_tokens_one_per_item == 800
    assert math.isnan(savings.spend(Usage(50, 5)))
    stats = savings.statistics()
    assert (stats["input_tokens"], stats["output_tokens"]) == (550, 105)
    for name in ("estimated_cost", "estimated_cost_one_per_item", "savings"):
        assert math.isnan(stats[name]), name


def test_a_checking_call_is_spent_at_real_time_prices_with_no_saving() -> None:
    savings = Savings(ROUND)
    assert savings.spend(Usage(1000, 100, cached_input_tokens=500)) == approx(
        500e-6 + 50e-6 + 1000e-6
    )
    stats = savings.statistics()
    assert stats["estimated_cost"] == approx(1550e-6)
    assert dict(stats["cost_by_lane"]) == {"realtime": approx(1550e-6)}
    assert (stats["estimated_cost_one_per_item"], stats["input_tokens_one_per_item"]) == (0, 0)
    assert math.isnan(stats["savings"])


def test_the_fields_are_prompt_statistics_fields() -> None:
    assert set(Savings(ROUND).statistics()) <= set(PromptStatistics._fields)
