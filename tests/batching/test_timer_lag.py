"""The timer learns how late it wakes and wakes that much early (``_batching/timer.py``).

Pure: the lag is fed lateness directly. The timer itself runs in every batcher test,
on virtual time, where it is never late and the lead stays 0."""

from __future__ import annotations

import anyio
import pytest

import coalesce
from coalesce._batching.policy import DispatchReason
from coalesce._batching.timer import TimerLag
from coalesce._batching.window import Window


def test_no_lead_until_enough_wake_ups_were_measured() -> None:
    lag = TimerLag(min_samples=20)
    for _ in range(19):
        lag.observe(0.03)
    assert lag.lead == 0.0
    lag.observe(0.03)
    assert lag.lead == pytest.approx(0.03)


def test_the_lead_is_a_high_quantile_of_recent_lateness() -> None:
    lag = TimerLag(window=100, quantile=0.99, min_samples=20)
    for n in range(100):
        lag.observe(0.001 if n % 50 else 0.04)  # two wake-ups in 100 were 40 ms late
    assert lag.lead == pytest.approx(0.04)
    for _ in range(100):  # the loop is idle again: the busy past is forgotten
        lag.observe(0.0005)
    assert lag.lead == pytest.approx(0.0005)


def test_the_lead_is_bounded_and_early_wake_ups_count_as_on_time() -> None:
    lag = TimerLag(min_samples=1, ceiling=0.1)
    lag.observe(5.0)  # a loop blocked for seconds must not make every window go early
    assert lag.lead == 0.1
    lag = TimerLag(min_samples=1)
    lag.observe(-0.002)
    assert lag.lead == 0.0


@pytest.mark.anyio
async def test_on_virtual_time_the_timer_is_never_late() -> None:
    seen: list[list[int]] = []

    @coalesce.batch(max_wait=0.5, max_items=100)
    async def echo(items: list[int]) -> list[int]:
        seen.append(items)
        return items

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(echo, n)
            await anyio.sleep(0.1)
    assert echo._dispatcher.lag.lead == 0.0
    # Windows of 0.5 s at one call per 0.1 s: five or six calls each, none early.
    assert all(5 <= len(batch) <= 6 for batch in seen[:-1]), [len(b) for b in seen]


def test_a_max_wait_window_is_woken_for_no_earlier_than_half_its_wait() -> None:
    lag = TimerLag(min_samples=1)
    lag.observe(0.079)  # longer than the window's wait
    window = Window("k", opened_at=10.0, due_at=10.05)
    assert lag.wake_at(window) == pytest.approx(10.025)
    window.due_reason = DispatchReason.DEADLINE  # a planner's deadline: the whole lead
    assert lag.wake_at(window) == pytest.approx(10.05 - 0.079)
    lag = TimerLag(min_samples=1)
    lag.observe(0.01)
    assert lag.wake_at(Window("k", opened_at=10.0, due_at=10.05)) == pytest.approx(10.04)
    assert lag.wake_at(Window("k", opened_at=10.0, due_at=9.0)) == 9.0  # overdue: now


@pytest.mark.anyio
async def test_a_lead_longer_than_the_wait_does_not_close_windows_as_they_open() -> None:
    # A lead learned on a saturated loop (here set by hand) once closed every window
    # with the calls of one loop turn, and the timer, never sleeping, never unlearnt it.
    seen: list[list[int]] = []

    @coalesce.batch(max_wait=0.05, max_items=1000)
    async def echo(items: list[int]) -> list[int]:
        seen.append(items)
        return items

    async with anyio.create_task_group() as tg:
        tg.start_soon(echo, -1)
        await anyio.sleep(0.001)
        echo._dispatcher.lag.lead = 0.1
        for n in range(100):
            tg.start_soon(echo, n)
            await anyio.sleep(0.001)
    sizes = [len(batch) for batch in seen]
    assert min(sizes[:-1]) >= 25, sizes  # each window open half its wait at least
    assert max(sizes) <= 51, sizes  # and never past it
