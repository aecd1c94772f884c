"""How the batcher meets event loops: asyncio's awaitables, sequential loops, trio, and
calls from other loops and threads, which move its work to the background loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from coalesce import Batcher
from coalesce._batching.batcher import Route, route
from coalesce._batching.runtime import CARRIED

#: The thread of the background loop (coalesce._batching.portal).
BACKGROUND = "coalesce-background-loop"


async def echo(items: list[Any]) -> list[Any]:
    return [("echo", item) for item in items]


def test_asyncio_gather_spends_no_task_per_call() -> None:
    batcher = Batcher(echo, max_items=8, max_wait=0.001)

    async def main() -> None:
        before = len(asyncio.all_tasks())
        calls = [batcher(i) for i in range(20)]
        assert all(asyncio.isfuture(call) for call in calls)
        # Two full batches were dispatched as tasks; the last window has not yet.
        assert len(asyncio.all_tasks()) - before <= 3
        assert await asyncio.gather(*calls) == [("echo", i) for i in range(20)]

    asyncio.run(main())


def test_asyncio_create_task_and_anyio_start_soon_accept_a_call() -> None:
    batcher = Batcher(echo, max_wait=0.001)

    async def main() -> None:
        task = asyncio.create_task(batcher("task"))
        results: list[Any] = []

        async def keep(item: str) -> None:
            results.append(await batcher(item))

        async with anyio.create_task_group() as tg:
            tg.start_soon(batcher, "start_soon")
            tg.start_soon(keep, "kept")
        assert await task == ("echo", "task")
        assert results == [("echo", "kept")]

    asyncio.run(main())


def test_cancelling_the_task_that_drives_a_call_withdraws_it() -> None:
    seen: list[list[Any]] = []

    async def record(items: list[Any]) -> list[Any]:
        seen.append(items)
        return items

    batcher = Batcher(record, max_wait=0.05)

    async def main() -> None:
        task = asyncio.create_task(batcher("leaves"))
        stays = batcher("stays")
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await stays == "stays"

    asyncio.run(main())
    assert seen == [["stays"]]
    assert batcher.statistics().items_cancelled == 1


def test_a_batcher_whose_loop_ended_moves_to_the_background_loop() -> None:
    """The loop it served ended (its asyncio.run returned): the next loop's calls are
    served on the background loop, which outlives every other, and stay there."""
    seen = Seen()
    batcher = Batcher(seen, max_wait=0.001)

    async def main(item: str) -> Any:
        return await batcher(item)

    assert asyncio.run(main("first")) == ("echo", "first")
    assert asyncio.run(main("second")) == ("echo", "second")
    assert anyio.run(main, "on trio", backend="trio") == ("echo", "on trio")
    assert batcher.statistics().items_completed == 3
    assert seen.threads == ["MainThread", BACKGROUND, BACKGROUND]


def _in_thread(fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
    """``fn(*args)`` in a thread of its own (which may start an event loop)."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


class Seen:
    """A batch function that records each batch and the thread it ran in."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.threads: list[str] = []

    async def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        self.threads.append(threading.current_thread().name)
        return [("echo", item) for item in items]


def test_a_call_from_a_second_loop_moves_the_work_to_the_background_loop() -> None:
    """A second loop calls: what waits on the first moves to the background loop, where
    the calls of both share a batch; nothing of either runs on a loop that may end."""
    seen = Seen()
    batcher = Batcher(seen, max_wait=30.0, max_items=2)

    async def main() -> None:
        held = batcher("held")  # binds the batcher to this loop; waits for company
        other = _in_thread(asyncio.run, _call(batcher, "other"))
        assert await held == ("echo", "held")
        assert await asyncio.wrap_future(other) == ("echo", "other")

    asyncio.run(main())
    assert [sorted(batch) for batch in seen.batches] == [["held", "other"]]  # the window filled
    assert seen.threads == [BACKGROUND]
    # Afterwards a new loop's calls are served there too.
    assert asyncio.run(_gather(batcher, "a", "b")) == [("echo", "a"), ("echo", "b")]
    assert seen.threads == [BACKGROUND, BACKGROUND]


async def _call(batcher: Batcher[Any, Any], item: Any) -> Any:
    return await batcher(item)


async def _gather(batcher: Batcher[Any, Any], *items: Any) -> list[Any]:
    return list(await asyncio.gather(*(batcher(item) for item in items)))


@pytest.mark.parametrize(("home", "other"), [("asyncio", "trio"), ("trio", "asyncio")])
def test_calls_from_asyncio_and_trio_meet_on_the_background_loop(home: str, other: str) -> None:
    """From asyncio, the waiting item moves to the background loop and shares a batch
    there; from trio, whose clock is not the background loop's, it is sent at once
    (reason ``move``) where it is, and the batcher moves once it is done."""
    seen = Seen()
    batcher = Batcher(seen, max_wait=30.0, max_items=2)
    # From trio, the held item goes alone: two calls fill the next batch.
    others = ["forwarded"] if home == "asyncio" else ["forwarded", "also"]

    async def from_other_loop() -> list[Any]:
        found: list[Any] = []

        async def one(item: str) -> None:
            found.append(await batcher(item))

        async with anyio.create_task_group() as tg:
            for item in others:
                tg.start_soon(one, item)
        return sorted(found)

    async def main() -> list[Any]:
        held = []

        async def keep() -> None:
            held.append(await batcher("held"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep)
            await anyio.lowlevel.checkpoint()  # bound to this loop now
            forwarded = await anyio.to_thread.run_sync(
                lambda: anyio.run(from_other_loop, backend=other)
            )
        return [*held, *forwarded]

    answers = anyio.run(main, backend=home)
    assert answers == [("echo", "held"), *sorted(("echo", item) for item in others)]
    if home == "asyncio":
        assert [sorted(batch) for batch in seen.batches] == [["forwarded", "held"]]
        assert seen.threads == [BACKGROUND]
    else:
        assert [sorted(batch) for batch in seen.batches] == [["held"], sorted(others)]
        assert seen.threads == ["MainThread", BACKGROUND]
        assert batcher.statistics().dispatch_reasons["move"] == 1


_BUDGET: contextvars.ContextVar[float] = contextvars.ContextVar("budget", default=0.0)


def test_a_forwarded_call_carries_the_registered_context_variables() -> None:
    """A surface's context variables (the latency budget's block) follow a call to the
    batcher's loop; the caller's loop's own (sniffio's, anyio's) do not."""
    seen: list[float] = []

    async def note_budget() -> Any:
        seen.append(_BUDGET.get())
        return await batcher("carried")

    batcher = Batcher(echo, max_wait=30.0, max_items=2)

    async def in_a_thread() -> Any:
        _BUDGET.set(2.5)
        return await batcher.run_on_its_loop(note_budget)

    async def main() -> None:
        held = batcher("held")
        other = _in_thread(lambda: anyio.run(in_a_thread, backend="trio"))
        assert await held == ("echo", "held")
        assert await asyncio.wrap_future(other) == ("echo", "carried")

    CARRIED.append(_BUDGET)
    try:
        asyncio.run(main())
    finally:
        CARRIED.remove(_BUDGET)
    assert seen == [2.5]


def test_cancelling_a_forwarded_call_withdraws_its_item() -> None:
    seen = Seen()
    batcher = Batcher(seen, max_wait=30.0, max_items=3)
    queued, cancelled = threading.Event(), threading.Event()

    async def leaves() -> None:
        task = asyncio.create_task(_call(batcher, "leaves"))
        await asyncio.to_thread(queued.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled.set()

    async def main() -> None:
        held = batcher("held")
        thread = _in_thread(asyncio.run, leaves())
        # Both items land in the background loop's window: polled, as nothing here is
        # told when they do.
        while batcher.statistics().queue_depth < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        queued.set()
        await asyncio.wrap_future(thread)
        while batcher.statistics().queue_depth > 1:  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # the withdrawal crosses to the background loop
        both = asyncio.gather(batcher("stays"), batcher("also"))
        assert await held == ("echo", "held")
        assert await both == [("echo", "stays"), ("echo", "also")]

    asyncio.run(main())
    assert cancelled.is_set()
    assert seen.batches == [["held", "stays", "also"]]
    stats = batcher.statistics()
    assert (stats.items_cancelled, stats.items_submitted) == (1, 4)


def test_cancelling_a_call_whose_item_moved_withdraws_it_there() -> None:
    """An item moved from the loop it was made on to the background loop: its caller,
    still on its own loop, leaves, and the item leaves the background loop's window."""
    seen = Seen()
    batcher = Batcher(seen, max_wait=30.0, max_items=3)

    async def main() -> None:
        task = asyncio.create_task(_call(batcher, "leaves"))
        await asyncio.sleep(0)  # bound to this loop, the item in its window
        other = _in_thread(asyncio.run, _call(batcher, "other"))
        while batcher.statistics().queue_depth < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # both moved to the background loop's window
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while batcher.statistics().queue_depth > 1:  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # the withdrawal crosses to the background loop
        stays = await asyncio.gather(batcher("stays"), batcher("also"))
        assert stays == [("echo", "stays"), ("echo", "also")]
        assert await asyncio.wrap_future(other) == ("echo", "other")

    asyncio.run(main())
    assert seen.batches == [["other", "stays", "also"]]
    assert seen.threads == [BACKGROUND]


def test_a_loop_that_ends_cuts_short_no_other_loops_call() -> None:
    """A worker thread's loop (its asyncio.run) ends while another thread's call shares
    a batch with its own, in flight: that batch runs on the background loop, so the other
    call is answered by it, once, and the ended loop's own call is dropped."""
    ended, started = threading.Event(), threading.Event()

    async def slow(items: list[Any]) -> list[Any]:
        seen.batches.append(list(items))
        seen.threads.append(threading.current_thread().name)
        started.set()
        await anyio.to_thread.run_sync(ended.wait)  # in flight until the first loop ended
        return [("echo", item) for item in items]

    seen = Seen()
    batcher = Batcher(slow, max_wait=30.0, max_items=2)
    bound = threading.Event()

    async def first() -> None:
        asyncio.create_task(_call(batcher, "abandoned"))  # noqa: RUF006 - cancelled at the end
        await asyncio.sleep(0)
        bound.set()
        await asyncio.to_thread(started.wait)  # then return: asyncio.run cancels the rest

    ending = _in_thread(asyncio.run, first())
    bound.wait()
    second = _in_thread(asyncio.run, _call(batcher, "forwarded"))
    ending.result()
    ended.set()
    assert second.result() == ("echo", "forwarded")
    assert [sorted(batch) for batch in seen.batches] == [["abandoned", "forwarded"]]  # once
    assert seen.threads == [BACKGROUND]
    stats = batcher.statistics()
    assert (stats.items_completed, stats.items_cancelled) == (1, 1)
    # Later calls from a worker thread's loop are served there too.
    later = _in_thread(asyncio.run, _gather(batcher, "later", "too")).result()
    assert later == [("echo", "later"), ("echo", "too")]


def test_items_left_on_a_loop_closed_without_running_them_are_abandoned() -> None:
    """A loop closed with an item still in a window (it never cancelled its tasks):
    that item can never run, and the batcher moves on to the next loop."""
    batcher = Batcher(echo, max_wait=30.0, max_items=2)
    loop = asyncio.new_event_loop()

    async def leave_one() -> None:
        batcher("stranded")  # joins a window, never awaited

    loop.run_until_complete(leave_one())
    loop.close()
    assert batcher.statistics().queue_depth == 1
    assert asyncio.run(_gather(batcher, "a", "b")) == [("echo", "a"), ("echo", "b")]
    stats = batcher.statistics()
    assert (stats.items_submitted, stats.queue_depth, stats.items_completed) == (3, 0, 2)


def test_calling_without_an_event_loop_says_so() -> None:
    batcher = Batcher(echo)
    with pytest.raises(RuntimeError, match="running asyncio or trio event loop"):
        batcher(1)


R = Route


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # One loop so far: served where it runs, the first one binding it.
        ({"serving_here": True, "bound": True, "home_running": True}, R.HERE),
        ({}, R.HERE),
        # A second loop while the first still runs: the call goes to the background
        # loop, and waits there until the first has handed its work over.
        ({"bound": True, "home_running": True}, R.BACKGROUND),
        ({"bound": True, "home_running": True, "shared": True}, R.BACKGROUND),
        ({"bound": True, "home_running": True, "on_background": True}, R.WAIT),
        # Its loop ended, or handed over: the background loop binds it, others forward.
        ({"bound": True}, R.BACKGROUND),
        ({"bound": True, "on_background": True}, R.HERE),
        ({"shared": True}, R.BACKGROUND),
        ({"shared": True, "on_background": True}, R.HERE),
        # On the background loop: it stays there.
        (
            {"bound": True, "home_running": True, "home_background": True, "shared": True},
            R.BACKGROUND,
        ),
        ({"bound": True, "home_background": True, "shared": True}, R.BACKGROUND),
        ({"bound": True, "home_background": True, "on_background": True}, R.HERE),
    ],
)
def test_route(case: dict[str, bool], expected: Route) -> None:
    given = dict.fromkeys(
        ("serving_here", "bound", "home_running", "home_background", "shared", "on_background"),
        False,
    )
    assert route(**{**given, **case}) is expected
