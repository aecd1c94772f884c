"""Running the gateway: health, readiness, metrics, one log line per upstream request,
and no credential in any of them."""

from __future__ import annotations

import json
import logging

import anthropic
import httpx
import openai
import pytest
from _serving import Running, gateway_config, serving
from _traffic import chat_body, gather, messages_body, tickets
from prometheus_client.parser import text_string_to_metric_families

from coalesce.testing import SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True),
]

SECRET = "sk-proj-Zq8secretVALUE0123456789"
CLIENT_SECRET = "gw-client-secretVALUE987"


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _total(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    want = set(labels.items())
    return sum(value for (n, got), value in samples.items() if n == name and want <= got)


async def test_health_readiness_and_metrics(sim: SimulatedProvider, gateway: Running) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    await gather(tickets(8), lambda t: client.chat.completions.create(**chat_body(t)))
    await client.close()
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        assert (await http.get("/readyz")).status_code == 200
        reply = await http.get("/metrics")
    assert reply.headers["content-type"].startswith("text/plain")
    samples = _samples(reply.text)
    model = {"model": "gpt-4o-mini", "lane": "realtime"}
    assert _total(samples, "coalesce_gateway_calls_total", status="200", **model) == 8
    assert _total(samples, "coalesce_gateway_upstream_requests_total", **model) == len(sim.requests)
    assert _total(samples, "coalesce_gateway_items_per_request_sum", **model) == 8
    assert _total(samples, "coalesce_gateway_prompt_tokens_total", **model) == sum(
        record.prompt_tokens for record in sim.requests
    )
    assert _total(samples, "coalesce_gateway_prompt_tokens_saved", **model) > 0
    assert _total(samples, "coalesce_gateway_budget_calls_total", within="true", **model) == 8
    assert _total(samples, "coalesce_gateway_calls_in_flight") == 0


async def test_one_log_line_per_upstream_request(
    sim: SimulatedProvider, gateway: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coalesce.gateway")
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key="sk-team", max_retries=0)
    await gather(tickets(8), lambda t: client.chat.completions.create(**chat_body(t)))
    await client.close()
    lines = [
        r
        for r in caplog.records
        if r.name == "coalesce.gateway" and r.getMessage().startswith("upstream request")
    ]
    assert all(record.levelno == logging.INFO for record in lines)
    fields = [json.loads(record.getMessage().removeprefix("upstream request ")) for record in lines]
    assert len(fields) == len(sim.requests)
    assert sorted(f["items"] for f in fields) == sorted(r.items for r in sim.requests)
    assert {f["provider"] for f in fields} == {"openai"}
    assert all(f["outcome"] == "ok" and f["seconds"] > 0 for f in fields)
    assert list(fields) == [record.gateway for record in lines]  # type: ignore[attr-defined]


async def test_no_credential_in_any_log_line_or_metric(
    sim_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, coalesce's own events included
    async with serving(gateway_config(sim_url)) as gateway:
        await _every_kind_of_call(sim_url, gateway, SECRET)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{gateway.url}/metrics")).text
    config = gateway_config(sim_url, api_keys=(CLIENT_SECRET,), openai_api_key=SECRET)
    async with serving(config) as gateway:
        await _every_kind_of_call(sim_url, gateway, CLIENT_SECRET)
        bad = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key=SECRET + "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            await bad.chat.completions.create(**chat_body("Ticket 1: hi"))
        assert SECRET not in str(refused.value.body)
        await bad.close()
        async with httpx.AsyncClient() as http:
            metrics += (await http.get(f"{gateway.url}/metrics")).text
    assert len(caplog.records) > 20
    for record in caplog.records:
        text = caplog.handler.format(record) + repr(record.__dict__)
        for secret in (SECRET, CLIENT_SECRET):
            assert secret not in text, f"{record.name}: {record.getMessage()}"
    for secret in (SECRET, CLIENT_SECRET):
        assert secret not in metrics


async def _every_kind_of_call(sim_url: str, gateway: Running, key: str) -> None:
    """Coalesced calls, a streamed one, one passed through, an upstream error, a
    refused call and a proxied path, each sent with ``key``."""
    client = openai.AsyncOpenAI(base_url=gateway.openai_url, api_key=key, max_retries=0)
    await gather(tickets(4), lambda t: client.chat.completions.create(**chat_body(t)))
    stream = await client.chat.completions.create(**chat_body("Ticket 2: hi", stream=True))
    assert [chunk async for chunk in stream]
    await client.chat.completions.create(**chat_body("Ticket 3: hi", n=2))
    async with httpx.AsyncClient() as http:
        await http.post(f"{sim_url}/_sim/faults", json={"script": ["server_error"]})
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(**chat_body("Ticket 4: hi"))
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            **chat_body("x"), extra_headers={"x-coalesce-lane": key}
        )
    await client.batches.list()
    await client.close()
    claude = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0)
    if gateway.state.config.holds_keys:  # and no Anthropic key: refused with a 503
        with pytest.raises(anthropic.APIStatusError, match="holds no anthropic key"):
            await claude.messages.create(**messages_body("Ticket 5: hi"))
    else:
        await claude.messages.create(**messages_body("Ticket 5: hi"))
    await claude.close()
