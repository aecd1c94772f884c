"""SDK clients pointed at the gateway: their calls coalesce, each gets its own answer,
and calls sent with different credentials never share a request."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from _serving import Recorder, Running, gateway_config, serving
from _traffic import (
    CALLS,
    INSTRUCTIONS,
    MOST_REQUESTS,
    OPENAI_MODEL,
    Ticket,
    chat_body,
    expected_ticket,
    gather,
    messages_body,
    tickets,
)

import coalesce
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


def _requests(sim: SimulatedProvider) -> list[tuple[str, int]]:
    return [(record.api, record.items) for record in sim.requests]


async def test_openai_calls_from_many_clients_coalesce(
    sim: SimulatedProvider, gateway: Running
) -> None:
    # Four clients, as four processes would each have their own.
    clients = [
        openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
        for _ in range(4)
    ]
    asked = tickets()

    async def one(index: int) -> Ticket:
        client = clients[index % 4]
        reply = await client.chat.completions.create(**chat_body(asked[index]))
        return Ticket.model_validate_json(reply.choices[0].message.content or "")

    answers = await gather(list(range(CALLS)), one)
    assert answers == [expected_ticket(ticket) for ticket in asked]
    assert len(sim.requests) <= MOST_REQUESTS, _requests(sim)
    assert sum(record.items for record in sim.requests) == CALLS
    for client in clients:
        await client.close()


async def test_anthropic_calls_coalesce(sim: SimulatedProvider, gateway: Running) -> None:
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk-ant-team", max_retries=0)
    asked = tickets()

    async def one(ticket: str) -> Ticket:
        message = await client.messages.create(**messages_body(ticket))
        block = message.content[0]
        assert isinstance(block, anthropic.types.ToolUseBlock)
        return Ticket.model_validate(block.input)

    # One call first, as a gateway that has served before: the prior for this model
    # predicts 1.98 s for a group of 4 at this 2 s budget, so a cold gateway's groups
    # stop at 4 and 40 calls need 10 requests at least; one reply teaches it the
    # provider's speed.
    await one("warm-up ticket")
    before = len(sim.requests)
    answers = await gather(asked, one)
    assert answers == [expected_ticket(ticket) for ticket in asked]
    assert len(sim.requests) - before <= MOST_REQUESTS, _requests(sim)
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_two_credentials_never_share_a_request(
    sim: SimulatedProvider, recorder: Recorder, gateway: Running
) -> None:
    alpha = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-alpha", max_retries=0)
    bravo = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-bravo", max_retries=0)
    calls = [
        (client, ticket)
        for pair in zip(tickets(20, "Alpha"), tickets(20, "Bravo"), strict=True)
        for client, ticket in zip((alpha, bravo), pair, strict=True)
    ]  # interleaved: alpha, bravo, alpha, ...

    async def one(call: tuple[openai.AsyncOpenAI, str]) -> Ticket:
        client, ticket = call
        reply = await client.chat.completions.create(**chat_body(ticket))
        return Ticket.model_validate_json(reply.choices[0].message.content or "")

    answers = await gather(calls, one)
    assert answers == [expected_ticket(ticket) for _, ticket in calls]
    sent = [seen for seen in recorder.seen if seen.path == "/v1/chat/completions"]
    assert {seen.key for seen in sent} == {"sk-alpha", "sk-bravo"}
    for seen in sent:
        other = "Bravo" if seen.key == "sk-alpha" else "Alpha"
        assert other.encode() not in seen.body, f"a request sent with {seen.key} carried {other}"
    # They did coalesce, each with its own kind.
    assert max(record.items for record in sim.requests) > 1
    assert {record.api_key for record in sim.requests if record.items > 1} == {
        "sk-alpha",
        "sk-bravo",
    }
    await alpha.close()
    await bravo.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_api_key_mode_keeps_client_keys_apart(
    sim: SimulatedProvider, sim_url: str, recorder: Recorder
) -> None:
    # The gateway sends every call with its own upstream key; the clients' keys
    # still never share a request.
    config = gateway_config(sim_url, api_keys=("gw-alpha", "gw-bravo"), openai_api_key="sk-up")
    async with serving(config) as running:
        alpha = openai.AsyncOpenAI(base_url=running.openai_url, api_key="gw-alpha", max_retries=0)
        bravo = openai.AsyncOpenAI(base_url=running.openai_url, api_key="gw-bravo", max_retries=0)
        calls = [
            (client, ticket)
            for pair in zip(tickets(10, "Alpha"), tickets(10, "Bravo"), strict=True)
            for client, ticket in zip((alpha, bravo), pair, strict=True)
        ]

        async def one(call: tuple[openai.AsyncOpenAI, str]) -> Ticket:
            client, ticket = call
            reply = await client.chat.completions.create(**chat_body(ticket))
            return Ticket.model_validate_json(reply.choices[0].message.content or "")

        answers = await gather(calls, one)
        await alpha.close()
        await bravo.close()
    assert answers == [expected_ticket(ticket) for _, ticket in calls]
    assert {seen.key for seen in recorder.seen} == {"sk-up"}
    assert not any(b"Alpha" in seen.body and b"Bravo" in seen.body for seen in recorder.seen)
    assert max(record.items for record in sim.requests) > 1


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_responses_calls_coalesce(sim: SimulatedProvider, gateway: Running) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    asked = tickets(8)
    text: Any = {
        "format": {
            "type": "json_schema",
            "name": "ticket",
            "schema": Ticket.model_json_schema(),
            "strict": True,
        }
    }

    async def one(ticket: str) -> Ticket:
        response = await client.responses.create(
            model=OPENAI_MODEL,
            instructions=INSTRUCTIONS,
            input=ticket,
            text=text,
        )
        return Ticket.model_validate_json(response.output_text)

    assert await gather(asked, one) == [expected_ticket(t) for t in asked]
    assert max(record.items for record in sim.requests) > 1
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
@pytest.mark.parametrize(
    ("betas", "coalesced"),
    [(["prompt-caching-2024-07-31"], True), (["some-new-feature-2026-01-01"], False)],
)
async def test_anthropic_betas_coalesce_only_when_they_change_no_answer(
    sim: SimulatedProvider, gateway: Running, betas: list[str], coalesced: bool
) -> None:
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk-ant", max_retries=0)
    asked = tickets(6)

    async def one(ticket: str) -> Ticket:
        message = await client.beta.messages.create(betas=betas, **messages_body(ticket))
        block = message.content[0]
        assert block.type == "tool_use"
        return Ticket.model_validate(block.input)

    assert await gather(asked, one) == [expected_ticket(t) for t in asked]
    assert (max(record.items for record in sim.requests) > 1) is coalesced
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_replies_say_how_they_were_answered(sim: SimulatedProvider, gateway: Running) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    asked = tickets(8)

    async def one(ticket: str) -> tuple[dict[str, str], Ticket]:
        raw = await client.chat.completions.with_raw_response.create(**chat_body(ticket))
        reply = raw.parse()
        return dict(raw.headers), Ticket.model_validate_json(reply.choices[0].message.content or "")

    replies = await gather(asked, one)
    assert [answer for _, answer in replies] == [expected_ticket(t) for t in asked]
    by_request: dict[str, int] = {}
    for headers, _ in replies:
        assert headers["x-coalesce-lane"] == "realtime"
        by_request[headers["x-coalesce-request-id"]] = int(headers["x-coalesce-group-size"])
    # Each upstream request's group size is the number of calls it answered.
    answered = [headers["x-coalesce-request-id"] for headers, _ in replies]
    assert by_request == {reply_id: answered.count(reply_id) for reply_id in by_request}
    assert sorted(by_request.values()) == sorted(r.items for r in sim.requests)
    assert max(by_request.values()) > 1
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_budget_partition_and_lane_headers_steer_a_call(
    sim: SimulatedProvider, gateway: Running
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    asked = tickets(8)

    async def one(index: int) -> dict[str, str]:
        headers = {
            "x-coalesce-partition": f"tenant-{index % 2}",
            "x-coalesce-budget": "3",
            "x-coalesce-lane": "realtime",
        }
        raw = await client.chat.completions.with_raw_response.create(
            **chat_body(asked[index]), extra_headers=headers
        )
        content = raw.parse().choices[0].message.content or ""
        assert Ticket.model_validate_json(content) == expected_ticket(asked[index])
        return dict(raw.headers)

    replies = await gather(list(range(8)), one)
    assert {headers["x-coalesce-lane"] for headers in replies} == {"realtime"}
    # The two partitions never shared a request, and the headers never went upstream.
    by_request: dict[str, set[int]] = {}
    for index, headers in enumerate(replies):
        by_request.setdefault(headers["x-coalesce-request-id"], set()).add(index % 2)
    assert all(len(partitions) == 1 for partitions in by_request.values())
    assert max(record.items for record in sim.requests) > 1
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_x_coalesce_off_sends_a_call_alone(
    sim: SimulatedProvider, recorder: Recorder, gateway: Running
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    asked = tickets(4)

    async def one(ticket: str) -> str:
        reply = await client.chat.completions.create(
            **chat_body(ticket), extra_headers={"x-coalesce": "off"}
        )
        return reply.choices[0].message.content or ""

    answers = await gather(asked, one)
    assert [json.loads(a) for a in answers] == [expected_ticket(t).model_dump() for t in asked]
    assert [record.items for record in sim.requests] == [1, 1, 1, 1]
    assert not any(name.startswith("x-coalesce") for s in recorder.seen for name in s.headers)
    assert OPENAI_MODEL in {record.model for record in sim.requests}
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_streamed_replies_say_their_group_size(
    sim: SimulatedProvider, gateway: Running
) -> None:
    # A streamed caller has its headers before its request's reply has ended: the size
    # comes from wrap (the request's calls are known when it is sent), not from a
    # record of finished requests.
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)

    async def one(ticket: str) -> int:
        body = chat_body(ticket, stream=True)
        async with client.chat.completions.with_streaming_response.create(**body) as raw:
            size = int(raw.headers["x-coalesce-group-size"])
            async for _ in raw.iter_bytes():
                pass
        return size

    sizes = await gather(tickets(8), one)
    assert sorted(sizes) == sorted(r.items for r in sim.requests for _ in range(r.items))
    assert max(sizes) > 1
    await client.close()


@pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True)
async def test_wrap_tells_each_raw_response_its_group_size(
    sim: SimulatedProvider, sim_url: str
) -> None:
    # What the gateway relays: wrap's raw response of a coalesced call says how many
    # calls shared its request.
    wrapped = coalesce.wrap(sim.openai_client(sim_url, max_retries=0), latency_budget=2.0)

    async def one(ticket: str) -> tuple[str, int]:
        raw = await wrapped.chat.completions.with_raw_response.create(**chat_body(ticket))
        return raw.headers["x-coalesce-reply-id"], int(raw.headers["x-coalesce-group-size"])

    told = await gather(tickets(8), one)
    replies = [reply_id for reply_id, _ in told]
    assert all(size == replies.count(reply_id) for reply_id, size in told)
    assert sorted(dict(told).values()) == sorted(r.items for r in sim.requests)
    await wrapped.close()
