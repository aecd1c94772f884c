"""Calls from event loops that start and end: ``asyncio.run`` in each thread of a pool
(a script, a Celery task, a synchronous view calling async code), against the simulator
over real HTTP (real time, see ``conftest.py``).

The first loop that calls a function serves it while it is the only one; once another
loop calls, or that loop ends, the function's work (its windows, its requests, the
SDK client's connections) lives on the background loop, which ends only with the
process. What waited on the first loop moves there with it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from _threads import CALLS, GROUP, Tag, expected, in_threads, make_tag, tickets

import coalesce
from coalesce.testing import SimulatedProvider

#: Runs of the 40-thread shape per test: each one a function of its own, as in a
#: process of its own.
RUNS = 20
#: The most requests 40 calls of a cold function may take here: most of them must share
#: a request with calls of other loops (the failure of issue 34 sent each loop's call
#: alone: 40 requests). How many exactly depends on the real clock: on an idle machine
#: 8 groups of 5 and the shadow guard's checks with the default options, 2 groups of 20
#: with ``max_items=20``; on a busy one a call can reach the planner with too little of
#: its budget left for a paying group on the latency prior, and the planner sends it
#: alone as a probe and holds the others for its reply, then groups sized by what the
#: reply taught, and a leftover below the paying size as plain calls. The exact count,
#: independent of scheduling, is checked by the full-groups test below.
COLD_MOST = CALLS // 2
#: The only reasons a call of these runs may be sent plain: the cold probe above (a
#: leftover of one item goes "alone").
COLD_REASONS = {"cold", "below_paying", "alone"}


def tagger(client: Any, **options: Any) -> coalesce.PromptFunction[[str], Tag]:
    """A tagging function with the default options and a latency budget."""

    @coalesce.prompt(client=client, model="gpt-4o-mini", latency_budget=2.0, **options)
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket with its category and urgency."""

    return tag


@pytest.mark.parametrize(
    ("options", "most"),
    [
        # Issue 34's measurement: a 2 s budget and max_items=20.
        pytest.param({"max_items": 20}, COLD_MOST, id="max_items=20"),
        # The default options: the learned group cap starts at the paying size.
        pytest.param({}, COLD_MOST, id="default"),
    ],
)
def test_40_threads_each_running_asyncio_run(
    sim: SimulatedProvider, url: str, options: dict[str, Any], most: int
) -> None:
    """The shape that failed (issue 34): every call answered, 20 runs out of 20."""
    client = sim.openai_client(url, max_retries=0)
    for run in range(RUNS):
        tag = tagger(client, **options)
        items = tickets(prefix=f"run {run}")
        before = sim.statistics().requests
        answers = in_threads(lambda item, tag=tag: asyncio.run(tag(item)), items)
        assert answers == [expected(sim, item) for item in items]
        tag.sync.close()  # the shadow guard's checks of this run are sent too
        assert sim.statistics().requests - before <= most
        assert set(tag.statistics().plain_calls) <= COLD_REASONS


def test_40_threads_each_running_asyncio_run_in_full_groups(
    sim: SimulatedProvider, url: str
) -> None:
    """Groups made full by count: 40 calls from 40 loops take 4 requests, every run."""
    client = sim.openai_client(url, max_retries=0)
    for run in range(RUNS):
        tag = make_tag(client)
        items = tickets(prefix=f"run {run}")
        before = sim.statistics().requests
        answers = in_threads(lambda item, tag=tag: asyncio.run(tag(item)), items)
        assert answers == [expected(sim, item) for item in items]
        assert sim.statistics().requests - before == CALLS // GROUP
        tag.sync.close()


def test_40_threads_each_running_asyncio_run_through_a_wrapped_client(
    sim: SimulatedProvider, url: str
) -> None:
    client = coalesce.wrap(
        sim.openai_client(url, max_retries=0), max_items=GROUP, max_wait=5.0, packing="always"
    )

    async def tag(ticket: str) -> str | None:
        reply = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": "Tag the support ticket."},
                {"role": "user", "content": ticket},
            ],
        )
        return reply.choices[0].message.content

    for run in range(5):
        items = tickets(prefix=f"run {run}")
        before = sim.statistics().requests
        answers = in_threads(lambda item: asyncio.run(tag(item)), items)
        assert all(isinstance(answer, str) and answer for answer in answers)
        assert sim.statistics().requests - before == CALLS // GROUP


def test_blocking_calls_after_an_asyncio_run_are_answered(sim: SimulatedProvider, url: str) -> None:
    """The SDK client's first connection belongs to the loop asyncio.run closed: the
    background loop sends through connections of its own."""
    tag = tagger(sim.openai_client(url, max_retries=0))
    assert asyncio.run(tag("first")) == expected(sim, "first")
    threads = [f"thread {index}" for index in range(20)]

    def five(prefix: str) -> list[Tag]:
        return [tag.sync(item) for item in tickets(5, prefix)]

    answers = in_threads(five, threads)
    assert answers == [[expected(sim, item) for item in tickets(5, prefix)] for prefix in threads]
    tag.sync.close()


def test_a_loop_that_ends_with_its_call_in_flight_cuts_no_other_short(
    sim: SimulatedProvider, url: str
) -> None:
    """A thread's loop ends (its call cancelled with it) while the request carrying its
    item and another thread's is in flight: the other is answered by that request."""
    tag = make_tag(sim.openai_client(url, max_retries=0), max_items=2)
    bound, in_flight = threading.Event(), threading.Event()

    async def leaves() -> None:
        asyncio.create_task(tag("leaves"))  # noqa: RUF006 - cancelled as its loop ends
        await asyncio.sleep(0)
        bound.set()
        await asyncio.to_thread(in_flight.wait)  # then return: asyncio.run cancels it

    def stays() -> Tag:
        bound.wait()
        return asyncio.run(tag("stays"))

    first = threading.Thread(target=asyncio.run, args=(leaves(),))
    first.start()
    answers: list[Tag] = []
    second = threading.Thread(target=lambda: answers.append(stays()))
    second.start()
    while not tag.batcher_statistics().batches_in_flight and second.is_alive():
        threading.Event().wait(0.001)  # polled: nothing here is told when it goes
    in_flight.set()
    first.join()
    second.join()
    assert answers == [expected(sim, "stays")]
    stats = sim.statistics()
    assert (stats.requests, stats.items) == (1, 2)  # both in one request, none asked again
    tag.sync.close()


def test_asyncio_runs_one_after_another_in_one_thread(sim: SimulatedProvider, url: str) -> None:
    """A script calling ``asyncio.run(tag(ticket))`` in a loop: each run's loop closes
    before the next starts, and each call is answered."""
    tag = tagger(sim.openai_client(url, max_retries=0))
    items = tickets(5)
    assert [asyncio.run(tag(item)) for item in items] == [expected(sim, item) for item in items]
    tag.sync.close()
