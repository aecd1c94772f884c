"""``wrap(client, fleet=...)`` and ``prompt(..., fleet=...)``: an app process's calls
join the fleet through a gateway of its own, and coalesce with every other member's
(here: a ``coalesce serve --fleet`` gateway in front of the same simulator)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import anyio
import anyio.to_thread
import httpx
import openai
import pytest
from _fleet import member_of, until, until_async
from _nats import NatsServer
from _serving import Recorder, gateway_config, serving
from _traffic import (
    CALLS,
    INSTRUCTIONS,
    OPENAI_MODEL,
    Ticket,
    chat_body,
    expected_ticket,
    gather,
    messages_body,
    tickets,
    triage_in_turn,
)
from anyio.streams.text import TextReceiveStream

import coalesce
from coalesce._gateway import sidecar
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio

#: The options of tests/gateway's gateways (gateway_config): the same settings make one
#: partition, whichever member a call reaches.
FLEET = {"latency_budget": 2.0, "max_items": 20, "store": ":memory:"}


@pytest.fixture(autouse=True)
def _stop_sidecars() -> Iterator[None]:
    yield
    sidecar.stop_all()  # each test's NATS server is its own: so are its members


def _only_member() -> sidecar.Sidecar:
    (running,) = sidecar._running.values()
    return running


async def test_a_wrapped_client_and_a_gateway_coalesce_as_one(
    sim: SimulatedProvider, sim_url: str, nats_server: NatsServer
) -> None:
    async with serving(gateway_config(sim_url, fleet=nats_server.url, store=None)) as gateway:
        to_gateway = openai.AsyncOpenAI(
            base_url=gateway.openai_url, api_key="sk-team", max_retries=0
        )
        plain = openai.AsyncOpenAI(base_url=f"{sim_url}/v1", api_key="sk-team", max_retries=0)
        wrapped = coalesce.wrap(plain, fleet=nats_server.url, **FLEET)
        assert type(wrapped) is openai.AsyncOpenAI  # the SDK's own client, a copy
        assert str(wrapped.base_url).startswith("http://127.0.0.1:")
        app = _only_member()
        await until(lambda: app.state.member is not None and app.state.member.connected, "joined")
        await triage_in_turn([to_gateway, wrapped], tickets())
        assert app.state.member is not None
        stats = [member_of(gateway).statistics(), app.state.member.statistics()]
        assert [s.owned for s in stats].count(1) == 1, stats  # one owner for the partition
        assert sum(s.forwarded for s in stats) == CALLS // 2, stats
        assert sum(s.served for s in stats) == CALLS // 2, stats
        assert sum(r.items for r in sim.requests) == CALLS
        assert len(sim.requests) < CALLS // 2  # coalesced across the two members
        for client in (to_gateway, plain, wrapped):
            await client.close()


async def test_a_prompt_function_coalesces_through_the_fleet(
    sim: SimulatedProvider, sim_url: str, nats_server: NatsServer
) -> None:
    plain = openai.AsyncOpenAI(base_url=f"{sim_url}/v1", api_key="sk-team", max_retries=0)

    @coalesce.prompt(
        client=plain, model=OPENAI_MODEL, instructions=INSTRUCTIONS, fleet=nats_server.url, **FLEET
    )
    async def triage(ticket: str) -> Ticket: ...

    asked = tickets()
    answers = await gather(asked, triage)
    assert answers == [expected_ticket(ticket) for ticket in asked]
    assert sum(r.items for r in sim.requests) == CALLS
    assert len(sim.requests) < CALLS // 2  # each call its plain request, coalesced there
    assert triage.statistics().requests == CALLS  # one plain request per call, here
    await plain.close()


async def test_a_blocking_client_coalesces_through_the_fleet(
    sim: SimulatedProvider, sim_url: str, nats_server: NatsServer
) -> None:
    plain = openai.OpenAI(base_url=f"{sim_url}/v1", api_key="sk-team", max_retries=0)
    wrapped = coalesce.wrap(plain, fleet=nats_server.url, **FLEET)
    assert type(wrapped) is openai.OpenAI
    asked = tickets()

    def one(ticket: str) -> Ticket:
        reply = wrapped.chat.completions.create(**chat_body(ticket))
        return Ticket.model_validate_json(reply.choices[0].message.content or "")

    limiter = anyio.CapacityLimiter(CALLS)
    answers = await gather(asked, lambda t: anyio.to_thread.run_sync(one, t, limiter=limiter))
    assert answers == [expected_ticket(ticket) for ticket in asked]
    assert len(sim.requests) < CALLS // 2
    plain.close()


async def test_an_anthropic_client_coalesces_through_the_fleet(
    sim: SimulatedProvider, sim_url: str, nats_server: NatsServer
) -> None:
    plain = anthropic.AsyncAnthropic(base_url=sim_url, api_key="sk-ant", max_retries=0)
    wrapped = coalesce.wrap(plain, fleet=nats_server.url, **FLEET)
    assert type(wrapped) is anthropic.AsyncAnthropic
    asked = tickets()

    async def one(ticket: str) -> Ticket:
        message = await wrapped.messages.create(**messages_body(ticket))
        block = message.content[0]
        assert isinstance(block, anthropic.types.ToolUseBlock)
        return Ticket.model_validate(block.input)

    assert await gather(asked, one) == [expected_ticket(ticket) for ticket in asked]
    assert sum(r.items for r in sim.requests) == CALLS
    assert len(sim.requests) < CALLS // 2
    await plain.close()


async def test_two_credentials_through_one_member_never_share_a_request(
    sim: SimulatedProvider, recorder: Recorder, sim_url: str, nats_server: NatsServer
) -> None:
    keys = ("sk-alpha", "sk-beta")
    clients = [
        coalesce.wrap(
            openai.AsyncOpenAI(base_url=f"{sim_url}/v1", api_key=key, max_retries=0),
            fleet=nats_server.url,
            **FLEET,
        )
        for key in keys
    ]
    assert clients[0].base_url == clients[1].base_url  # one member for both
    asked = tickets()
    await triage_in_turn(clients, asked)
    for seen in recorder.seen:
        wanted = {asked[i] for i in range(CALLS) if keys[i % 2] == seen.key}
        assert {t for t in asked if t in seen.body.decode()} <= wanted
    assert {seen.key for seen in recorder.seen} == set(keys)
    for client in clients:
        await client.close()


def test_options_the_fleet_does_not_take_are_refused_by_name(nats_server: NatsServer) -> None:
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-x")
    with pytest.raises(coalesce.ConfigurationError, match=r"vote=True.*leave it out"):
        coalesce.wrap(client, fleet=nats_server.url, vote=True)
    with pytest.raises(coalesce.ConfigurationError, match=r"give the fleet's NATS URL"):
        coalesce.wrap(client, fleet_creds="nats.creds")
    with pytest.raises(coalesce.ConfigurationError, match=r"needs client="):
        coalesce.prompt(model="m", fleet=nats_server.url)
    with pytest.raises(coalesce.ConfigurationError, match=r"nats:// URL|nats"):
        coalesce.wrap(client, fleet="http://not-nats")
    azure = openai.AsyncAzureOpenAI(
        api_key="k", api_version="2024-10-21", azure_endpoint="https://x.openai.azure.com"
    )
    with pytest.raises(coalesce.ConfigurationError, match=r"coalesce serve --fleet"):
        coalesce.wrap(azure, fleet=nats_server.url)
    assert sidecar._running == {}  # nothing started for a refused call


def test_one_member_per_settings(nats_server: NatsServer, tmp_path: Path) -> None:
    first = coalesce.wrap(
        anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="k"), fleet=nats_server.url
    )
    again = coalesce.wrap(
        anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="other"),
        fleet=nats_server.url,
    )
    other = coalesce.wrap(
        anthropic.AsyncAnthropic(base_url="http://127.0.0.1:9", api_key="k"),
        fleet=nats_server.url,
        latency_budget=3.0,
    )
    assert first.base_url == again.base_url != other.base_url
    assert len(sidecar._running) == 2


_OWNER = """
import sys, openai, coalesce
from coalesce._gateway import sidecar
client = coalesce.wrap(
    openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="sk-team", max_retries=0),
    fleet=sys.argv[2], latency_budget=2.0, max_items=20, store=":memory:",
)
reply = client.chat.completions.create(**__import__("json").loads(sys.argv[3]))
(running,) = sidecar._running.values()
print(running.url, flush=True)
sys.stdin.read()  # until the test closes it: then the process exits, as an app's does
"""


async def test_a_process_that_exits_answers_the_calls_it_owns_first(
    sim_url: str, nats_server: NatsServer
) -> None:
    first = json.dumps(chat_body(tickets(1, tag="First")[0]))
    command = [sys.executable, "-c", _OWNER, sim_url, nats_server.url, first]
    async with await anyio.open_process(command) as owner:
        assert owner.stdin is not None
        assert owner.stdout is not None
        own_url = ""
        async for text in TextReceiveStream(owner.stdout):  # its gateway's URL, once it owns
            own_url += text
            if own_url.endswith("\n"):
                break
        async with serving(gateway_config(sim_url, fleet=nats_server.url, store=None)) as gateway:
            client = openai.AsyncOpenAI(
                base_url=gateway.openai_url, api_key="sk-team", max_retries=0
            )
            asked = tickets()

            async def serving_calls() -> bool:
                async with httpx.AsyncClient() as http:
                    state = (await http.get(f"{own_url.strip()}/readyz")).json()
                return int(state["fleet"]["served"]) > 0

            async def leave_while_serving() -> None:
                await until_async(serving_calls, "forwarded to the owner")
                await owner.stdin.aclose()  # type: ignore[union-attr]  # it exits, as an app does

            async def one(ticket: str) -> Ticket:
                reply = await client.chat.completions.create(**chat_body(ticket))
                return Ticket.model_validate_json(reply.choices[0].message.content or "")

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(leave_while_serving)
                answers = await gather(asked, one)
            assert answers == [expected_ticket(ticket) for ticket in asked]
            assert member_of(gateway).statistics().forwarded > 0  # some went to the owner
            await client.close()
        assert await owner.wait() == 0
