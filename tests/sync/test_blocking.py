"""``f.sync``: a prompt function called from threads and synchronous code, and from
event loops other than the one its batcher serves (real time, see ``conftest.py``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import anyio
import pytest
from _threads import CALLS, MOST_REQUESTS, Tag, expected, in_threads, make_tag, tickets

import coalesce
from coalesce.testing import SimulatedProvider


def test_40_calls_from_a_thread_pool_coalesce(sim: SimulatedProvider) -> None:
    tag = make_tag(sim.openai_client(max_retries=0))
    items = tickets()
    answers = in_threads(tag.sync, items)
    assert answers == [expected(sim, item) for item in items]
    assert sim.statistics().requests == CALLS // 10 <= MOST_REQUESTS
    # Nothing is left broken: the main thread's event loops are served as well.
    later = tickets(10, prefix="later")

    async def from_a_loop() -> list[Tag]:
        return list(await asyncio.gather(*(tag(item) for item in later)))

    assert asyncio.run(from_a_loop()) == [expected(sim, item) for item in later]
    on_trio = tickets(10, prefix="trio")

    async def from_trio() -> list[Tag]:
        found: list[Any] = [None] * len(on_trio)

        async def one(index: int) -> None:
            found[index] = await tag(on_trio[index])

        async with anyio.create_task_group() as tg:
            for index in range(len(on_trio)):
                tg.start_soon(one, index)
        return found

    assert anyio.run(from_trio, backend="trio") == [expected(sim, item) for item in on_trio]
    assert sim.statistics().requests == CALLS // 10 + 2
    tag.sync.close()


def test_40_threads_each_running_their_own_event_loop_coalesce(sim: SimulatedProvider) -> None:
    """The shape that failed (issues 25 and 34): ``asyncio.run(tag(ticket))`` in each
    thread of a pool. Once a second loop calls, the function's work moves to the
    background loop (what waited on the first loop with it), and every call is served
    there, forwarded from the thread's own loop."""
    tag = make_tag(sim.openai_client(max_retries=0))
    items = tickets()
    answers = in_threads(lambda item: asyncio.run(tag(item)), items)
    assert answers == [expected(sim, item) for item in items]
    assert sim.statistics().requests <= MOST_REQUESTS
    # Afterwards, calls from the main thread's loop are served too, and coalesce.
    later = tickets(10, prefix="later")

    async def from_a_loop() -> list[Tag]:
        return list(await asyncio.gather(*(tag(item) for item in later)))

    assert asyncio.run(from_a_loop()) == [expected(sim, item) for item in later]
    tag.sync.close()


def test_map_and_imap_from_synchronous_code(sim: SimulatedProvider) -> None:
    tag = make_tag(sim.openai_client(max_retries=0))
    items = tickets(30)
    seen: list[tuple[int, int]] = []
    answers = tag.sync.map(items, on_progress=lambda done, total: seen.append((done, total)))
    assert answers == [expected(sim, item) for item in items]
    assert seen[-1] == (30, 30)
    pairs = list(tag.sync.imap(items[:20], ordered=False))
    assert sorted(index for index, _ in pairs) == list(range(20))
    assert all(answer == expected(sim, items[index]) for index, answer in pairs)
    in_order = list(tag.sync.imap(items[:10]))
    assert in_order == [(index, expected(sim, items[index])) for index in range(10)]
    tag.sync.close()


def test_a_failed_call_raises_in_its_own_thread(sim: SimulatedProvider) -> None:
    tag = make_tag(sim.openai_client(max_retries=0), max_wait=0.0)
    with pytest.raises(TypeError, match="tag"):
        tag.sync(ticket="a", other="b")  # type: ignore[call-arg]
    [error] = tag.sync.map([("a", "b")])  # one parameter: the tuple is the ticket
    assert isinstance(error, coalesce.InvalidInputError)
    tag.sync.close()


def test_a_latency_budget_block_holds_for_a_blocking_call(sim: SimulatedProvider) -> None:
    tag = make_tag(sim.openai_client(max_retries=0), max_wait=0.0)
    tag.sync("no budget")
    assert math.isnan(tag.statistics().within_budget)
    with coalesce.latency_budget(30.0):
        tag.sync("with a budget")
    assert tag.statistics().within_budget == 1.0
    tag.sync.close()


def test_a_method_has_a_blocking_form_too(sim: SimulatedProvider) -> None:
    client = sim.openai_client(max_retries=0)

    class Desk:
        def __init__(self, prefix: str) -> None:
            self.prefix = prefix

        @coalesce.prompt(client=client, model="gpt-4o-mini", max_wait=0.0)
        async def tag(self, ticket: str) -> Tag:
            """Tag the support ticket with its category and urgency."""

    desk = Desk("d")
    assert desk.tag.sync("ticket") == expected(sim, "ticket")
    assert desk.tag.sync.map(["a", "b"]) == [expected(sim, "a"), expected(sim, "b")]
    Desk.tag.sync.close()


def test_a_blocking_call_inside_a_running_loop_says_to_await(sim: SimulatedProvider) -> None:
    tag = make_tag(sim.openai_client(max_retries=0))

    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"await the async form instead: await f\(\.\.\.\)"):
            tag.sync("inside")
        with pytest.raises(RuntimeError, match="would stop that loop"):
            tag.sync.map(["inside"])

    asyncio.run(main())
