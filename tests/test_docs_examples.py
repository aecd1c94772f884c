"""The numbers the docs state are what the code does (issue 13, point 7).

Each example is run as the docs write it, on the simulated provider in process, on
virtual time.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

import coalesce
from coalesce._pricing import cost
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: int  # 1 (can wait) to 5 (on fire)


async def burst(fn: Any, n: int) -> list[float]:
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = anyio.current_time()
        await fn(f"ticket {i}: my invoice is wrong")
        latencies.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    await fn.aclose()
    return latencies


async def test_prompt_md_40_tickets_at_once_make_5_requests_of_8() -> None:
    sim = SimulatedProvider()
    client = sim.openai_client()

    @coalesce.prompt(client=client, model="gpt-4o-mini", max_items=8, latency_budget=3.0)
    async def tag_ticket(ticket: str) -> Tag:
        """Tag the support ticket with a category and an urgency from 1 to 5."""

    latencies = await burst(tag_ticket, 40)
    assert sorted(r.items for r in sim.requests) == [8] * 5
    assert max(latencies) <= 3.0
    assert tag_ticket.statistics().unmeetable_budgets == 0


async def test_a_generous_budget_fills_max_items_from_the_first_call() -> None:
    # A burst of 300 calls, max_items=20, a 30 s budget: 15 requests of 20, no slow start.
    sim = SimulatedProvider()

    @coalesce.prompt(client=sim.openai_client(), model="gpt-4o-mini", max_items=20,
                     latency_budget=30.0)  # fmt: skip
    async def tag_ticket(ticket: str) -> Tag:
        """Tag the support ticket with a category and an urgency from 1 to 5."""

    latencies = await burst(tag_ticket, 300)
    assert sorted(r.items for r in sim.requests) == [20] * 15
    assert max(latencies) <= 30.0


class ReadmeTag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


def _ledger_cost(sim: SimulatedProvider) -> float:
    price = coalesce.price_for("gpt-4o-mini")
    assert price is not None
    return sum(cost(r.prompt_tokens, r.completion_tokens, price) for r in sim.requests)


async def _steady_cost(rate: float, **options: Any) -> tuple[float, list[int]]:
    sim = SimulatedProvider()

    @coalesce.prompt(client=sim.openai_client(), model="gpt-4o-mini", latency_budget=2.0,
                     **options)  # fmt: skip
    async def tag(ticket: str) -> ReadmeTag:
        """Tag the support ticket with a category and an urgency.

        Categories: billing (invoices, charges, refunds, plans), bug (something in the
        product fails or behaves wrongly), account (sign-in, passwords, users, settings),
        other (anything else, including praise and feature requests).
        Urgency: high when the customer cannot work or is losing money now, or mentions a
        deadline today; medium when something is wrong but there is a workaround; low for
        questions, requests and anything that can wait. Judge by what the ticket says has
        happened, not by its tone: an angry ticket about a typo is still low.
        """

    async with anyio.create_task_group() as tg:
        for i in range(int(rate * 20)):
            tg.start_soon(tag, f"ticket {i}: my invoice is wrong")
            await anyio.sleep(1 / rate)
    await tag.aclose()
    return _ledger_cost(sim), [r.items for r in sim.requests]


@pytest.mark.parametrize("rate", [2.0, 30.0, 50.0])
async def test_readme_tag_at_steady_traffic_costs_no_more_than_plain_calls(rate: float) -> None:
    # The README's example as written, at steady traffic (evenly spaced calls), against
    # the same calls made one by one (groups of one are plain calls): never dearer.
    (coalesced, _), (plain, sizes) = await _steady_cost(rate), await _steady_cost(rate, max_items=1)
    assert set(sizes) == {1}
    assert coalesced <= plain * 1.001
