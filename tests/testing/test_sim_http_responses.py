"""What frameworks send, over real HTTP (uvicorn in a thread): the Responses API, chat
tool calls and Anthropic's structured outputs, plain and streamed.

The in-process tests (test_sim_responses, test_sim_tools) cover each shape in detail
on virtual time; these prove the same shapes survive a real socket, with a small time
scale.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel

from coalesce.testing import SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

FAST = 0.001
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


class Tag(BaseModel):
    label: Literal["billing", "bug", "other"]
    urgent: bool


async def test_responses_plain_parsed_and_streamed_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    async with sim.serve_async() as url, sim.openai_client(url, max_retries=0) as client:
        text = await client.responses.create(model="gpt-4o-mini", input="hello")
        parsed = await client.responses.parse(
            model="gpt-4o-mini", input="the invoice is wrong", text_format=Tag
        )
        async with client.responses.stream(
            model="gpt-4o-mini", input="the invoice is wrong", text_format=Tag
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
    assert text.output_text == expected_output("hello")
    assert isinstance(parsed.output_parsed, Tag)
    assert final.output_parsed == parsed.output_parsed
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert [r.api for r in sim.requests] == ["openai.responses"] * 3
    assert [r.stream for r in sim.requests] == [False, False, True]


async def test_responses_function_call_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    schema = Tag.model_json_schema()
    async with sim.serve_async() as url, sim.openai_client(url, max_retries=0) as client:
        response = await client.responses.create(
            model="gpt-4o-mini",
            input="the app crashes",
            tools=[{"type": "function", "name": "tag", "parameters": schema, "strict": False}],
            tool_choice={"type": "function", "name": "tag"},
        )
    (call,) = response.output
    assert call.type == "function_call"
    assert json.loads(call.arguments) == expected_output("the app crashes", schema)


@SDK_STREAMS
async def test_chat_tool_call_streamed_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    async with (
        sim.serve_async() as url,
        sim.openai_client(url, max_retries=0) as client,
        client.chat.completions.stream(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "refund please"}],
            tools=[openai.pydantic_function_tool(Tag)],
            tool_choice="required",
        ) as stream,
    ):
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.choices[0].message.tool_calls is not None
    assert isinstance(final.choices[0].message.tool_calls[0].function.parsed_arguments, Tag)


async def test_anthropic_output_config_over_http() -> None:
    sim = SimulatedProvider(time_scale=FAST)
    async with sim.serve_async() as url, sim.anthropic_client(url, max_retries=0) as client:
        message = await client.messages.parse(
            model="claude-x",
            max_tokens=200,
            messages=[{"role": "user", "content": "the app crashes"}],
            output_format=Tag,
        )
        async with client.messages.stream(
            model="claude-x",
            max_tokens=200,
            messages=[{"role": "user", "content": "the app crashes"}],
            output_format=Tag,
        ) as stream:
            streamed = await stream.get_final_message()
    assert message.parsed_output == Tag.model_validate(
        expected_output("the app crashes", Tag.model_json_schema())
    )
    assert streamed.parsed_output == message.parsed_output
