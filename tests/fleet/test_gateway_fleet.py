"""Gateways in one fleet: every caller gets exactly its own answer, whether its call was
answered by the gateway it reached or forwarded to its partition's owner; calls of two
credentials never share a request."""

from __future__ import annotations

import json

import openai
import pytest
from _fleet import fleet, member_of
from _nats import NatsServer
from _serving import Recorder
from _traffic import CALLS, Ticket, chat_body, expected_ticket, gather, tickets, triage_in_turn

from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


async def test_calls_to_two_gateways_coalesce_as_one(
    sim: SimulatedProvider, sim_url: str, nats_server: NatsServer
) -> None:
    async with fleet(sim_url, nats_server.url) as gateways:
        clients = [
            openai.AsyncOpenAI(base_url=g.openai_url, api_key="sk-team", max_retries=0)
            for g in gateways
        ]
        await triage_in_turn(clients, tickets())
        stats = [member_of(g).statistics() for g in gateways]
        owners = [s for s in stats if s.owned]
        assert len(owners) == 1
        assert sum(s.forwarded for s in stats) == CALLS // 2, stats
        assert sum(s.served for s in stats) == CALLS // 2
        assert sum(s.fallbacks for s in stats) == 0
        assert sum(r.items for r in sim.requests) == CALLS
        for client in clients:
            await client.close()


async def test_two_credentials_never_share_a_request_across_members(
    sim: SimulatedProvider, recorder: Recorder, sim_url: str, nats_server: NatsServer
) -> None:
    async with fleet(sim_url, nats_server.url) as gateways:
        keys = ("sk-alpha", "sk-beta")
        clients = {
            (key, n): openai.AsyncOpenAI(base_url=g.openai_url, api_key=key, max_retries=0)
            for key in keys
            for n, g in enumerate(gateways)
        }
        asked = tickets()

        async def one(index: int) -> Ticket:
            client = clients[(keys[index % 2], (index // 2) % 2)]
            reply = await client.chat.completions.create(**chat_body(asked[index]))
            return Ticket.model_validate_json(reply.choices[0].message.content or "")

        answers = await gather(list(range(CALLS)), one)
        assert answers == [expected_ticket(ticket) for ticket in asked]
        stats = [member_of(g).statistics() for g in gateways]
        assert sum(s.forwarded for s in stats) == CALLS // 2  # each key: half forwarded
        coalesced = [seen for seen in recorder.seen if seen.path.endswith("/chat/completions")]
        for seen, record in zip(coalesced, sim.requests, strict=True):
            # Each request carried the calls of the one key it was sent with.
            wanted = {asked[i] for i in range(CALLS) if keys[i % 2] == seen.key}
            carried = _tickets_in(seen.body)
            assert carried, record
            assert set(carried) <= wanted, record
        assert {seen.key for seen in coalesced} == set(keys)
        for client in clients.values():
            await client.close()


def _tickets_in(body: bytes) -> list[str]:
    """The tickets a request carried (each appears verbatim in its body)."""
    text = json.loads(body)
    found = json.dumps(text)
    return [ticket for ticket in tickets() if json.dumps(ticket)[1:-1] in found]
