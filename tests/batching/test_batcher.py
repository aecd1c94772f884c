"""Behaviour of the micro-batcher, on asyncio and trio, on virtual time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

import coalesce
from coalesce import (
    Batcher,
    BatcherClosedError,
    BatchError,
    ConfigurationError,
    QueueFull,
    ResultCountError,
)
from coalesce._batching.window import Window, Windows

pytestmark = pytest.mark.anyio


class Recorder:
    """A batch function that records each batch and when it was dispatched."""

    def __init__(self, duration: float = 0.0) -> None:
        self.batches: list[list[Any]] = []
        self.times: list[float] = []
        self.duration = duration

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        self.times.append(anyio.current_time())
        if self.duration:
            await anyio.sleep(self.duration)
        return [("result", item) for item in items]


async def call_all(fn: Any, items: list[Any]) -> list[Any]:
    """Call ``fn`` concurrently once per item; results in item order."""
    results: list[Any] = [None] * len(items)

    async def one(index: int, item: Any) -> None:
        results[index] = await fn(item)

    async with anyio.create_task_group() as tg:
        for index, item in enumerate(items):
            tg.start_soon(one, index, item)
    return results


async def test_concurrent_calls_share_one_batch_and_get_their_own_results() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=0.05, max_items=100)
    results = await call_all(batcher, list(range(10)))
    assert results == [("result", i) for i in range(10)]
    assert [sorted(batch) for batch in recorder.batches] == [list(range(10))]


async def test_decorator_bare_and_with_options() -> None:
    @coalesce.batch
    async def double(items: list[int]) -> list[int]:
        return [2 * i for i in items]

    @coalesce.batch(max_items=2, max_wait=1.0)
    async def triple(items: list[int]) -> list[int]:
        return [3 * i for i in items]

    assert isinstance(double, Batcher)
    assert await call_all(double, [1, 2, 3]) == [2, 4, 6]
    assert await call_all(triple, [1, 2, 3]) == [3, 6, 9]
    assert triple.statistics().batches == 2
    assert triple.__name__ == "triple"


async def test_lone_call_is_dispatched_exactly_at_max_wait() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=0.25, max_items=10)
    start = anyio.current_time()
    assert await batcher("a") == ("result", "a")
    assert recorder.times == [start + 0.25]


async def test_window_boundary_not_before_max_wait() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=1.0, max_items=10)
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher, "first")
        await anyio.sleep(0.999)
        assert recorder.batches == []  # just before max_wait: still waiting
        tg.start_soon(batcher, "joins")
        await anyio.sleep(0.002)
        assert [sorted(b) for b in recorder.batches] == [["first", "joins"]]  # dispatched
        tg.start_soon(batcher, "next window")
    assert recorder.batches[1] == ["next window"]
    assert recorder.times == [start + 1.0, pytest.approx(start + 2.001)]


async def test_max_items_dispatches_full_batches_without_waiting() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=5.0, max_items=4)
    start = anyio.current_time()
    results = await call_all(batcher, list(range(10)))
    assert results == [("result", i) for i in range(10)]
    assert [len(b) for b in recorder.batches] == [4, 4, 2]
    assert recorder.times == [start, start, start + 5.0]
    stats = batcher.statistics()
    assert {k: v for k, v in stats.dispatch_reasons.items() if v} == {"full": 2, "window": 1}
    assert set(stats.dispatch_reasons) == {str(reason) for reason in coalesce.DispatchReason}
    assert stats.max_batch_size == 4
    assert stats.mean_batch_size == pytest.approx(10 / 3)


async def test_partitions_never_share_a_batch_and_have_their_own_windows() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=1.0, max_items=3, partition=lambda item: item[0])
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for item in ["a1", "b1", "a2"]:
            tg.start_soon(batcher, item)
        await anyio.sleep(0.5)
        for item in ["b2", "a3"]:  # a3 fills partition a; b waits for its own window
            tg.start_soon(batcher, item)
    by_partition = {
        b[0][0]: (sorted(b), t) for b, t in zip(recorder.batches, recorder.times, strict=False)
    }
    assert by_partition["a"] == (["a1", "a2", "a3"], start + 0.5)
    assert by_partition["b"] == (["b1", "b2"], start + 1.0)


async def test_size_limit_and_heavy_item_travels_alone() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=1.0, max_items=100, size=len, max_size=10)
    items = ["aaaa", "bbbb", "cccc", "x" * 25, "dd"]
    results = await call_all(batcher, items)
    assert results == [("result", item) for item in items]
    assert sorted(item for batch in recorder.batches for item in batch) == sorted(items)
    assert ["x" * 25] in recorder.batches  # heavier than max_size: alone, not dropped
    for batch in recorder.batches:
        assert len(batch) == 1 or sum(map(len, batch)) <= 10
    assert batcher.statistics().dispatch_reasons["size"] >= 2


async def test_batch_exception_reaches_every_caller_of_that_batch_only() -> None:
    boom = RuntimeError("provider down")

    async def flaky(items: list[str]) -> list[str]:
        if "bad" in items:
            raise boom
        return items

    # The partition pins which items share a batch, whatever the scheduling order.
    batcher = Batcher(flaky, max_wait=1.0, max_items=2, partition=lambda item: item[:2])
    outcomes: dict[str, Any] = {}

    async def one(item: str) -> None:
        try:
            outcomes[item] = await batcher(item)
        except RuntimeError as exc:
            outcomes[item] = exc

    async with anyio.create_task_group() as tg:
        for item in ["bad", "ba", "ok1", "ok2"]:
            tg.start_soon(one, item)
    assert outcomes["bad"] is boom
    assert outcomes["ba"] is boom
    assert outcomes == {"bad": boom, "ba": boom, "ok1": "ok1", "ok2": "ok2"}
    assert batcher.statistics().items_failed == 2


async def test_exception_in_result_list_reaches_only_its_caller() -> None:
    async def picky(items: list[int]) -> list[Any]:
        return [ValueError(f"odd {i}") if i % 2 else i for i in items]

    batcher = Batcher(picky, max_wait=1.0)
    outcomes: dict[int, Any] = {}

    async def one(item: int) -> None:
        try:
            outcomes[item] = await batcher(item)
        except ValueError as exc:
            outcomes[item] = str(exc)

    async with anyio.create_task_group() as tg:
        for item in range(4):
            tg.start_soon(one, item)
    assert outcomes == {0: 0, 1: "odd 1", 2: 2, 3: "odd 3"}
    stats = batcher.statistics()
    assert (stats.items_completed, stats.items_failed) == (2, 2)


@pytest.mark.parametrize("returned", [[1], [1, 2, 3]])
async def test_wrong_result_count_fails_every_caller(returned: list[int]) -> None:
    async def wrong(items: list[int]) -> list[int]:
        return returned

    batcher = Batcher(wrong, max_wait=1.0)
    errors: list[ResultCountError] = []

    async def one(item: int) -> None:
        with pytest.raises(ResultCountError) as info:
            await batcher(item)
        errors.append(info.value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 1)
        tg.start_soon(one, 2)
    assert len(errors) == 2
    assert (errors[0].expected, errors[0].received) == (2, len(returned))
    assert "2 items" in str(errors[0])
    assert f"returned {len(returned)} results" in str(errors[0])


async def test_non_list_result_is_a_batch_error() -> None:
    async def nothing(items: list[int]) -> Any:
        return None

    batcher = Batcher(nothing, max_wait=0.1)
    with pytest.raises(BatchError, match="must return a list"):
        await batcher(1)


async def test_cancelled_before_dispatch_is_taken_out_of_its_batch() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=1.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher, "stays")
        with anyio.move_on_after(0.5):
            await batcher("leaves")
        assert batcher.statistics().queue_depth == 1
    assert recorder.batches == [["stays"]]
    stats = batcher.statistics()
    assert (stats.items_cancelled, stats.items_completed, stats.queue_depth) == (1, 1, 0)


async def test_cancelled_after_dispatch_never_disturbs_the_others() -> None:
    recorder = Recorder(duration=1.0)
    batcher = Batcher(recorder, max_wait=0.1)
    results: list[Any] = []

    async def stays(item: str) -> None:
        results.append(await batcher(item))

    async with anyio.create_task_group() as tg:
        tg.start_soon(stays, "a")
        with anyio.move_on_after(0.5):  # dispatched at 0.1, batch runs until 1.1
            await batcher("leaves")
        tg.start_soon(stays, "b")
    assert [sorted(batch) for batch in recorder.batches] == [["a", "leaves"], ["b"]]
    assert sorted(results) == [("result", "a"), ("result", "b")]
    assert batcher.statistics().items_cancelled == 1


async def test_aclose_flushes_pending_waits_for_running_and_refuses_new_calls() -> None:
    recorder = Recorder(duration=2.0)
    batcher = Batcher(recorder, max_wait=10.0)
    results: list[Any] = []
    start = anyio.current_time()

    async def one(item: str) -> None:
        results.append(await batcher(item))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "a")
        tg.start_soon(one, "b")
        await anyio.sleep(1.0)
        await batcher.aclose()
        # aclose() returned only after the flushed batch finished.
        assert anyio.current_time() == start + 3.0
        assert recorder.times == [start + 1.0]
        await anyio.wait_all_tasks_blocked()
        assert sorted(results) == [("result", "a"), ("result", "b")]
    assert batcher.statistics().dispatch_reasons["close"] == 1
    assert batcher.closed
    with pytest.raises(BatcherClosedError, match="closed"):
        await batcher("late")
    await batcher.aclose()  # harmless twice


async def test_async_with_closes() -> None:
    recorder = Recorder()
    async with Batcher(recorder, max_wait=10.0) as batcher, anyio.create_task_group() as tg:
        tg.start_soon(batcher, 1)
        await anyio.wait_all_tasks_blocked()
        await batcher.aclose()
    assert recorder.batches == [[1]]
    assert recorder.times == [pytest.approx(recorder.times[0])]


async def test_backpressure_waits_for_room_and_nowait_raises_queue_full() -> None:
    recorder = Recorder(duration=1.0)
    batcher = Batcher(recorder, max_wait=0.5, max_items=2, max_pending=2, max_concurrency=1)
    results: list[Any] = []

    async def one(item: int) -> None:
        results.append(await batcher(item))

    async with anyio.create_task_group() as tg:
        for item in range(6):
            tg.start_soon(one, item)
        await anyio.wait_all_tasks_blocked()
        # [0, 1] running, [2, 3] queued behind max_concurrency; 4 and 5 wait for room.
        assert batcher.statistics().queue_depth == 2
        with pytest.raises(QueueFull, match="max_pending=2"):
            batcher.submit_nowait(99)
    assert sorted(results) == [("result", i) for i in range(6)]
    assert all(len(batch) <= 2 for batch in recorder.batches)


async def test_submit_nowait_returns_an_awaitable_result() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=0.1)
    first = batcher.submit_nowait("x")
    second = batcher.submit_nowait("y")
    assert await first == ("result", "x")
    assert await second == ("result", "y")
    assert recorder.batches == [["x", "y"]]


async def test_max_concurrency_limits_batches_in_flight() -> None:
    running = 0
    peak = 0

    async def slow(items: list[int]) -> list[int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(1.0)
        running -= 1
        return items

    batcher = Batcher(slow, max_wait=0.01, max_items=2, max_concurrency=2)
    start = anyio.current_time()
    assert await call_all(batcher, list(range(10))) == list(range(10))
    assert peak == 2
    assert anyio.current_time() == pytest.approx(start + 3.0)


async def test_statistics_wait_times_are_exact_on_virtual_time() -> None:
    recorder = Recorder()
    batcher = Batcher(recorder, max_wait=1.0, max_items=100)
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher, "a")
        await anyio.sleep(0.5)
        tg.start_soon(batcher, "b")
    stats = batcher.statistics()
    assert stats.items_submitted == stats.items_completed == 2
    assert stats.batches == 1
    assert stats.wait_p50 == pytest.approx(0.75)
    assert stats.wait_p99 == pytest.approx(0.995)
    assert stats.queue_depth == stats.batches_in_flight == 0


async def test_statistics_before_any_call() -> None:
    stats = Batcher(Recorder()).statistics()
    assert stats.items_submitted == stats.batches == 0
    assert math.isnan(stats.wait_p50)
    assert math.isnan(stats.mean_batch_size)


async def test_repr_shows_live_state() -> None:
    batcher = Batcher(Recorder(), max_wait=0.02, name="tagger")
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher, 1)
        await anyio.wait_all_tasks_blocked()
        text = repr(batcher)
        assert "tagger open: 1 pending in 1 windows" in text
        assert "next flush in 20.0 ms" in text
    await batcher.aclose()
    assert "closed" in repr(batcher)


async def test_method_gets_one_batcher_per_instance() -> None:
    class Tagger:
        def __init__(self, prefix: str) -> None:
            self.prefix = prefix
            self.batches: list[list[str]] = []

        @coalesce.batch(max_wait=0.1)
        async def tag(self, items: list[str]) -> list[str]:
            self.batches.append(items)
            return [self.prefix + item for item in items]

    first, second = Tagger("1:"), Tagger("2:")
    assert isinstance(Tagger.tag, coalesce.BatchMethod)
    assert first.tag is first.tag
    results = await call_all(lambda pair: pair[0].tag(pair[1]), [(first, "a"), (second, "b")])
    assert results == ["1:a", "2:b"]
    assert first.batches == [["a"]]
    assert second.batches == [["b"]]


async def test_exception_from_partition_reaches_only_that_caller() -> None:
    def key(item: int) -> int:
        if item < 0:
            raise KeyError(item)
        return 0

    batcher = Batcher(Recorder(), max_wait=0.1, partition=key)
    with pytest.raises(KeyError):
        await batcher(-1)
    assert await batcher(1) == ("result", 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_wait": -1}, "max_wait must be a finite number of seconds >= 0, got -1"),
        ({"max_wait": float("inf")}, "max_wait"),
        ({"max_items": 0}, "max_items must be an integer >= 1, got 0"),
        ({"max_items": 2.5}, "max_items"),
        ({"max_items": True}, "max_items"),
        ({"max_concurrency": 0}, "max_concurrency must be an integer >= 1 or None"),
        ({"max_pending": -3}, "max_pending"),
        ({"partition": 3}, "partition must be a callable"),
        ({"size": len}, "size and max_size go together"),
        ({"max_size": 10}, "size and max_size go together"),
        ({"size": len, "max_size": 0}, "max_size must be a finite number of size units > 0"),
    ],
)
def test_bad_options_are_rejected_at_decoration_time(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        coalesce.batch(**options)
    with pytest.raises(ConfigurationError):
        Batcher(Recorder(), **options)


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="max_items"):
        coalesce.batch(max_items=0)


class EarlyPolicy:
    """A planner in miniature: a second item brings the window's deadline forward,
    and an item named "huge" goes alone at once."""

    def before_add(self, members: Sequence[Any], item: Any, now: float) -> Any:
        return coalesce.DispatchReason.SOLO if item == "huge" else None

    def after_add(self, members: Sequence[Any], now: float) -> coalesce.Due | None:
        if len(members) == 2:
            return coalesce.Due(now + 0.05, coalesce.DispatchReason.DEADLINE)
        return None


async def test_a_policy_brings_the_timer_forward_and_sends_solo_items() -> None:
    recorder = Recorder()
    dispatched: list[tuple[str, int]] = []
    batcher = Batcher(
        recorder,
        max_wait=1.0,
        policy=EarlyPolicy(),
        on_dispatch=lambda reason, items: dispatched.append((str(reason), len(items))),
    )
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher, "a")
        await anyio.sleep(0.05)
        tg.start_soon(batcher, "huge")
        tg.start_soon(batcher, "b")
    batches = dict(zip(map(tuple, map(sorted, recorder.batches)), recorder.times, strict=True))
    assert batches == {("huge",): start + 0.05, ("a", "b"): pytest.approx(start + 0.1)}
    reasons = batcher.statistics().dispatch_reasons
    assert (reasons["solo"], reasons["deadline"], reasons["window"]) == (1, 1, 0)
    assert dispatched == [("solo", 1), ("deadline", 2)]


async def test_resolve_early_answers_a_caller_before_the_batch_returns() -> None:
    answered: list[tuple[str, float]] = []
    release = anyio.Event()

    async def fn(items: list[str], resolve: Any) -> None:
        resolve(items.index("a"), "early a")
        await release.wait()
        resolve(items.index("b"), ValueError("b"))  # a caller's own exception
        # "c" is left without a result: its caller must not wait forever

    batcher: Batcher[str, str] = Batcher(fn, max_wait=0.01, resolve_early=True, name="fn")

    async def call(item: str) -> None:
        try:
            answered.append((await batcher(item), anyio.current_time()))
        except Exception as exc:
            answered.append((f"{type(exc).__name__}: {exc}", anyio.current_time()))

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for item in ("a", "b", "c"):
            tg.start_soon(call, item)
        await anyio.sleep(1.0)
        assert answered == [("early a", pytest.approx(start + 0.01))]
        release.set()
    assert sorted(text.split(" for item")[0] for text, _ in answered) == [
        "BatchError: fn returned without a result",
        "ValueError: b",
        "early a",
    ]


async def test_batch_decorator_with_resolve_early_on_a_function_and_a_method() -> None:
    @coalesce.batch(resolve_early=True, max_wait=0.01)
    async def double(items: list[int], resolve: Any) -> None:
        for index, item in enumerate(items):
            resolve(index, 2 * item)

    class Tripler:
        @coalesce.batch(resolve_early=True, max_wait=0.01)
        async def triple(self, items: list[int], resolve: Any) -> list[int]:
            resolve(0, 3 * items[0])
            return [3 * item for item in items]

    tripler = Tripler()
    results: dict[str, int] = {}

    async def call(name: str, fn: Any, item: int) -> None:
        results[name] = await fn(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "d", double, 4)
        tg.start_soon(call, "t1", tripler.triple, 1)
        tg.start_soon(call, "t2", tripler.triple, 2)
    assert results == {"d": 8, "t1": 3, "t2": 6}


def test_the_window_bookkeeping_by_hand() -> None:
    """The queue the caller side fills and the dispatcher empties, with no event loop."""
    windows = Windows()
    first, second = Window("a", 0.0, 0.5), Window("b", 0.1, 0.2)
    windows.open.update(a=first, b=second)
    first.add("x", "waiter-x", 0.0)
    first.add("y", "waiter-y", 0.05)
    second.add("z", "waiter-z", 0.1)
    assert windows.pending == 3
    assert windows.next_due(by_due_time=False) is first  # opened first
    assert windows.next_due(by_due_time=True) is second  # a policy brought it forward
    assert windows.withdraw("waiter-x")
    assert first.items == ["y"]
    assert first.arrivals == [0.05]
    assert not windows.withdraw("waiter-x")  # gone already
    assert windows.withdraw("waiter-z")
    assert list(windows.open) == ["a"]  # an emptied window goes too
    windows.close(first)
    windows.ready.append(first)
    assert windows.pending == 1
    assert windows.withdraw("waiter-y")
    assert not windows.ready
