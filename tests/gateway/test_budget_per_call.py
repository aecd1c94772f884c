"""The gateway's ``x-coalesce-budget`` header sizes the wait without ``--budget``
(issue 35): a gateway started without a budget groups calls that each bring one as a
``--budget`` gateway does, and a call without one still goes after the default window.

Real time (sockets): calls 0.15 s apart, three times the 0.05 s default window and
within a quarter of a 2 s budget (0.5 s).
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
GAP = 0.15


async def spaced(url: str, headers: dict[str, str]) -> None:
    """``CALLS`` calls, one every ``GAP`` seconds, each checked against its answer."""
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-team", max_retries=0)
    asked = tickets(CALLS)

    async def one(text: str) -> None:
        reply = await client.chat.completions.create(**chat_body(text), extra_headers=headers)
        content = reply.choices[0].message.content or ""
        assert Ticket.model_validate_json(content) == expected_ticket(text)

    async with anyio.create_task_group() as tg:
        for text in asked:
            tg.start_soon(one, text)
            await anyio.sleep(GAP)
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_the_budget_header_sizes_the_wait_without_a_configured_budget(
    sim: SimulatedProvider, sim_url: str
) -> None:
    async with serving(gateway_config(sim_url, budget=None)) as running:
        await spaced(running.openai_url, {})
        alone = len(sim.requests)
        await spaced(running.openai_url, {"x-coalesce-budget": "2"})
    # Without any budget, each call went alone after the 0.05 s window.
    assert alone == CALLS
    # With the header, each waited up to a quarter of its 2 s budget for company.
    grouped = sim.requests[alone:]
    assert sum(record.items for record in grouped) == CALLS
    assert len(grouped) <= CALLS / 2, [record.items for record in grouped]
