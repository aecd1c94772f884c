"""The first job on a fresh store (issue 35): a cold burst of a structured-output
function is packed where packing pays, and learning the group cap is paid for by what
packing saved, so the first job costs less than plain calls, shadow calls included.

The simulated provider in process, on virtual time; each test has its own store.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

import coalesce
from coalesce.testing import SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]

README = """Tag the support ticket with a category and an urgency.

Categories: billing (invoices, charges, refunds, plans), bug (something in the
product fails or behaves wrongly), account (sign-in, passwords, users, settings),
other (anything else, including praise and feature requests).
Urgency: high when the customer cannot work or is losing money now, or mentions a
deadline today; medium when something is wrong but there is a workaround; low for
questions, requests and anything that can wait. Judge by what the ticket says has
happened, not by its tone: an angry ticket about a typo is still low.
"""
SHORT = README.splitlines()[0]  # packing pays only from groups of 5


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


def tagger(sim: SimulatedProvider, instructions: str, **options: Any) -> Any:
    async def tag(ticket: str) -> Tag: ...

    tag.__doc__ = instructions
    client = sim.openai_client(max_retries=0)
    return coalesce.prompt(client=client, model="gpt-4o-mini", latency_budget=2.0, **options)(tag)


def tickets(n: int) -> list[str]:
    return [f"Ticket {i}: I was charged twice for my plan this month." for i in range(n)]


async def test_a_cold_burst_of_structured_calls_is_packed_and_learning_waits() -> None:
    sim = SimulatedProvider()
    fn = tagger(sim, README)
    async with anyio.create_task_group() as tg:
        for ticket in tickets(50):
            tg.start_soon(fn, ticket)
    await fn.aclose()
    stats = fn.statistics()
    # 50 calls in groups of the starting cap (4): 13 requests. Before the fix, four
    # learning shadow calls came on top (17), paid by this very burst.
    assert len(sim.requests) <= 15, [r.items for r in sim.requests]
    assert stats.shadow_requests == 0
    assert stats.input_tokens < stats.input_tokens_one_per_item
    assert stats.savings > 0


async def test_the_first_map_costs_less_than_plain_calls_with_short_instructions() -> None:
    # Packing pays from groups of 5 and saves little per item: learning must not spend
    # more than packing saved (before the fix: 14 shadow calls, "saved -13%").
    sim = SimulatedProvider()
    fn = tagger(sim, SHORT)
    assert fn.statistics().smallest_paying_group == 5
    await fn.map(tickets(100))
    await fn.aclose()
    stats = fn.statistics()
    assert stats.group_cap == 5  # the cap starts where packing pays
    assert stats.savings > 0, str(stats)
    assert stats.input_tokens < 0.8 * stats.input_tokens_one_per_item
    assert sum(r.items for r in sim.requests if r.items > 1) >= 90  # most calls packed


async def test_a_long_first_job_learns_within_what_packing_saved() -> None:
    sim = SimulatedProvider()
    fn = tagger(sim, README)
    await fn.map(tickets(400))
    await fn.aclose()
    stats = fn.statistics()
    learning = stats.cap_learning
    assert learning is not None
    assert learning.learning_requests > 0  # it does learn, once savings pay for a step
    # Learning spends at most half of what packing saved (before the fix it spent from
    # the 32nd packed item on, whatever packing had saved).
    saved_tokens = stats.input_tokens_one_per_item - (
        stats.input_tokens - stats.shadow_input_tokens
    )
    assert stats.shadow_input_tokens <= saved_tokens / 2
    assert stats.savings > 0
