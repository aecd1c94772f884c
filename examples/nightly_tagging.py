"""Background traffic: a nightly job that tags yesterday's support tickets.

Nobody waits for it, so it takes a generous latency budget (groups grow large and
the shared instructions are paid once per big group) and its own function, so it
never competes with the real-time path in `copilot_endpoint.py`. Run it with
``python examples/nightly_tagging.py``: it uses the simulated provider, in process.

(A job with hours to spare and thousands of items may be cheaper still on the
providers' batch APIs; coalescing suits jobs that must finish within minutes.)
"""

from __future__ import annotations

from typing import Literal

import anyio
from pydantic import BaseModel

import coalesce
from coalesce.testing import SimulatedProvider


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


async def main() -> None:
    sim = SimulatedProvider(time_scale=0.01)  # a hundred times faster than life
    client = sim.openai_client()

    @coalesce.prompt(
        client=client,
        model="gpt-4o-mini",
        latency_budget=60.0,  # background: a minute per ticket is fine
        max_items=40,
        max_wait=2.0,
        max_concurrency=4,  # stay polite to the shared rate limit
    )
    async def tag(ticket: str) -> Tag:  # type: ignore[empty-body]
        """Tag the support ticket with a category and an urgency."""

    tickets = [f"ticket {n}: something about my account" for n in range(400)]
    tags: list[Tag] = []

    async def one(ticket: str) -> None:
        tags.append(await tag(ticket))

    async with anyio.create_task_group() as tg:
        for ticket in tickets:
            tg.start_soon(one, ticket)
    await tag.aclose()
    stats = tag.statistics()
    print(
        f"{stats.calls} tickets in {stats.requests} requests"
        f" ({stats.items_per_request:.0f} per request); estimated cost"
        f" ${stats.estimated_cost:.4f}, {stats.savings:.0%} less than one call per ticket"
    )


if __name__ == "__main__":
    anyio.run(main)
