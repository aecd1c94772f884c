"""The simulator's OpenAI Responses API, through the official SDK, in process.

Runs on virtual time (both backends): latencies are asserted exactly. The answer to a
request is the answer Chat Completions gives the same prompt.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import openai
import pytest
from openai.types.responses import ResponseFormatTextJSONSchemaConfig
from pydantic import BaseModel

from coalesce._wire.packing import pack_request, split_reply
from coalesce.providers._shapes import openai_response_format
from coalesce.testing import (
    LatencyProfile,
    RateLimit,
    SimulatedLatency,
    SimulatedProvider,
    compute_delays,
    expected_output,
)

pytestmark = pytest.mark.anyio

PROFILE = LatencyProfile(ttft=0.5, prompt_token_seconds=0.001, tokens_per_second=50)
MODEL = "gpt-4o-mini"


class Tag(BaseModel):
    label: Literal["billing", "bug", "other"]
    urgent: bool


TAG = Tag.model_json_schema()


def json_format(schema: Any, *, strict: bool = True) -> Any:
    """``text.format`` for ``schema``: the chat ``response_format``'s, flattened."""
    spec = openai_response_format(schema, name="tag", strict=strict)["json_schema"]
    return {"type": "json_schema", **spec}


def tool(name: str = "tag", schema: Any = TAG) -> Any:
    return {"type": "function", "name": name, "parameters": schema, "strict": False}


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(latency=SimulatedLatency(default=PROFILE))


@pytest.fixture
async def client(sim: SimulatedProvider) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sim.openai_client(max_retries=0) as client:
        yield client


async def test_text_answer_is_a_genuine_response(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    start = anyio.current_time()
    response = await client.responses.create(
        model=MODEL, instructions="Tag the ticket.", input="the invoice is wrong"
    )
    elapsed = anyio.current_time() - start
    assert response.output_text == expected_output("the invoice is wrong")
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.instructions == "Tag the ticket."
    (item,) = response.output
    assert item.type == "message"
    assert item.role == "assistant"
    assert item.status == "completed"
    assert item.id.startswith("msg_")
    (part,) = item.content
    assert part.type == "output_text"
    assert part.text == expected_output("the invoice is wrong")
    (record,) = sim.requests
    assert record.api == "openai.responses"
    assert record.status == 200
    assert record.items == 1
    assert record.service_tier == "default"
    assert response.usage is not None
    assert response.usage.input_tokens == record.prompt_tokens
    assert response.usage.output_tokens == record.completion_tokens
    assert response.usage.total_tokens == record.prompt_tokens + record.completion_tokens
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert elapsed == pytest.approx(
        compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens).total
    )


@pytest.mark.parametrize(
    "given",
    [
        "q",
        [{"role": "user", "content": "q"}],
        [{"role": "user", "content": [{"type": "input_text", "text": "q"}]}],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}],
    ],
    ids=["string", "message", "input_text", "typed_message"],
)
async def test_every_input_shape_is_the_same_prompt(
    sim: SimulatedProvider, client: openai.AsyncOpenAI, given: Any
) -> None:
    response = await client.responses.create(model=MODEL, instructions="Answer.", input=given)
    chat = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Answer."}, {"role": "user", "content": "q"}],
    )
    assert response.output_text == chat.choices[0].message.content == expected_output("q")
    assert response.usage is not None
    assert chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert [r.api for r in sim.requests] == ["openai.responses", "openai.chat"]


@pytest.mark.parametrize("strict", [True, False])
async def test_json_schema_format_answers_as_chat_does(
    client: openai.AsyncOpenAI, strict: bool
) -> None:
    response = await client.responses.create(
        model=MODEL, input="the app crashes", text={"format": json_format(TAG, strict=strict)}
    )
    chat = await client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL,
        messages=[{"role": "user", "content": "the app crashes"}],
        response_format=openai_response_format(TAG, name="tag", strict=strict),
    )
    assert response.output_text == chat.choices[0].message.content
    assert json.loads(response.output_text) == expected_output(
        "the app crashes", json_format(TAG, strict=strict)["schema"]
    )
    assert response.text is not None
    assert isinstance(response.text.format, ResponseFormatTextJSONSchemaConfig)


async def test_text_format_text_is_plain_text(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL, input="hello", text={"format": {"type": "text"}}
    )
    assert response.output_text == expected_output("hello")


async def test_packed_prompt_is_answered_per_item_like_chat(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    inputs = [f"ticket {n}" for n in range(5)]
    request = pack_request("Tag each ticket.", inputs, TAG)
    fmt: Any = openai_response_format(request.reply_schema)
    given: Any = [{"role": "user", "content": [{"type": "input_text", "text": request.user}]}]
    text: Any = {"format": {"type": "json_schema", **fmt["json_schema"]}}
    response = await client.responses.create(
        model=MODEL, instructions=request.system, input=given, text=text
    )
    messages: Any = request.messages()
    chat = await client.chat.completions.create(model=MODEL, messages=messages, response_format=fmt)
    assert response.output_text == chat.choices[0].message.content
    split = split_reply(response.output_text, request.ids, Tag.model_validate)
    assert split.values == {
        i: Tag.model_validate(expected_output(x, TAG))
        for i, x in zip(request.ids, inputs, strict=True)
    }
    assert [r.items for r in sim.requests] == [5, 5]


async def test_parse_with_a_text_format_model(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.parse(
        model=MODEL, instructions="Tag the ticket.", input="refund please", text_format=Tag
    )
    assert isinstance(response.output_parsed, Tag)
    assert response.text is not None
    fmt = response.text.format
    assert isinstance(fmt, ResponseFormatTextJSONSchemaConfig)
    assert response.output_parsed == Tag.model_validate(
        expected_output("refund please", fmt.schema_)
    )


async def test_stream_helper_gives_the_sdks_events_and_final_response(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    whole = await client.responses.parse(model=MODEL, input="refund", text_format=Tag)
    start = anyio.current_time()
    async with client.responses.stream(model=MODEL, input="refund", text_format=Tag) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output_parsed == whole.output_parsed
    assert final.usage == whole.usage
    record = sim.requests[-1]
    assert record.stream
    assert record.api == "openai.responses"
    assert anyio.current_time() - start == pytest.approx(
        compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens).total, abs=1e-3
    )  # looptime rounds each of the chunk sleeps to the microsecond


async def test_create_stream_true_events_carry_the_text_in_order(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.responses.create(model=MODEL, input="hi there", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected_output("hi there")
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [e.text for e in done] == [text]
    first, last = events[0], events[-1]
    assert first.type == "response.created"
    assert first.response.status == "in_progress"
    assert first.response.output == []
    assert last.type == "response.completed"
    assert last.response.id == first.response.id
    assert last.response.output_text == text
    assert last.response.usage is not None


async def test_max_output_tokens_cuts_the_answer_incomplete(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    sim.output_tokens = 200
    response = await client.responses.create(model=MODEL, input="long", max_output_tokens=20)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens <= 20
    assert sim.expected_output("long").startswith(response.output_text)
    assert len(response.output_text) < len(sim.expected_output("long"))


async def test_streamed_incomplete_ends_with_response_incomplete(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    sim.output_tokens = 200
    stream = await client.responses.create(
        model=MODEL, input="long", max_output_tokens=20, stream=True
    )
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "incomplete"


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "name": "tag"}], ids=["required", "named"]
)
async def test_forced_function_tool_is_a_function_call(
    sim: SimulatedProvider, client: openai.AsyncOpenAI, choice: Any
) -> None:
    response = await client.responses.create(
        model=MODEL,
        instructions="Tag the ticket.",
        input="it crashes",
        tools=[tool()],
        tool_choice=choice,
    )
    (call,) = response.output
    assert call.type == "function_call"
    assert call.name == "tag"
    assert call.call_id.startswith("call_")
    assert call.status == "completed"
    assert json.loads(call.arguments) == expected_output("it crashes", TAG)
    assert response.output_text == ""
    (record,) = sim.requests
    assert response.usage is not None
    assert response.usage.output_tokens == record.completion_tokens
    assert record.api == "openai.responses"


async def test_the_named_function_among_several(client: openai.AsyncOpenAI) -> None:
    other = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    response = await client.responses.create(
        model=MODEL,
        input="x",
        tools=[tool(), tool("count", other)],
        tool_choice={"type": "function", "name": "count"},
    )
    (call,) = response.output
    assert call.type == "function_call"
    assert call.name == "count"
    assert json.loads(call.arguments) == expected_output("x", other)


async def test_calls_get_their_own_call_ids(client: openai.AsyncOpenAI) -> None:
    ids = set()
    for _ in range(3):
        response = await client.responses.create(
            model=MODEL, input="x", tools=[tool()], tool_choice="required"
        )
        (call,) = response.output
        assert call.type == "function_call"
        ids.add(call.call_id)
    assert len(ids) == 3


async def test_tools_with_auto_choice_answer_text(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(model=MODEL, input="x", tools=[tool()])
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == expected_output("x")


async def test_streamed_function_call_arguments(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(
        model=MODEL, input="it crashes", tools=[tool()], tool_choice="required"
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert json.loads(arguments) == expected_output("it crashes", TAG)
    (call,) = final.output
    assert call.type == "function_call"
    assert call.arguments == arguments


async def test_invalid_requests_get_openai_errors(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="'input' is required"):
        await client.responses.create(model=MODEL, input=[])
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        await client.responses.create(model=MODEL, input="x", max_output_tokens=0)
    with pytest.raises(openai.BadRequestError, match="nope"):
        await client.responses.create(
            model=MODEL,
            input="x",
            tools=[tool()],
            tool_choice={"type": "function", "name": "nope"},
        )


async def test_faults_apply_as_for_chat(sim: SimulatedProvider, client: openai.AsyncOpenAI) -> None:
    sim.inject("rate_limit", "server_error", "prose")
    with pytest.raises(openai.RateLimitError):
        await client.responses.create(model=MODEL, input="x")
    with pytest.raises(openai.InternalServerError):
        await client.responses.create(model=MODEL, input="x")
    prose = await client.responses.create(
        model=MODEL, input="x", tools=[tool()], tool_choice="required"
    )
    # The model answered in prose instead of calling the function: a message item.
    (item,) = prose.output
    assert item.type == "message"
    assert prose.output_text.startswith("Sure!")
    assert [(r.status, r.faults) for r in sim.requests] == [
        (429, ("rate_limit",)),
        (500, ("server_error",)),
        (200, ("prose",)),
    ]


async def test_item_faults_damage_a_packed_response(
    sim: SimulatedProvider, client: openai.AsyncOpenAI
) -> None:
    request = pack_request("Tag each.", ["a", "b", "c"], TAG)
    sim.inject("missing_item")
    response = await client.responses.create(
        model=MODEL, instructions=request.system, input=request.user
    )
    assert len(json.loads(response.output_text)["results"]) == 2
    assert sim.requests[-1].faults == ("missing_item",)


async def test_rate_limits_count_responses_requests() -> None:
    sim = SimulatedProvider(rate_limits=RateLimit(requests_per_minute=1, tokens_per_minute=10_000))
    async with sim.openai_client(max_retries=0) as client:
        raw = await client.responses.with_raw_response.create(model=MODEL, input="x")
        assert raw.headers["x-ratelimit-remaining-requests"] == "0"
        assert raw.headers["x-request-id"].startswith("req_resp_")
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]
            )
    assert [(r.api, r.status) for r in sim.requests] == [
        ("openai.responses", 200),
        ("openai.chat", 429),
    ]


async def test_flex_tier_is_stated_and_slower(sim: SimulatedProvider) -> None:
    async with sim.openai_client(max_retries=0) as client:
        sim.inject_flex(False)
        start = anyio.current_time()
        response = await client.responses.create(model=MODEL, input="x", service_tier="flex")
        elapsed = anyio.current_time() - start
        sim.inject_flex(True)
        with pytest.raises(openai.RateLimitError, match="flex"):
            await client.responses.create(model=MODEL, input="x", service_tier="flex")
    assert response.service_tier == "flex"
    record = sim.requests[0]
    assert record.service_tier == "flex"
    assert elapsed == pytest.approx(
        compute_delays(
            PROFILE, record.prompt_tokens, record.completion_tokens, time_scale=3.0
        ).total
    )
    assert sim.requests[1].faults == ("resource_unavailable",)


async def test_context_window_refusal_is_openais() -> None:
    sim = SimulatedProvider(context_window=50)
    async with sim.openai_client(max_retries=0) as small:
        with pytest.raises(openai.BadRequestError, match="maximum context length") as error:
            await small.responses.create(model=MODEL, input="word " * 100)
    assert error.value.code == "context_length_exceeded"
