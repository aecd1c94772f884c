"""What a fleet does when a part of it fails: the owner killed (``kill -9``) or stopped
while calls wait on it, NATS killed and restarted. No call fails, each caller gets
exactly its own answer, and the fleet is one again after."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import openai
import pytest
from _fleet import fleet, member_of, until
from _nats import Cable, NatsServer
from _serving import gateway_config, serving
from _traffic import CALLS, Ticket, chat_body, expected_ticket, tickets

pytestmark = pytest.mark.anyio


async def _wave(urls: list[str], asked: list[str], during: object = None) -> list[Ticket]:
    """``asked`` as calls, each to the next of ``urls`` in turn; ``during()``, if given,
    runs beside them (it kills something)."""
    clients = [openai.AsyncOpenAI(base_url=url, api_key="sk-team", max_retries=0) for url in urls]
    answers: dict[int, Ticket] = {}

    async def one(index: int) -> None:
        reply = await clients[index % len(urls)].chat.completions.create(**chat_body(asked[index]))
        answers[index] = Ticket.model_validate_json(reply.choices[0].message.content or "")

    async with anyio.create_task_group() as group:
        for index in range(len(asked)):
            group.start_soon(one, index)
        if during is not None:
            await during()  # type: ignore[operator]
    for client in clients:
        await client.close()
    return [answers[i] for i in range(len(asked))]


async def test_nats_killed_and_restarted_no_call_fails(
    sim_url: str, nats_server: NatsServer
) -> None:
    async with fleet(sim_url, nats_server.url) as gateways:
        members = [member_of(g) for g in gateways]
        urls = [g.openai_url for g in gateways]

        async def kill_nats() -> None:
            await until(lambda: sum(m.statistics().served for m in members) > 0, "a call forwarded")
            nats_server.kill()

        asked = tickets(CALLS, "Before")
        assert await _wave(urls, asked, kill_nats) == [expected_ticket(t) for t in asked]
        await until(lambda: not any(m.connected for m in members), "NATS seen gone")
        forwarded = sum(m.statistics().forwarded for m in members)
        asked = tickets(CALLS, "During")
        assert await _wave(urls, asked) == [expected_ticket(t) for t in asked]
        assert sum(m.statistics().forwarded for m in members) == forwarded
        assert all(m.statistics().fallbacks > 0 for m in members)  # coalesced locally

        nats_server.start()  # the same port and store
        await until(lambda: all(m.connected for m in members), "rejoined")
        asked = tickets(CALLS, "After")
        assert await _wave(urls, asked) == [expected_ticket(t) for t in asked]
        assert sum(m.statistics().forwarded for m in members) > forwarded  # one again


@asynccontextmanager
async def _cut_at_exit(cable: Cable) -> AsyncIterator[None]:
    try:
        yield
    finally:
        cable.cut()


async def test_the_owner_gone_mid_run_every_call_is_answered(
    sim_url: str, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coalesce.fleet")
    cable = Cable(nats_server.port)  # the owner's connection, cut as kill -9 would
    async with (
        _cut_at_exit(cable),
        serving(gateway_config(sim_url, fleet=cable.url)) as owner,
        serving(gateway_config(sim_url, fleet=nats_server.url)) as forwarder,
    ):
        members = [member_of(owner), member_of(forwarder)]
        await until(lambda: all(m.connected for m in members), "joined")
        first = tickets(1, "First")  # the owner's first call makes it the owner
        assert await _wave([owner.openai_url], first) == [expected_ticket(first[0])]
        assert members[0].statistics().owned == 1

        async def cut_owner() -> None:
            await until(lambda: members[0].statistics().served > 0, "a call forwarded")
            cable.cut()

        asked = tickets(CALLS, "Handover")
        answers = await _wave([forwarder.openai_url], asked, cut_owner)
        assert answers == [expected_ticket(t) for t in asked]
        stats = members[1].statistics()
        # The calls in flight on the owner came back, and the lease with them.
        assert (stats.takeovers, stats.owned, stats.fallbacks) == (1, 1, 0)
        changes = [r.fleet for r in caplog.records if hasattr(r, "fleet")]
        assert changes[0]["change"] == "acquired"  # the owner's, then the forwarder's:
        took = {k: v for k, v in changes[-1].items() if k != "partition"}
        assert took == {"change": "took_over", "member": members[1].me, "previous": members[0].me}


async def test_the_owner_stopped_its_partition_moves_at_once(
    sim_url: str, nats_server: NatsServer
) -> None:
    async with serving(gateway_config(sim_url, fleet=nats_server.url)) as stays:
        member = member_of(stays)
        async with serving(gateway_config(sim_url, fleet=nats_server.url)) as leaves:
            await until(lambda: member.connected and member_of(leaves).connected, "joined")
            first, second = tickets(2, "First")  # one call each: the first one claims
            assert await _wave([leaves.openai_url], [first]) == [expected_ticket(first)]
            assert await _wave([stays.openai_url], [second]) == [expected_ticket(second)]
            assert member.statistics().forwarded == 1
        # It answered what it held, let its lease go and left: the next call finds no
        # one at the old owner's subject, and this member owns the partition.
        asked = tickets(CALLS // 2, "After")
        assert await _wave([stays.openai_url], asked) == [expected_ticket(t) for t in asked]
        stats = member.statistics()
        assert (stats.owned, stats.forwarded, stats.fallbacks) == (1, 1, 0)
