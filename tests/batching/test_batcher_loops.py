"""How the batcher meets event loops: asyncio's awaitables, sequential loops, trio, calls
forwarded from other loops and threads."""

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


def test_a_batcher_moves_to_a_new_loop_once_idle() -> None:
    batcher = Batcher(echo, max_wait=0.001)

    async def main(item: str) -> Any:
        return await batcher(item)

    assert asyncio.run(main("first")) == ("echo", "first")
    assert asyncio.run(main("second")) == ("echo", "second")
    assert anyio.run(main, "on trio", backend="trio") == ("echo", "on trio")
    assert batcher.statistics().items_completed == 3


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


def test_a_call_from_a_second_loop_is_served_in_the_batchers_loop() -> None:
    seen = Seen()
    batcher = Batcher(seen, max_wait=30.0, max_items=2)

    async def main() -> None:
        held = batcher("held")  # binds the batcher to this loop; waits for company
        other = _in_thread(asyncio.run, _call(batcher, "other"))
        assert await held == ("echo", "held")
        assert await asyncio.wrap_future(other) == ("echo", "other")

    asyncio.run(main())
    assert seen.batches == [["held", "other"]]  # one batch: the window filled
    assert seen.threads == [threading.current_thread().name]
    # Afterwards a new loop (its first one ended) is served as before.
    assert asyncio.run(_gather(batcher, "a", "b")) == [("echo", "a"), ("echo", "b")]


async def _call(batcher: Batcher[Any, Any], item: Any) -> Any:
    return await batcher(item)


async def _gather(batcher: Batcher[Any, Any], *items: Any) -> list[Any]:
    return list(await asyncio.gather(*(batcher(item) for item in items)))


@pytest.mark.parametrize(("home", "other"), [("asyncio", "trio"), ("trio", "asyncio")])
def test_calls_are_forwarded_between_asyncio_and_trio(home: str, other: str) -> None:
    seen = Seen()
    batcher = Batcher(seen, max_wait=30.0, max_items=2)

    async def from_other_loop() -> Any:
        return await batcher("forwarded")

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
        return [*held, forwarded]

    assert anyio.run(main, backend=home) == [("echo", "held"), ("echo", "forwarded")]
    assert seen.batches == [["held", "forwarded"]]


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
        # Another thread's call lands in this loop's window: polled, as nothing here
        # is told when it does.
        while batcher.statistics().queue_depth < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        queued.set()
        await asyncio.wrap_future(thread)
        while batcher.statistics().queue_depth > 1:  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # the withdrawal crosses back to this loop
        stays = [batcher("stays"), batcher("also")]
        assert await held == ("echo", "held")
        assert await asyncio.gather(*stays) == [("echo", "stays"), ("echo", "also")]

    asyncio.run(main())
    assert cancelled.is_set()
    assert seen.batches == [["held", "stays", "also"]]
    stats = batcher.statistics()
    assert (stats.items_cancelled, stats.items_submitted) == (1, 4)


def test_a_call_whose_loop_ends_under_it_is_served_again_in_the_background() -> None:
    """The batcher's loop (a worker thread's asyncio.run) ends while a call forwarded
    to it from another loop waits: that call is served again, on the background loop
    (the batcher is shared, so it settles where no loop's end cuts its work short)."""
    bound, started = threading.Event(), threading.Event()

    async def blocks_outside_the_background(items: list[Any]) -> list[Any]:
        if threading.current_thread().name != "coalesce-background-loop":
            started.set()
            await anyio.sleep_forever()  # cancelled when its loop ends
        return [("echo", item) for item in items]

    batcher = Batcher(blocks_outside_the_background, max_wait=0.01, max_items=2)

    async def first() -> None:
        asyncio.create_task(_call(batcher, "abandoned"))  # noqa: RUF006 - cancelled at the end
        await asyncio.sleep(0)
        bound.set()
        await asyncio.to_thread(started.wait)  # then return: asyncio.run cancels the rest

    ending = _in_thread(asyncio.run, first())
    bound.wait()
    second = _in_thread(asyncio.run, _call(batcher, "forwarded"))
    ending.result()
    assert second.result() == ("echo", "forwarded")
    # Later calls from a worker thread's loop are served there too, and coalesce.
    assert _in_thread(asyncio.run, _call(batcher, "later")).result() == ("echo", "later")


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
        ({"same_loop": True, "bound": True, "home_running": True}, R.HERE),
        ({"bound": True, "home_running": True}, R.HOME),
        ({"bound": True, "home_running": True, "idle": True, "may_bind": True}, R.HOME),
        ({"bound": True, "home_running": True, "home_ending": True}, R.WAIT),
        ({"bound": True, "home_running": True, "home_ending": True, "idle": True}, R.HERE),
        ({"bound": True, "home_running": False}, R.HERE),
        ({"bound": False}, R.HERE),
        ({"bound": True, "home_running": False, "shared": True}, R.BACKGROUND),
        ({"bound": True, "home_running": False, "shared": True, "may_bind": True}, R.HERE),
        (
            {
                "bound": True,
                "home_running": True,
                "home_ending": True,
                "idle": True,
                "shared": True,
            },
            R.BACKGROUND,
        ),
    ],
)
def test_route(case: dict[str, bool], expected: Route) -> None:
    given = dict.fromkeys(
        ("same_loop", "bound", "home_running", "home_ending", "idle", "shared", "may_bind"),
        False,
    )
    assert route(**{**given, **case}) is expected
