"""A credential forwarded with a call travels only as the payload of a request on the
members' NATS connection: never in a subject (the fleet's, the leases' keys, the
inboxes), a log line, a metric or ``/readyz``."""

from __future__ import annotations

import logging

import httpx
import nats
import openai
import pytest
from _fleet import fleet, member_of
from _nats import NatsServer
from _traffic import CALLS, chat_body, gather, tickets

pytestmark = pytest.mark.anyio

SECRET = "sk-fleet-secret-0123456789abcdef"


async def test_no_credential_in_a_subject_a_log_line_or_a_metric(
    sim_url: str, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    subjects: list[str] = []
    payloads: list[bytes] = []
    watcher = await nats.connect(nats_server.url)

    async def seen(msg: nats.aio.msg.Msg) -> None:
        subjects.append(msg.subject)
        subjects.append(msg.reply or "")
        payloads.append(msg.data)

    await watcher.subscribe(">", cb=seen)
    async with fleet(sim_url, nats_server.url) as gateways:
        clients = [
            openai.AsyncOpenAI(base_url=g.openai_url, api_key=SECRET, max_retries=0)
            for g in gateways
        ]
        asked = tickets()

        async def one(index: int) -> None:
            await clients[index % 2].chat.completions.create(**chat_body(asked[index]))

        await gather(list(range(CALLS)), one)
        assert sum(member_of(g).statistics().forwarded for g in gateways) == CALLS // 2
        shown = []
        async with httpx.AsyncClient() as http:
            for g in gateways:
                shown.append((await http.get(f"{g.url}/metrics")).text)
                shown.append((await http.get(f"{g.url}/readyz")).text)
        for client in clients:
            await client.close()
    await watcher.flush()
    await watcher.close()
    assert any(".call" in subject for subject in subjects)  # the forwarded calls were seen
    assert any(SECRET.encode() in payload for payload in payloads)  # ... as payloads only
    assert not [s for s in subjects if SECRET in s]
    assert "coalesce_fleet_calls_forwarded" in "".join(shown)
    assert not [text for text in shown if SECRET in text]
    assert caplog.records
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(record.__dict__)
