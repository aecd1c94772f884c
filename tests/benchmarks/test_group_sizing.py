"""The benchmarks' yardstick: the best group size a budget allows (benchmarks/group_sizing.py)."""

from __future__ import annotations

import math

import pytest
from group_sizing import best_group_size, prompt_tokens_ratio
from hypothesis import given
from hypothesis import strategies as st

from coalesce._exceptions import ConfigurationError
from coalesce._planning.planner import Predict

FRAMES = {"per_item_overhead_tokens": 10, "per_item_output_overhead_tokens": 10}


def linear(overhead: float = 0.5, prefill: float = 1e-4, decode: float = 0.02) -> Predict:
    return lambda i, o: overhead + prefill * i + decode * o


def size(budget: float, **overrides: float) -> int:
    args: dict[str, float] = {
        "arrival_rate": 100.0,
        "budget": budget,
        "max_wait": 1.0,
        "shared_tokens": 500,
        "item_input_tokens": 40,
        "item_output_tokens": 10,
        "max_items": 64,
        **FRAMES,
    }
    args.update(overrides)
    return best_group_size(predict=linear(0.5, 1e-4, 0.01), **args)  # type: ignore[arg-type]


def test_best_group_size_by_hand() -> None:
    # k items: wait (k - 1) / 100, then 0.5 + 1e-4 * (500 + 50k) + 0.01 * 20k = 0.55 + 0.215k.
    # k = 5: 0.04 + 0.55 + 0.205 * 5 + 0.01 * 4 ... computed exactly below.
    def cost(k: int) -> float:
        return (k - 1) / 100 + 0.5 + 1e-4 * (500 + 50 * k) + 0.01 * 20 * k

    assert size(cost(5)) == 5
    assert size(cost(5) - 1e-6) == 4
    assert size(0.1) == 1  # nothing fits: alone, not never
    assert size(100.0) == 64  # capped by max_items
    assert size(100.0, max_wait=0.05) == 6  # at most 1 + 100/s * 0.05 s arrive in max_wait
    assert size(100.0, arrival_rate=math.inf, max_wait=0.0) == 64  # a burst


def test_best_group_size_when_streaming_by_hand() -> None:
    # Streamed, the last member (arrived last, at dispatch) is answered last:
    # 0.5 + 1e-4 * (500 + 50k) + 0.01 * 20k = 0.55 + 0.205k; the first, who waited
    # (k - 1) / 100 s, is answered 0.2 s after the first token: the last binds.
    def last(k: int) -> float:
        return 0.5 + 1e-4 * (500 + 50 * k) + 0.01 * 20 * k

    assert size(last(7), streaming=True) == 7
    assert size(last(7) - 1e-6, streaming=True) == 6
    assert size(last(7), streaming=False) < 7  # a whole reply makes everyone wait
    with pytest.raises(ConfigurationError):
        size(1.0, arrival_rate=0.0)


@given(
    st.floats(0.1, 30.0),
    st.floats(0.1, 30.0),
    st.floats(0.1, 1000.0),
    st.floats(0.0, 5.0),
)
def test_a_tighter_budget_never_gives_a_larger_group(
    a: float, b: float, rate: float, max_wait: float
) -> None:
    tight, loose = sorted((a, b))
    assert size(tight, arrival_rate=rate, max_wait=max_wait) <= size(
        loose, arrival_rate=rate, max_wait=max_wait
    )


def test_prompt_tokens_ratio() -> None:
    assert prompt_tokens_ratio(1, 500, 50) == 1.0
    assert prompt_tokens_ratio(10, 500, 50) == pytest.approx((50 + 50) / 550)
    assert prompt_tokens_ratio(4, 0, 50) == 1.0
    for bad in [(0, 1, 1), (2, 0, 0), (2, -1, 5)]:
        with pytest.raises(ConfigurationError):
            prompt_tokens_ratio(*bad)
