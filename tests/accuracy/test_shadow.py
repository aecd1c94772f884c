"""The shadow guard's decisions (issue 15, point 3), pure: sampling, verdicts, the cap."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import coalesce
from coalesce._accuracy.shadow import MIN_SAMPLES, ShadowGuard, next_cap, wilson_interval


def test_wilson_interval_of_known_counts() -> None:
    low, high = wilson_interval(18, 30)
    assert low == pytest.approx(0.4232, abs=1e-4)
    assert high == pytest.approx(0.7541, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(30, 30)
    assert high == 1.0
    assert 0.88 < low < 0.89


def test_confident_disagreement_at_a_size_halves_the_cap_below_it() -> None:
    bad = [True] * 18 + [False] * 12  # 60% agreement: confidently under 90%
    assert next_cap(16, 16, {16: bad}, 0.9) == 8
    assert next_cap(8, 16, {8: bad}, 0.9) == 4
    assert next_cap(2, 16, {2: bad}, 0.9) == 1
    assert next_cap(1, 16, {2: bad}, 0.9) == 1


def test_too_few_verdicts_or_a_plausible_rate_keep_the_cap() -> None:
    assert next_cap(16, 16, {16: [False] * (MIN_SAMPLES - 1)}, 0.9) == 16
    plausible = [True] * 26 + [False] * 4  # 87%: not confidently under 90%
    assert next_cap(16, 16, {16: plausible}, 0.9) == 16


def test_sizes_above_the_cap_do_not_count_against_it() -> None:
    bad = [False] * 40
    assert next_cap(4, 16, {8: bad}, 0.9) == 4


def test_agreement_at_the_cap_lets_it_climb_one_at_a_time() -> None:
    good = [True] * (2 * MIN_SAMPLES)
    assert next_cap(4, 16, {4: good}, 0.9) == 5
    assert next_cap(16, 16, {16: good}, 0.9) == 16  # never above max_items
    assert next_cap(4, 16, {4: good[:-1]}, 0.9) == 4  # not enough verdicts yet


@given(rate=st.floats(min_value=0.001, max_value=1.0), packed=st.integers(0, 3000))
def test_exactly_the_rate_of_packed_items_is_shadowed(rate: float, packed: int) -> None:
    guard = ShadowGuard(rate, 0.9, 16)
    shadowed = sum(guard.wants(8) for _ in range(packed))
    assert shadowed == math.floor(packed * rate)
    assert not guard.wants(1)  # a plain call has nothing to check


def test_the_guard_brings_the_cap_down_and_reports_agreement_by_size() -> None:
    guard = ShadowGuard(1.0, 0.9, 16)
    for n in range(MIN_SAMPLES):
        guard.record(16, "positive", "positive" if n % 2 else "negative")
    assert guard.cap == 8
    for _ in range(MIN_SAMPLES):
        guard.record(8, "positive", "positive")
    assert guard.cap == 8
    agreement = guard.agreement()
    assert agreement[16] == coalesce.Agreement(15, 30, *wilson_interval(15, 30))
    assert agreement[16].rate == 0.5
    assert agreement[8].agreed == agreement[8].total == MIN_SAMPLES


def test_a_custom_agree_decides_and_one_that_raises_counts_as_a_disagreement() -> None:
    guard = ShadowGuard(1.0, 0.9, 8, agree=lambda a, b: a.lower() == b.lower())
    assert guard.record(8, "Yes", "yes")

    def broken(a: object, b: object) -> bool:
        raise ValueError("cannot compare")

    assert not ShadowGuard(1.0, 0.9, 8, agree=broken).record(8, "a", "a")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"shadow": 1.5}, r"shadow must be a fraction from 0 to 1, got 1.5 \(shadow=0.02"),
        ({"shadow": -0.1}, "shadow must be a fraction"),
        ({"min_agreement": 2}, "min_agreement must be a fraction from 0 to 1, got 2"),
        ({"agree": "equal"}, "agree"),
    ],
)
def test_bad_shadow_options_are_refused_at_decoration(
    options: dict[str, object], match: str
) -> None:
    with pytest.raises(coalesce.ConfigurationError, match=match):

        @coalesce.prompt(client=lambda request: request, model="m", **options)  # type: ignore[arg-type]
        async def f(text: str) -> str:
            """Say it."""
