"""Errors through the gateway: the upstream's own reach each affected caller as the
upstream sent them; what the gateway refuses is in the provider's own shape."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from _serving import Running, gateway_config, serving
from _traffic import chat_body, expected_ticket, gather, messages_body, tickets

from coalesce.testing import SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True),
]


async def _script(sim_url: str, *faults: Any) -> None:
    async with httpx.AsyncClient() as http:
        reply = await http.post(f"{sim_url}/_sim/faults", json={"script": list(faults)})
        reply.raise_for_status()


async def _post(url: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient() as http:
        return await http.post(f"{url}{path}", content=content, headers=headers)


@pytest.mark.parametrize(
    ("path", "body", "key", "fault"),
    [
        ("/v1/chat/completions", chat_body("Ticket 1: hello"), "authorization", "rate_limit"),
        ("/v1/messages", messages_body("Ticket 1: hello"), "x-api-key", "unavailable"),
    ],
)
async def test_an_upstream_error_keeps_its_status_body_and_headers(
    sim_url: str, gateway: Running, path: str, body: dict[str, Any], key: str, fault: str
) -> None:
    value = "Bearer sk-team" if key == "authorization" else "sk-team"
    headers = {key: value, "content-type": "application/json", "anthropic-version": "2023-06-01"}
    await _script(sim_url, fault)
    direct = await _post(sim_url, path, body, headers)
    await _script(sim_url, fault)
    through = await _post(gateway.url, path, body, headers)
    assert through.status_code == direct.status_code >= 429
    assert through.json() == direct.json()
    assert through.headers.get("retry-after") == direct.headers.get("retry-after")


async def test_a_failed_packed_request_reaches_each_of_its_callers_alone(
    sim: SimulatedProvider, sim_url: str, gateway: Running
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    asked = tickets(8)
    await _script(sim_url, "server_error")

    async def one(ticket: str) -> Any:
        try:
            reply = await client.chat.completions.create(**chat_body(ticket))
        except openai.InternalServerError as exc:
            return exc
        return reply.choices[0].message.content

    outcomes = await gather(asked, one)
    failed = [o for o in outcomes if isinstance(o, openai.InternalServerError)]
    (broken,) = [record for record in sim.requests if record.status == 500]
    assert len(failed) == broken.items > 1  # every caller of the packed request, no other
    for error in failed:
        assert error.status_code == 500
        assert isinstance(error.body, dict)
        assert error.body["type"] == "server_error"
    for ticket, outcome in zip(asked, outcomes, strict=True):
        if not isinstance(outcome, Exception):
            assert json.loads(outcome) == expected_ticket(ticket).model_dump()
    await client.close()


_OPENAI = {"authorization": "Bearer sk-team"}
_ANTHROPIC = {"x-api-key": "sk-team"}


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "says"),
    [
        ("/v1/chat/completions", b"{not json", _OPENAI, 400, "not valid JSON"),
        ("/v1/chat/completions", [1, 2], _OPENAI, 400, "JSON object"),
        ("/v1/chat/completions", {"messages": []}, _OPENAI, 400, "no model"),
        ("/v1/chat/completions", {"model": "gpt-4o-mini"}, _OPENAI, 400, "messages"),
        ("/v1/responses", {"input": "hi"}, _OPENAI, 400, "no model"),
        ("/v1/chat/completions", chat_body("x"), {}, 401, "no API key"),
        (
            "/v1/chat/completions",
            chat_body("x"),
            {**_OPENAI, "x-coalesce-budget": "soon"},
            400,
            "x-coalesce-budget",
        ),
        (
            "/v1/chat/completions",
            chat_body("x"),
            {**_OPENAI, "x-coalesce-lane": "slow"},
            400,
            "x-coalesce-lane",
        ),
        (
            "/v1/messages",
            messages_body("x"),
            {**_ANTHROPIC, "x-coalesce-lane": "flex"},
            400,
            "lane='flex' is not offered by this provider",
        ),
        (
            "/v1/chat/completions",
            chat_body("x"),
            {**_OPENAI, "x-coalesce-budjet": "1"},
            400,
            "x-coalesce-budjet",
        ),
        ("/v1/messages", b"", _ANTHROPIC, 400, "not valid JSON"),
        ("/v1/messages", {"max_tokens": 10, "messages": []}, _ANTHROPIC, 400, "no model"),
        (
            "/v1/messages",
            {"model": "claude-3-5-haiku", "messages": []},
            _ANTHROPIC,
            400,
            "max_tokens",
        ),
        ("/v1/messages", messages_body("x"), {}, 401, "no API key"),
    ],
)
async def test_a_refused_call_gets_the_providers_error_shape(
    sim: SimulatedProvider,
    gateway: Running,
    path: str,
    body: Any,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    reply = await _post(gateway.url, path, body, headers)
    assert reply.status_code == status
    error = reply.json()
    if path == "/v1/messages":
        assert set(error) == {"type", "error"}
        assert error["type"] == "error"
        assert set(error["error"]) == {"type", "message"}
    else:
        assert set(error) == {"error"}
        assert set(error["error"]) == {"message", "type", "param", "code"}
    assert says in error["error"]["message"]
    assert sim.requests == ()


async def test_the_sdks_raise_their_own_errors_for_a_refused_call(gateway: Running) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="x-coalesce-budget"):
        await client.chat.completions.create(
            **chat_body("x"), extra_headers={"x-coalesce-budget": "-1"}
        )
    claude = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="x-coalesce-lane"):
        await claude.messages.create(**messages_body("x"), extra_headers={"x-coalesce-lane": "x"})
    await client.close()
    await claude.close()


async def test_api_key_mode_checks_client_keys_and_sends_its_own(
    sim: SimulatedProvider, sim_url: str
) -> None:
    config = gateway_config(sim_url, api_keys=("gw-key-1",), openai_api_key="sk-upstream")
    async with serving(config) as running:
        good = openai.AsyncOpenAI(base_url=running.openai_url, api_key="gw-key-1", max_retries=0)
        reply = await good.chat.completions.create(**chat_body("Ticket 7: hi"))
        assert json.loads(reply.choices[0].message.content or "") == (
            expected_ticket("Ticket 7: hi").model_dump()
        )
        bad = openai.AsyncOpenAI(base_url=running.openai_url, api_key="gw-key-2", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="does not accept"):
            await bad.chat.completions.create(**chat_body("Ticket 8: hi"))
        claude = anthropic.AsyncAnthropic(base_url=running.url, api_key="gw-key-1", max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match="holds no anthropic key") as caught:
            await claude.messages.create(**messages_body("Ticket 9: hi"))
        assert caught.value.status_code == 503
        for client in (good, bad, claude):
            await client.close()
    assert [record.api_key for record in sim.requests] == ["sk-upstream"]


async def test_a_body_over_the_limit_gets_413_in_the_providers_shape(
    sim: SimulatedProvider, sim_url: str
) -> None:
    async with serving(gateway_config(sim_url, max_body_size=8192)) as running:
        client = openai.AsyncOpenAI(base_url=running.openai_url, api_key="sk", max_retries=0)
        with pytest.raises(openai.APIStatusError, match="limit of 8192 bytes") as caught:
            await client.chat.completions.create(**chat_body("Ticket 1: " + "x" * 8000))
        assert caught.value.status_code == 413
        assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]

        async def chunked() -> Any:  # no content-length: refused as it streams in
            yield json.dumps(messages_body("Ticket 2: " + "y" * 8000)).encode()

        headers = {"x-api-key": "sk", "anthropic-version": "2023-06-01"}
        async with httpx.AsyncClient() as http:
            reply = await http.post(
                f"{running.url}/v1/messages", content=chunked(), headers=headers
            )
        assert reply.status_code == 413
        assert reply.json()["error"]["type"] == "request_too_large"
        assert sim.requests == ()
        # A call under the limit still goes through.
        answer = await client.chat.completions.create(**chat_body("Ticket 3: hello"))
        assert answer.choices[0].message.content
        await client.close()
