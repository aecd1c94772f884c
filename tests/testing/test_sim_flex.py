"""OpenAI flex processing on the simulator: slower answers, seeded or scripted 429s."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest

from coalesce._exceptions import ConfigurationError
from coalesce.testing import FlexProcessing, LatencyProfile, SimulatedLatency, SimulatedProvider

pytestmark = pytest.mark.anyio

MODEL = "gpt-4o-mini"
SLOW = SimulatedLatency(default=LatencyProfile(ttft=2.0, tokens_per_second=10))


def question(text: str = "q") -> list[Any]:
    return [{"role": "user", "content": text}]


def took(sim: SimulatedProvider, index: int) -> float:
    record = sim.requests[index]
    return record.finished_at - record.started_at


async def test_flex_is_slower_by_the_latency_factor_and_says_flex() -> None:
    sim = SimulatedProvider(latency=SLOW, flex=FlexProcessing(latency_factor=3, unavailable=0))
    async with sim.openai_client(max_retries=0) as client:
        plain = await client.chat.completions.create(model=MODEL, messages=question())
        flex = await client.chat.completions.create(
            model=MODEL, messages=question(), service_tier="flex"
        )
    assert (plain.service_tier, flex.service_tier) == ("default", "flex")
    assert plain.choices[0].message.content == flex.choices[0].message.content
    assert took(sim, 0) > 2.0
    assert took(sim, 1) == pytest.approx(3 * took(sim, 0))
    assert [r.service_tier for r in sim.requests] == ["default", "flex"]


@pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)  # the openai SDK leaves its SSE generators to the GC (as in test_sim_openai)
async def test_streamed_flex_chunks_say_flex_and_arrive_slower() -> None:
    sim = SimulatedProvider(latency=SLOW, flex=FlexProcessing(latency_factor=2, unavailable=0))
    async with sim.openai_client(max_retries=0) as client:
        await client.chat.completions.create(model=MODEL, messages=question(), service_tier="auto")
        stream = await client.chat.completions.create(
            model=MODEL, messages=question(), service_tier="flex", stream=True
        )
        tiers = [chunk.service_tier async for chunk in stream]
    assert set(tiers) == {"flex"}
    assert sim.requests[0].service_tier == "default"
    assert took(sim, 1) == pytest.approx(2 * took(sim, 0))


async def test_an_injected_refusal_is_openais_429_resource_unavailable() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    sim.inject_flex(True)
    async with sim.openai_client(max_retries=0) as client:
        await client.chat.completions.create(model=MODEL, messages=question())  # not flex
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=question(), service_tier="flex"
            )
        served = await client.chat.completions.create(
            model=MODEL, messages=question(), service_tier="flex"
        )
    assert caught.value.code == "resource_unavailable"
    assert "Resource unavailable" in caught.value.message
    assert served.service_tier == "flex"
    assert [(r.status, r.service_tier, r.faults) for r in sim.requests] == [
        (200, "default", ()),
        (429, "flex", ("resource_unavailable",)),
        (200, "flex", ()),
    ]
    assert sim.requests[1].completion_tokens == 0
    assert sim.flex.pending == 0


async def outcomes(sim: SimulatedProvider, n: int, *, interleave: bool) -> list[bool]:
    refused = []
    async with sim.openai_client(max_retries=0) as client:
        for i in range(n):
            if interleave:
                await client.chat.completions.create(model=MODEL, messages=question(f"x{i}"))
            try:
                await client.chat.completions.create(
                    model=MODEL, messages=question(f"q{i}"), service_tier="flex"
                )
            except openai.RateLimitError:
                refused.append(True)
            else:
                refused.append(False)
    return refused


async def test_refusals_are_drawn_from_the_seed_and_only_for_flex() -> None:
    plan = FlexProcessing(unavailable=0.5, seed=7)
    first = await outcomes(SimulatedProvider(flex=plan), 24, interleave=False)
    again = await outcomes(SimulatedProvider(flex=plan), 24, interleave=True)
    other = await outcomes(
        SimulatedProvider(flex=FlexProcessing(unavailable=0.5, seed=8)), 24, interleave=False
    )
    assert first == again  # default requests draw nothing
    assert 0 < sum(first) < 24
    assert first != other


async def test_the_default_chance_refuses_some_flex_requests() -> None:
    refused = await outcomes(SimulatedProvider(), 200, interleave=False)
    assert 1 <= sum(refused) <= 30  # 5 % of 200, seeded


async def test_a_model_without_flex_is_refused_with_400() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0, models={"gpt-4o-mini"}))
    async with sim.openai_client(max_retries=0) as client:
        await client.chat.completions.create(model=MODEL, messages=question(), service_tier="flex")
        with pytest.raises(
            openai.BadRequestError, match="not available for the model 'gpt-4o'"
        ) as caught:
            await client.chat.completions.create(
                model="gpt-4o", messages=question(), service_tier="flex"
            )
    assert caught.value.param == "service_tier"
    assert [r.status for r in sim.requests] == [200, 400]


async def test_anthropic_requests_have_no_service_tier() -> None:
    sim = SimulatedProvider()
    async with sim.anthropic_client(max_retries=0) as client:
        await client.messages.create(model="claude-x", max_tokens=20, messages=question())
    assert sim.requests[0].service_tier is None


async def test_the_admin_endpoint_scripts_flex_refusals() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=sim), base_url="http://sim"
    ) as http:
        assert (await http.post("/_sim/flex", json={"script": [True, False]})).json() == {
            "pending": 2
        }
        assert (await http.post("/_sim/flex", json={"script": ["yes"]})).status_code == 400
        assert (await http.post("/_sim/flex", json={})).status_code == 400
        body = {"model": MODEL, "messages": question(), "service_tier": "flex"}
        refused = await http.post("/v1/chat/completions", json=body)
        served = await http.post("/v1/chat/completions", json=body)
        stats = (await http.get("/_sim/stats")).json()
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "resource_unavailable"
    assert served.json()["service_tier"] == "flex"
    assert [r["service_tier"] for r in stats["requests"]] == ["flex", "flex"]


def test_flex_configuration() -> None:
    sim = SimulatedProvider.from_config(
        {"flex": {"latency_factor": 2, "unavailable": 0.1, "script": [True]}}
    )
    assert sim.flex_processing == FlexProcessing(latency_factor=2, unavailable=0.1, script=[True])
    assert sim.flex.pending == 1
    sim.inject_flex(False)
    assert sim.flex.pending == 2
    sim.reset()
    assert sim.flex.pending == 1  # the configured script again
    with pytest.raises(ConfigurationError, match="latency_factor"):
        FlexProcessing(latency_factor=0)
    with pytest.raises(ConfigurationError, match="probability"):
        FlexProcessing(unavailable=1.5)
    with pytest.raises(ConfigurationError, match="True"):
        FlexProcessing(script=["refuse"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="True"):
        sim.inject_flex(1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="invalid keys in 'flex'"):
        SimulatedProvider.from_config({"flex": {"chance": 0.1}})
