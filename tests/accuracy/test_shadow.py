"""The shadow guard's decisions (issue 15, point 3; issue 24, the learned cap), pure:
sampling, verdicts, the cap's rise and fall, the thinning of the shadow calls."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import coalesce
from coalesce._accuracy.learning import (
    MIN_SAMPLES,
    STEP_ALLOWANCE,
    TAIL_SAMPLES,
    TOP_SAMPLES,
    Move,
    fills,
    in_tail,
    learning_wanted,
    next_cap,
    verdicts_to_rise,
)
from coalesce._accuracy.shadow import ShadowGuard
from coalesce._observe.agreement import wilson_interval


def test_wilson_interval_of_known_counts() -> None:
    low, high = wilson_interval(18, 30)
    assert low == pytest.approx(0.4232, abs=1e-4)
    assert high == pytest.approx(0.7541, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(30, 30)
    assert high == 1.0
    assert 0.88 < low < 0.89


def cap_after(cap: int, limit: int, sizes: dict[int, list[bool]], bad: int | None = None) -> int:
    return next_cap(cap, limit, bad, sizes, [], {}, 0.9).cap


def test_confident_disagreement_at_a_size_halves_the_cap_below_it() -> None:
    bad = [True] * 18 + [False] * 12  # 60% agreement: confidently under 90%
    assert cap_after(16, 16, {16: bad}) == 8
    assert cap_after(8, 16, {8: bad}) == 4
    assert cap_after(2, 16, {2: bad}) == 1
    assert cap_after(1, 16, {2: bad}) == 1
    move = next_cap(16, 16, None, {16: bad}, [], {}, 0.9)
    assert move.bad == 16
    assert "groups of 16 is 18/30" in move.reason


def test_too_few_verdicts_or_a_plausible_rate_keep_the_cap() -> None:
    assert cap_after(16, 16, {16: [False] * (MIN_SAMPLES - 1)}) == 16
    plausible = [True] * 26 + [False] * 4  # 87%: not confidently under 90%
    assert cap_after(16, 16, {16: plausible}) == 16
    assert next_cap(16, 16, None, {16: plausible}, [], {}, 0.9).reason == ""


def test_sizes_above_the_cap_do_not_count_against_it() -> None:
    bad = [False] * 40
    assert cap_after(4, 16, {8: bad}) == 4


def top(cap: int) -> dict[int, tuple[int, int]]:
    """Enough agreeing verdicts at the top of ``cap``'s tail."""
    return {cap: (TOP_SAMPLES, TOP_SAMPLES)}


def test_a_confidently_good_tail_doubles_the_cap_up_to_its_limit() -> None:
    need = verdicts_to_rise(0.9)
    assert need == 25  # the one-sided 95% lower bound of 25/25 is over 0.9, of 24/24 under
    good = [True] * need
    assert next_cap(4, 32, None, {}, good, top(4), 0.9).cap == 8
    assert next_cap(16, 32, None, {}, good, top(16), 0.9).cap == 32
    assert next_cap(32, 32, None, {}, good, top(32), 0.9).cap == 32  # never above the limit
    assert next_cap(16, 20, None, {}, good, top(16), 0.9).cap == 20
    assert next_cap(4, 32, None, {}, good[:-1], top(4), 0.9).cap == 4  # not confident yet
    assert next_cap(4, 32, None, {}, good, top(4), 0.9, rise=False).cap == 4
    move = next_cap(4, 32, None, {}, good, top(4), 0.9)
    assert "past position 2 is 25/25" in move.reason


def test_the_cap_rises_only_on_evidence_from_groups_that_reached_it() -> None:
    # Groups of 8 allowed, but they held 5 or 6: nothing is known of positions 7 and 8.
    good = [True] * 35
    assert next_cap(8, 32, None, {}, good, {5: (20, 20), 6: (15, 15)}, 0.9).cap == 8
    short = {5: (20, 20), 7: (TOP_SAMPLES - 1, TOP_SAMPLES - 1)}
    assert next_cap(8, 32, None, {}, good, short, 0.9).cap == 8
    assert next_cap(8, 32, None, {}, good, {5: (27, 27), 8: (8, 8)}, 0.9).cap == 16


def test_the_cap_never_rises_to_a_size_judged_too_large() -> None:
    good = [True] * 35
    assert next_cap(4, 32, 8, {}, good, top(4), 0.9).cap == 6  # half way to 8
    assert next_cap(6, 32, 8, {}, good, top(6), 0.9).cap == 7
    assert next_cap(6, 32, 7, {}, good, top(6), 0.9) == Move(6, 7)
    assert next_cap(1, 32, 2, {}, good, {}, 0.9).cap == 1


def test_a_bad_tail_lowers_the_cap_to_just_before_its_first_weak_position() -> None:
    # Groups of 8 whose answers go wrong past position 6.
    tail = [True, True, False, False] * 3
    positions = {5: (3, 3), 6: (3, 3), 7: (0, 3), 8: (0, 3)}
    move = next_cap(8, 32, None, {}, tail, positions, 0.9)
    assert move.cap == 6
    assert move.bad == 7
    assert "position 7 is the first weak one" in move.reason
    assert next_cap(8, 32, None, {}, tail[:-1], positions, 0.9).cap == 8  # too few yet
    # Every tail position weak: down to half the cap.
    assert next_cap(8, 32, None, {}, [False] * 12, {5: (0, 3)}, 0.9).cap == 4


def test_one_position_confidently_wrong_lowers_the_cap_before_it() -> None:
    # Mostly short groups: the tail as a whole looks fine, position 7 alone does not.
    tail = [True] * 40 + [False] * 8
    positions = {5: (25, 25), 6: (15, 15), 7: (0, 8)}
    move = next_cap(8, 32, None, {}, tail, positions, 0.9)
    assert (move.cap, move.bad) == (6, 7)
    assert "position 7 is 0/8" in move.reason
    assert next_cap(8, 32, None, {}, tail[:-1], {**positions, 7: (0, 7)}, 0.9).cap == 8


@pytest.mark.parametrize(
    ("cap", "size", "position", "tail"),
    [
        (8, 8, 5, True),
        (8, 8, 4, False),
        (8, 5, 5, True),
        (8, 4, 4, False),
        (8, 16, 9, False),
        (4, 3, 3, True),
        (2, 2, 2, True),
        (2, 2, 1, False),
        (1, 2, 2, False),
        (8, 8, 0, False),
    ],
)
def test_the_tail_of_a_cap(cap: int, size: int, position: int, tail: bool) -> None:
    assert in_tail(cap, size, position) is tail


def test_learning_shadows_the_tail_until_the_step_is_decided() -> None:
    need = verdicts_to_rise(0.9)

    def wanted(tail: list[bool], pending: int, spent: int, position: int = 5, **top: int) -> bool:
        places = {8: (top["at_top"], top["at_top"])} if top else {}
        return learning_wanted(8, position, tail, places, pending, spent, 0.9)

    assert wanted([], 0, 0)
    assert wanted([True] * 10, need - 11, 10)
    assert not wanted([True] * 10, need - 10, 10)  # enough on the way
    assert wanted([True] * 10 + [False], need - 10, 11)  # one more needed
    assert not wanted([], 0, STEP_ALLOWANCE * need)  # allowance spent
    # Good so far, but not from groups that reached the cap: only the top is wanted.
    assert not wanted([True] * need, 0, need, position=6)
    assert wanted([True] * need, 0, need, position=7)
    assert not wanted([True] * need, 0, need, position=8, at_top=TOP_SAMPLES)  # decided


@given(rate=st.floats(min_value=0.001, max_value=1.0), packed=st.integers(0, 3000))
def test_exactly_the_rate_of_packed_items_is_shadowed(rate: float, packed: int) -> None:
    guard = ShadowGuard(rate, 0.9, 16)
    shadowed = sum(guard.wants(8, 1 + n % 8) for n in range(packed))
    assert shadowed == math.floor(packed * rate)
    assert not guard.wants(1)  # a plain call has nothing to check


@given(
    rate=st.floats(min_value=0.0, max_value=0.2),
    agreement=st.lists(st.floats(min_value=0.5, max_value=1.0), min_size=32, max_size=32),
    seed=st.integers(0, 2**16),
)
def test_the_long_run_shadow_rate_stays_within_the_bound(
    rate: float, agreement: list[float], seed: int
) -> None:
    # Whatever the model answers (agreement per position, on a seeded die), learning
    # spends at most its allowance per move of the cap, and the moves are few: past
    # them, exactly the user's rate.
    rng = random.Random(seed)
    guard = ShadowGuard(rate, 0.9, 32, learn=True, start=4)
    steps = 0
    for n in range(20_000):
        size = guard.cap
        position = 1 + n % size
        if guard.wants(size, position):
            guard.record(size, True, rng.random() < agreement[position - 1], position)
        steps = len(guard.moves)
    allowance = STEP_ALLOWANCE * verdicts_to_rise(0.9)
    assert guard.shadowed == math.floor(guard.packed * rate)
    assert guard.learning_requests <= allowance * (steps + 1)
    assert steps <= 32 * 7  # each fall lowers the highest size the cap may reach


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
    learning = guard.learning()
    assert (learning.cap, learning.limit, learning.learned, learning.bad) == (8, 16, False, 16)
    assert [(a, b) for a, b, _ in learning.moves] == [(16, 8)]


def test_a_pinned_cap_climbs_back_to_max_items_but_not_over() -> None:
    guard = ShadowGuard(1.0, 0.9, 16, min_samples=10**6)
    guard.cap = 4
    for position in range(35):
        guard.record(4, "a", "a", 3 + position % 2)
    assert guard.cap == 8
    for position in range(35):
        guard.record(8, "a", "a", 5 + position % 4)
    assert guard.cap == 16
    for position in range(35):
        guard.record(16, "a", "a", 9 + position % 8)
    assert guard.cap == 16


def test_learning_shadows_the_tail_densely_then_only_at_the_rate() -> None:
    # A model right at any size: 4 -> 8 -> 16 -> 32, each step on a few dozen tail
    # verdicts; then 1% of the packed items.
    guard = ShadowGuard(0.01, 0.9, 32, learn=True, start=4)
    asked = []
    for n in range(4000):
        size = guard.cap
        position = 1 + n % size
        if guard.wants(size, position):
            asked.append(n)
            guard.record(size, "a", "a", position)
    assert [(a, b) for a, b, _ in guard.moves] == [(4, 8), (8, 16), (16, 32)]
    assert guard.learning_requests <= 4 * verdicts_to_rise(0.9)
    late = [n for n in asked if n >= 2000]
    assert len(late) <= 0.01 * 2000 + 1


def test_the_traffic_fills_a_cap_when_enough_items_were_in_groups_at_its_top() -> None:
    assert fills(8, [])  # nothing seen: nothing says otherwise
    assert fills(4, [4] * 10)
    assert not fills(8, [5, 6] * 40)  # groups end at 6: a cap of 16 would carry nothing
    assert fills(8, [7] * 20 + [5] * 80)  # a fifth reached the top
    assert not fills(8, [7] * 19 + [5] * 81)


def test_a_cap_the_traffic_does_not_fill_is_judged_for_a_fall_only() -> None:
    # Every verdict good so far, the step undecided: while the traffic fills the cap,
    # learning asks for the evidence of a rise; while it does not, only for enough to
    # judge a fall.
    tail = [True] * TAIL_SAMPLES
    assert learning_wanted(8, 6, tail, {}, pending=0, spent=TAIL_SAMPLES, min_agreement=0.9)
    assert not learning_wanted(
        8, 6, tail, {}, pending=0, spent=TAIL_SAMPLES, min_agreement=0.9, filled=False
    )
    few = [True] * (TAIL_SAMPLES - 2)
    assert learning_wanted(8, 6, few, {}, pending=1, spent=11, min_agreement=0.9, filled=False)


def test_groups_ended_by_the_budget_below_the_cap_stop_the_learning_of_a_rise() -> None:
    # A model right at any size, traffic that makes groups of 5 and 6: the cap rises
    # to 8 on groups of 4, then learning stops after the fall-judging tail; the
    # groups of 4 (at the top of 4) had filled the first step.
    guard = ShadowGuard(0.0, 0.9, 32, learn=True, start=4)
    for n in range(3000):
        size = min(guard.cap, 5 + n // 7 % 2)
        if guard.wants(size, 1 + n % size):
            guard.record(size, "a", "a", 1 + n % size)
    assert [(a, b) for a, b, _ in guard.moves] == [(4, 8)]
    assert guard.learning_requests <= verdicts_to_rise(0.9) + TAIL_SAMPLES + 2


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


def test_learning_shadows_until_a_disagreement_could_still_be_outweighed() -> None:
    from coalesce._accuracy.learning import Z, learning_wanted, verdicts_to_decide
    from coalesce._observe.agreement import wilson_interval

    assert [verdicts_to_decide(d, 0.9) for d in range(4)] == [25, 42, 58, 72]
    for d in range(4):
        n = verdicts_to_decide(d, 0.9)
        low, before = wilson_interval(n - d, n, Z)[0], wilson_interval(n - 1 - d, n - 1, Z)[0]
        assert low >= 0.9 > before
    # Two disagreements in 43 verdicts: still undecided (the one-sided lower bound is
    # under 0.9), so learning goes on asking, up to 58 verdicts, and not past them.
    tail = [False, False] + [True] * 41
    assert learning_wanted(8, 6, tail, {}, pending=0, spent=50, min_agreement=0.9)
    tail = [False, False] + [True] * 56
    assert not learning_wanted(8, 6, tail, {}, pending=0, spent=70, min_agreement=0.9)
    # Confidently below the bar: the cap falls, no more shadow calls for this step.
    tail = [False] * 10 + [True] * 10
    assert not learning_wanted(8, 6, tail, {}, pending=0, spent=20, min_agreement=0.9)


def test_a_cold_burst_goes_one_over_the_cap_until_anything_is_learned() -> None:
    guard = ShadowGuard(0.01, 0.9, 32, learn=True, start=4)
    assert (guard.cap, guard.burst_cap()) == (4, 5)
    assert ShadowGuard(0.01, 0.9, 4, learn=True, start=4).burst_cap() == 4  # within its limit
    assert ShadowGuard(0.01, 0.9, 32, start=4).burst_cap() == 4  # a cap not learned
    guard.bad = 5  # a size judged too large: nothing is tried blind any more
    assert guard.burst_cap() == 4


def test_a_tail_wrong_from_its_first_verdicts_is_asked_until_the_cap_can_fall() -> None:
    # 0 of 1 is "confidently under 0.9" by its upper bound, but the cap falls on no
    # fewer than TAIL_SAMPLES tail verdicts (or POSITION_SAMPLES at one position):
    # stopping there left the cap up, its answers wrong, with only the long-run rate on.
    from coalesce._accuracy.learning import TAIL_SAMPLES, learning_wanted

    for wrong in (1, 5, TAIL_SAMPLES - 1):
        tail = [False] * wrong
        assert learning_wanted(4, 3, tail, {}, pending=0, spent=wrong, min_agreement=0.9)
    tail = [False] * TAIL_SAMPLES
    assert not learning_wanted(4, 3, tail, {}, pending=0, spent=12, min_agreement=0.9)
    assert next_cap(4, 32, None, {}, tail, {}, 0.9).cap < 4
