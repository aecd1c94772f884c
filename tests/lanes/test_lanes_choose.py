"""Lane choice by deadline (issue 14, point 1): pure, with hand-built inputs."""

from __future__ import annotations

import math
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity import AsyncRetrying, RetryCallState

from coalesce import ConfigurationError
from coalesce._engine.spec import LANE_CHOICES, LaneChoice, Options
from coalesce._lanes.choose import (
    FLEX_RETRIES,
    Lane,
    LaneTimes,
    check_lane,
    choose_lane,
    flex_again,
)
from coalesce._lanes.flex import FLEX_BACKOFF

ALL = frozenset(Lane)
NO_FLEX = frozenset({Lane.REALTIME, Lane.BATCH})
TIMES = LaneTimes()
HOUR = 3600.0


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (None, Lane.REALTIME),  # nobody said the call may wait
        (2.0, Lane.REALTIME),
        (14 * 60, Lane.REALTIME),
        (15 * 60, Lane.REALTIME),  # flex's promise, without the collection wait
        (15 * 60 + 60, Lane.FLEX),
        (24 * HOUR, Lane.FLEX),  # the batch window alone, without the collection wait
        (24 * HOUR + 60, Lane.BATCH),
        (48 * HOUR, Lane.BATCH),
    ],
)
def test_auto_takes_the_cheapest_lane_whose_promise_fits_the_budget(
    budget: float | None, expected: Lane
) -> None:
    assert choose_lane("auto", budget, ALL, TIMES) is expected


def test_a_provider_without_flex_keeps_minutes_in_real_time() -> None:
    assert choose_lane("auto", 30 * 60, NO_FLEX, TIMES) is Lane.REALTIME
    assert choose_lane("auto", 30 * HOUR, NO_FLEX, TIMES) is Lane.BATCH


def test_an_explicit_lane_is_kept_whatever_the_budget() -> None:
    assert choose_lane("batch", 1.0, ALL, TIMES) is Lane.BATCH
    assert choose_lane("realtime", 48 * HOUR, ALL, TIMES) is Lane.REALTIME


@given(
    budget=st.one_of(st.none(), st.floats(min_value=0, max_value=1e7)),
    collect=st.floats(min_value=0, max_value=HOUR),
    batch=st.floats(min_value=HOUR, max_value=48 * HOUR),
)
def test_auto_never_batches_a_call_whose_budget_ends_before_the_batch_promise(
    budget: float | None, collect: float, batch: float
) -> None:
    times = LaneTimes(batch=batch, collect=collect)
    chosen = choose_lane("auto", budget, ALL, times)
    if chosen is Lane.BATCH:
        assert budget is not None
        assert budget >= batch + collect
    if chosen is Lane.FLEX:
        assert budget is not None
        assert budget >= times.flex + collect


def test_bad_lanes_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="lane must be one of 'auto'"):
        check_lane("nightly", ALL)
    with pytest.raises(ConfigurationError, match=r"lane='flex' is not offered.*lane='auto'"):
        check_lane("flex", NO_FLEX)
    assert check_lane("auto", NO_FLEX) == "auto"
    with pytest.raises(ConfigurationError, match=r"LaneTimes\.batch must be seconds"):
        LaneTimes(batch=math.inf)


def test_the_lane_names_have_one_source_and_one_rule() -> None:
    assert ("auto", *(lane.value for lane in Lane)) == LANE_CHOICES
    assert get_args(LaneChoice) == LANE_CHOICES  # the annotation spells the same values
    for bad in ("nightly", None, Lane.BATCH.name):
        with pytest.raises(ConfigurationError, match="lane must be one of 'auto'") as options:
            Options(lane=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError) as lanes:
            check_lane(bad, frozenset(Lane))
        assert str(options.value) == str(lanes.value)


def _after_refusals(refusals: int) -> RetryCallState:
    """tenacity's state after ``refusals`` attempts, built by hand (as tenacity's tests do)."""
    state = RetryCallState(AsyncRetrying(), None, (), {})
    state.attempt_number = refusals
    return state


def test_flex_backs_off_from_30_seconds_doubling_to_5_minutes() -> None:
    waits = [FLEX_BACKOFF(_after_refusals(n)) for n in range(1, 7)]
    assert waits == [30.0, 60.0, 120.0, 240.0, 300.0, 300.0]


@pytest.mark.parametrize(
    ("left", "delay", "refusals", "again"),
    [
        (30 * 60, 30.0, 1, True),
        (16 * 60 + 30, 30.0, 1, True),  # exactly flex's promise and window after the wait
        (16 * 60 + 29, 30.0, 1, False),
        (math.inf, 300.0, FLEX_RETRIES, True),  # no deadline: a few times, then real time
        (math.inf, 300.0, FLEX_RETRIES + 1, False),
    ],
)
def test_flex_is_asked_again_only_while_the_budget_covers_flex(
    left: float, delay: float, refusals: int, again: bool
) -> None:
    assert flex_again(left, delay, refusals, TIMES) is again


@given(st.floats(0, 48 * HOUR), st.floats(0, 600), st.integers(1, FLEX_RETRIES))
def test_flex_again_keeps_choose_lanes_promise(left: float, delay: float, refusals: int) -> None:
    # Asking flex again never sends a call where choose_lane would not have sent it.
    if flex_again(left, delay, refusals, TIMES):
        assert choose_lane("auto", left - delay, ALL, TIMES) in (Lane.FLEX, Lane.BATCH)
