"""``vote=True`` through the drop-in client: each packed group is asked a second time in
the reverse order, as under ``@coalesce.prompt``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import coalesce
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio

SYSTEM = "Summarise the support ticket in a few words. " * 80


async def _ask_four(client: Any) -> list[str]:
    answers: list[str] = [""] * 4

    async def one(index: int) -> None:
        reply = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"ticket {index}: the printer is on fire"},
            ],
        )
        answers[index] = reply.choices[0].message.content

    async with anyio.create_task_group() as tg:
        for index in range(4):
            tg.start_soon(one, index)
    return answers


@pytest.mark.parametrize("vote", [True, False])
async def test_wrap_votes_in_two_orders(vote: bool) -> None:
    sim = SimulatedProvider()
    client = coalesce.wrap(
        sim.openai_client(max_retries=0), max_items=4, max_wait=1.0, packing="always", vote=vote
    )
    answers = await _ask_four(client)
    assert all(answers)
    stats = client.statistics()["gpt-4o-mini"]  # type: ignore[attr-defined]
    packed = [record.items for record in sim.requests]
    if vote:
        assert packed == [4, 4]  # the usual order, and the reverse one
        assert (stats.requests, stats.vote_requests, stats.votes_settled) == (1, 1, 0)
    else:
        assert packed == [4]
        assert stats.vote_requests == 0
