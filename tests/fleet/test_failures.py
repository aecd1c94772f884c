"""What a fleet does when a part of it fails: the owner killed (``kill -9``) or stopped
while calls wait on it, NATS killed and restarted. No call fails, each caller gets
exactly its own answer, and the fleet is one again after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import httpx
import openai
import pytest
from _fleet import fleet, member_of, until
from _nats import NatsServer
from _serving import gateway_config, serving
from _traffic import CALLS, Ticket, chat_body, expected_ticket, tickets

import coalesce

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


@contextmanager
def _process_gateway(sim_url: str, nats_url: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``coalesce serve --fleet`` in a process of its own (killed with -9 by the test)."""
    source = os.path.dirname(os.path.dirname(coalesce.__file__))
    env = {**os.environ, "PYTHONPATH": source}
    command = [
        sys.executable, "-m", "coalesce", "serve", "--port", "0", "--budget", "2",
        "--max-items", "20", "--log-level", "warning", "--fleet", nats_url,
        "--openai-upstream", f"{sim_url}/v1", "--anthropic-upstream", sim_url,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("coalesce gateway listening on "), line
        yield line.split()[-1], process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


async def _fleet_state(url: str) -> dict[str, object]:
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"{url}/readyz")
    state: dict[str, object] = reply.json().get("fleet", {})
    return state


async def test_the_owner_killed_mid_run_every_call_is_answered(
    sim_url: str, nats_server: NatsServer
) -> None:
    with _process_gateway(sim_url, nats_server.url) as (owner_url, owner):
        async with serving(gateway_config(sim_url, fleet=nats_server.url)) as forwarder:
            member = member_of(forwarder)
            await until(lambda: member.connected, "joined")
            with anyio.fail_after(30):
                while not (await _fleet_state(owner_url)).get("connected"):
                    await anyio.sleep(0.01)
            # The owner's first call makes it the partition's owner.
            first = tickets(1, "First")
            assert await _wave([f"{owner_url}/v1"], first) == [expected_ticket(first[0])]

            async def kill_owner() -> None:
                with anyio.fail_after(30):
                    while not (await _fleet_state(owner_url)).get("served"):
                        await anyio.sleep(0.01)
                owner.send_signal(signal.SIGKILL)

            asked = tickets(CALLS, "Handover")
            answers = await _wave([forwarder.openai_url], asked, kill_owner)
            assert answers == [expected_ticket(t) for t in asked]
            stats = member.statistics()
            # The calls in flight on the owner came back, and the lease with them.
            assert (stats.takeovers, stats.owned, stats.fallbacks) == (1, 1, 0)
