"""The gateway's ``x-coalesce-budget`` header sizes the wait without ``--budget``
(issue 35): a gateway started without a budget groups calls that each bring one as a
``--budget`` gateway does, and a call without one still goes after the default window.

Real time (sockets). Without a budget, calls 0.25 s apart, five times the 0.05 s
default window: each goes alone, unless the machine delays one by 0.2 s. With the
header, calls 0.1 s apart: twice the default window (without the header they would go
alone too), a fifth of the quarter of a 2 s budget (0.5 s) they may wait for company.
"""

from __future__ import annotations

import anyio
import openai
import pytest
from _serving import gateway_config, serving
from _traffic import Ticket, chat_body, expected_ticket, tickets

from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio

CALLS = 12
#: Seconds between calls without a budget, and with the header's.
APART, CLOSE = 0.25, 0.1


async def spaced(url: str, headers: dict[str, str], gap: float) -> None:
    """``CALLS`` calls, one every ``gap`` seconds, each checked against its answer."""
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-team", max_retries=0)
    asked = tickets(CALLS)

    async def one(text: str) -> None:
        reply = await client.chat.completions.create(**chat_body(text), extra_headers=headers)
        content = reply.choices[0].message.content or ""
        assert Ticket.model_validate_json(content) == expected_ticket(text)

    async with anyio.create_task_group() as tg:
        for text in asked:
            tg.start_soon(one, text)
            await anyio.sleep(gap)
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_the_budget_header_sizes_the_wait_without_a_configured_budget(
    sim: SimulatedProvider, sim_url: str
) -> None:
    async with serving(gateway_config(sim_url, budget=None)) as running:
        await spaced(running.openai_url, {}, APART)
        alone = len(sim.requests)
        await spaced(running.openai_url, {"x-coalesce-budget": "2"}, CLOSE)
    # Without any budget, each call went alone after the 0.05 s window.
    assert alone == CALLS
    # With the header, each waited up to a quarter of its 2 s budget for company.
    grouped = sim.requests[alone:]
    assert sum(record.items for record in grouped) == CALLS
    assert len(grouped) <= CALLS / 2, [record.items for record in grouped]
