"""How the batcher meets event loops: asyncio's awaitables, sequential loops, trio."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from coalesce import Batcher


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


def test_a_busy_batcher_refuses_a_second_loop() -> None:
    batcher = Batcher(echo, max_wait=10.0)

    async def other_loop() -> None:
        await batcher("other")

    async def main() -> None:
        pending = batcher("held")
        with pytest.raises(RuntimeError, match="another event loop"):
            await anyio.to_thread.run_sync(lambda: asyncio.run(other_loop()))
        await batcher.aclose()
        assert await pending == ("echo", "held")

    asyncio.run(main())


def test_calling_without_an_event_loop_says_so() -> None:
    batcher = Batcher(echo)
    with pytest.raises(RuntimeError, match="running asyncio or trio event loop"):
        batcher(1)
