"""The simulator's Anthropic Messages API, through the official SDK, in process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import anthropic
import anyio
import pytest
from pydantic import BaseModel

from coalesce._wire.packing import pack_request, split_reply
from coalesce.providers._shapes import anthropic_tool
from coalesce.testing import (
    LatencyProfile,
    RateLimit,
    SimulatedLatency,
    SimulatedProvider,
    compute_delays,
    expected_output,
)

pytestmark = pytest.mark.anyio

PROFILE = LatencyProfile(ttft=0.3, prompt_token_seconds=0.0, tokens_per_second=100)
MODEL = "claude-3-5-haiku-latest"


class Topic(BaseModel):
    topic: Literal["sports", "politics", "science"]
    summary: str


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(latency=SimulatedLatency(default=PROFILE))


@pytest.fixture
async def client(sim: SimulatedProvider) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sim.anthropic_client(max_retries=0) as client:
        yield client


def tool_request(inputs: list[Any]) -> tuple[dict[str, Any], list[str]]:
    request = pack_request("Tag each article.", inputs, Topic.model_json_schema())
    tool = anthropic_tool(request.reply_schema)
    kwargs = {
        "model": MODEL,
        "max_tokens": 2000,
        "system": request.system,
        "messages": [{"role": "user", "content": request.user}],
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": tool["name"]},
    }
    return kwargs, list(request.ids)


async def test_forced_tool_answers_every_item(
    sim: SimulatedProvider, client: anthropic.AsyncAnthropic
) -> None:
    inputs = [f"article {n}" for n in range(5)]
    kwargs, ids = tool_request(inputs)
    start = anyio.current_time()
    message = await client.messages.create(**kwargs)
    (block,) = message.content
    assert block.type == "tool_use"
    assert message.stop_reason == "tool_use"
    split = split_reply(json.dumps(block.input), ids, Topic.model_validate)
    assert split.values == {
        i: Topic.model_validate(expected_output(x, Topic.model_json_schema()))
        for i, x in zip(ids, inputs, strict=True)
    }
    (record,) = sim.requests
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert record.items == 5
    assert record.api == "anthropic.messages"
    assert anyio.current_time() - start == pytest.approx(
        compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens).total
    )


async def test_streamed_tool_use(client: anthropic.AsyncAnthropic) -> None:
    kwargs, _ = tool_request(["a", "b"])
    whole = await client.messages.create(**kwargs)
    events = []
    async with client.messages.stream(**kwargs) as stream:
        async for event in stream:
            events.append(event.type)
        final = await stream.get_final_message()
    assert [b.model_dump(exclude={"id"}) for b in final.content] == [
        b.model_dump(exclude={"id"}) for b in whole.content
    ]
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.stop_reason == "tool_use"
    assert events[0] == "message_start"
    assert events[-1] == "message_stop"
    assert "input_json" in events
    assert "content_block_stop" in events
    assert "message_delta" in events


async def test_streamed_text(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(
        model=MODEL,
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello"}],
    ) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == expected_output("hello")
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


async def test_max_tokens_stop_reason(client: anthropic.AsyncAnthropic) -> None:
    kwargs, ids = tool_request([f"x{n}" for n in range(10)])
    message = await client.messages.create(**{**kwargs, "max_tokens": 80})
    assert message.stop_reason == "max_tokens"
    (block,) = message.content
    assert block.type == "tool_use"
    kept = block.input["results"]
    assert 0 < len(kept) < 10
    assert list(kept) == ids[: len(kept)]
    text = await client.messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "q"}]
    )
    assert text.stop_reason == "max_tokens"
    assert text.usage.output_tokens <= 2


async def test_text_fault_replaces_the_tool_call_with_prose(
    sim: SimulatedProvider, client: anthropic.AsyncAnthropic
) -> None:
    kwargs, ids = tool_request(["a"])
    sim.inject("prose")
    message = await client.messages.create(**kwargs)
    (block,) = message.content
    assert block.type == "text"
    assert block.text.startswith("Sure!")
    assert message.stop_reason == "end_turn"
    assert split_reply(block.text, ids, Topic.model_validate).values


async def test_errors(sim: SimulatedProvider, client: anthropic.AsyncAnthropic) -> None:
    sim.inject("rate_limit", "unavailable", "server_error")
    messages: Any = [{"role": "user", "content": "x"}]
    with pytest.raises(anthropic.RateLimitError) as rate:
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
    assert rate.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "simulated fault: rate_limit"},
    }
    assert rate.value.response.headers["request-id"].startswith("req_")
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
    assert overloaded.value.status_code == 503
    with pytest.raises(anthropic.InternalServerError):
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        await client.messages.create(model=MODEL, messages=messages, max_tokens=0)
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        await client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=messages,
            tools=[{"name": "a", "input_schema": {"type": "object"}}],
            tool_choice={"type": "tool", "name": "b"},
        )
    sim.inject("disconnect")
    with pytest.raises(anthropic.APIConnectionError):
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages)


async def test_rate_limit_headers() -> None:
    sim = SimulatedProvider(rate_limits=RateLimit(requests_per_minute=1, tokens_per_minute=5000))
    async with sim.anthropic_client(max_retries=0) as client:
        messages: Any = [{"role": "user", "content": "x"}]
        raw = await client.messages.with_raw_response.create(
            model=MODEL, max_tokens=10, messages=messages
        )
        assert raw.headers["anthropic-ratelimit-requests-limit"] == "1"
        assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert raw.headers["anthropic-ratelimit-tokens-limit"] == "5000"
        assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
        with pytest.raises(anthropic.RateLimitError) as error:
            await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
        assert error.value.response.headers["retry-after"] == "60"
    async with sim.anthropic_client(max_retries=1) as client:
        # The SDK waits out retry-after (60 s of virtual time), then succeeds.
        start = anyio.current_time()
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
        assert anyio.current_time() - start >= 59
