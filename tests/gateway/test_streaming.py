"""A streamed call through the gateway is, chunk for chunk, what ``coalesce.wrap`` gives
the same call in process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import openai
import pytest
from _serving import Running
from _traffic import Ticket, chat_body, expected_ticket, gather, messages_body, tickets

import coalesce
from coalesce.testing import SimulatedProvider

# asyncio only: like OpenAI's own API, the gateway ends a chat stream with
# ``data: [DONE]``, where the openai SDK stops reading and leaves its decoder's async
# generators to the garbage collector, which trio reports as a ResourceWarning (the
# same against the real API). ``wrap`` in process sends no ``[DONE]``.
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True),
]

Streamed = Callable[[Any, str], Awaitable[list[dict[str, Any]]]]


def _without(event: dict[str, Any], *names: str) -> dict[str, Any]:
    """``event`` without the fields that differ from one reply to the next (ids, times,
    usage shares, which depend on who else shared the request)."""
    out = {k: _without(v, *names) if isinstance(v, dict) else v for k, v in event.items()}
    return {k: v for k, v in out.items() if k not in names}


async def _openai_stream(client: Any, ticket: str) -> list[dict[str, Any]]:
    stream = await client.chat.completions.create(
        **chat_body(ticket, stream=True, stream_options={"include_usage": True})
    )
    chunks = [chunk.model_dump() async for chunk in stream]
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[-1]["usage"]["prompt_tokens"] > 0
    return [_without(chunk, "id", "created", "usage") for chunk in chunks]


async def _anthropic_stream(client: Any, ticket: str) -> list[dict[str, Any]]:
    stream = await client.messages.create(**messages_body(ticket, stream=True))
    events = [event.model_dump() async for event in stream]
    assert events[-2]["type"] == "message_delta"
    assert events[-2]["usage"]["output_tokens"] > 0
    return [_without(event, "id", "usage") for event in events]


async def _through_wrap(
    sim: SimulatedProvider, url: str, sdk: str, streamed: Streamed
) -> list[Any]:
    plain = (
        sim.openai_client(url, max_retries=0)
        if sdk == "openai"
        else sim.anthropic_client(url, max_retries=0)
    )
    async with coalesce.wrap(plain, latency_budget=2.0, max_items=20) as client:
        return await gather(tickets(6), lambda ticket: streamed(client, ticket))


@pytest.mark.parametrize(
    ("sdk", "streamed"), [("openai", _openai_stream), ("anthropic", _anthropic_stream)]
)
async def test_a_streamed_call_is_chunk_for_chunk_what_wrap_gives(
    sim: SimulatedProvider, sim_url: str, gateway: Running, sdk: str, streamed: Streamed
) -> None:
    if sdk == "openai":
        client: Any = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk", max_retries=0)
    else:
        client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk", max_retries=0)
    through = await gather(tickets(6), lambda ticket: streamed(client, ticket))
    await client.close()
    coalesced = max(record.items for record in sim.requests)
    wrapped = await _through_wrap(sim, sim_url, sdk, streamed)
    assert through == wrapped
    assert coalesced > 1  # the streams came from packed requests
    assert all(len(events) >= 3 for events in through)


async def test_a_streamed_answer_is_the_callers_own(gateway: Running) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk", max_retries=0)
    asked = tickets(6)

    async def one(ticket: str) -> str:
        stream = await client.chat.completions.create(**chat_body(ticket, stream=True))
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    answers = await gather(asked, one)
    assert [Ticket.model_validate_json(a) for a in answers] == [expected_ticket(t) for t in asked]
    await client.close()
