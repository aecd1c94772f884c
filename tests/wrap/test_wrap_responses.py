"""The OpenAI Responses API through ``coalesce.wrap``: ``responses.create`` (plain and
``stream=True``), ``responses.parse(text_format=Model)`` and ``responses.stream(...)``.

Coalesced calls are answered through the client's chat completions, packed; each caller
gets the SDK's own ``Response`` / ``ParsedResponse`` (or stream events) of its own
answer, with an id of its own and its usage share. Calls that rely on the server's
state or on tools pass through untouched. Pure reads first, then the official SDK
against the simulated provider in process, on virtual time.
"""

from __future__ import annotations

import json
from typing import Any, Literal, cast

import httpx2
import openai
import pydantic
import pytest
from _wrapping import SCHEMA, TEXT, gather
from openai.lib._parsing._responses import type_to_text_format_param
from openai.types.responses import (
    ParsedResponse,
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseTextDeltaEvent,
)

import coalesce
from coalesce._wrap import wrap
from coalesce._wrap.openai_chat import openai_create_call
from coalesce._wrap.openai_responses import responses_create_call
from coalesce._wrap.openai_responses_parse import responses_parse_call
from coalesce.testing import SimulatedProvider

MODEL = "gpt-4o-mini"
JSON_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "name": "verdict",
    "schema": SCHEMA,
    "strict": True,
}
FUNCTION = {
    "type": "function",
    "name": "verdict",
    "description": "Record the verdict.",
    "parameters": SCHEMA,
    "strict": True,
}


class Verdict(pydantic.BaseModel):
    label: Literal["spam", "ham"]
    score: int


#: The ``text.format`` the SDK's ``parse(text_format=Verdict)`` sends.
VERDICT_FORMAT: dict[str, Any] = dict(type_to_text_format_param(Verdict))


def ask(item: str, /, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "instructions": "Answer briefly.", "input": item, **extra}


# -- pure reads -----------------------------------------------------------------------


def test_a_string_input_is_the_item_and_instructions_are_shared() -> None:
    a, b = responses_create_call(ask("hello")), responses_create_call(ask("bye"))
    assert a is not None
    assert b is not None
    assert (a.item, b.item) == ("hello", "bye")
    assert a.key == b.key
    assert a.instructions.startswith("Answer briefly.")
    assert (a.output_schema, a.tool, a.stream, dict(a.options)) == (None, None, False, {})


def test_a_create_call_is_the_chat_call_that_says_the_same() -> None:
    chat = openai_create_call(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "hello"},
            ],
        }
    )
    call = responses_create_call(ask("hello"))
    assert chat is not None
    assert call is not None
    assert call.key == chat.key  # they share an engine, and so requests


def test_messages_in_input_developer_text_and_parts() -> None:
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ]
    call = responses_create_call({"model": MODEL, "input": messages})
    plain = responses_create_call(ask("hi"))
    assert call is not None
    assert plain is not None
    assert call.item == "hi"
    assert call.key == plain.key
    turns = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada."}]},
        {"role": "user", "content": "What is my name?"},
    ]
    later = responses_create_call({"model": MODEL, "input": turns})
    assert later is not None
    assert later.item == "What is my name?"
    assert "[user] My name is Ada." in later.instructions
    assert "[assistant] Hi Ada." in later.instructions


def test_a_json_schema_text_format_is_the_output_schema() -> None:
    call = responses_create_call(ask("x", text={"format": JSON_FORMAT}))
    text = responses_create_call(ask("x", text={"format": {"type": "text"}}))
    assert call is not None
    assert text is not None
    assert call.output_schema == SCHEMA
    assert text.output_schema is None
    assert text.key == responses_create_call(ask("y")).key  # type: ignore[union-attr]
    assert call.key != text.key


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "verdict"}])
def test_a_forced_function_tool_is_the_output_schema(choice: Any) -> None:
    call = responses_create_call(ask("x", tools=[FUNCTION], tool_choice=choice))
    assert call is not None
    assert (call.output_schema, call.tool) == (SCHEMA, "verdict")
    assert "'verdict' (Record the verdict.)" in call.instructions
    same = responses_create_call(
        ask("y", tools=[FUNCTION], tool_choice=choice, parallel_tool_calls=False)
    )
    assert same is not None
    assert same.key == call.key


def test_options_are_sent_and_separate_calls() -> None:
    call = responses_create_call(
        ask(
            "x",
            temperature=0.2,
            user="u1",
            max_output_tokens=50,
            reasoning={"effort": "low", "summary": None},
            text={"verbosity": "low"},
        )
    )
    assert call is not None
    assert dict(call.options) == {
        "temperature": 0.2,
        "user": "u1",
        "reasoning_effort": "low",
        "verbosity": "low",
    }
    assert call.item_cap == 50
    base = responses_create_call(ask("x"))
    assert base is not None
    for changed in ({"temperature": 0.3}, {"user": "u2"}, {"max_output_tokens": 10}):
        other = responses_create_call(ask("x", **changed))
        assert other is not None
        assert other.key != base.key


@pytest.mark.parametrize(
    "extra",
    [
        {"store": False},
        {"background": False},
        {"previous_response_id": None, "conversation": None, "include": []},
        {"truncation": "auto", "parallel_tool_calls": True, "tools": [], "tool_choice": "auto"},
        {"extra_body": None, "extra_query": None, "timeout": 30},
        {"stream": True, "stream_options": {"include_obfuscation": False}},
        {"reasoning": None, "top_logprobs": 0, "max_tool_calls": None},
    ],
)
def test_arguments_that_change_nothing_coalesce(extra: dict[str, Any]) -> None:
    call = responses_create_call(ask("x", **extra))
    assert call is not None
    assert call.item == "x"


@pytest.mark.parametrize(
    "extra",
    [
        {"previous_response_id": "resp_1"},
        {"conversation": "conv_1"},
        {"background": True},
        {"store": True},  # the caller counts on a stored response
        {"prompt": {"id": "pmpt_1"}},
        {"include": ["reasoning.encrypted_content"]},
        {"tools": [{"type": "web_search"}], "tool_choice": "required"},
        {"tools": [FUNCTION, {**FUNCTION, "name": "other"}], "tool_choice": "required"},
        {"tools": [FUNCTION]},  # the model may answer without calling it
        {"tools": [FUNCTION], "tool_choice": "auto"},
        {"tool_choice": "required"},
        {"tools": [FUNCTION], "tool_choice": "required", "text": {"format": JSON_FORMAT}},
        {
            "tools": [FUNCTION],
            "tool_choice": "required",
            "text": {"format": {"type": "json_object"}},
        },
        {"text": {"format": {"type": "json_object", "other": 1}}},
        {"reasoning": {"effort": "low", "summary": "auto"}},
        {"top_logprobs": 2},
        {"max_output_tokens": 0},
        {"stream": "yes"},
        {"stream_options": {"include_obfuscation": False}},  # without stream=True
        {"extra_body": {"x": 1}},
        {"frobnicate": True},
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
        {"input": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
        {"input": []},
        {"instructions": ["not", "text"]},
    ],
)
def test_stateful_tool_using_and_unknown_calls_pass_through(extra: dict[str, Any]) -> None:
    assert responses_create_call(ask("x", **extra)) is None


def test_parse_is_read_as_the_create_call_the_sdk_sends() -> None:
    fmt = VERDICT_FORMAT
    parsed = responses_parse_call(ask("x", text_format=Verdict))
    created = responses_create_call(ask("y", text={"format": fmt}))
    assert parsed is not None
    assert created is not None
    assert parsed.output_schema == fmt["schema"]
    assert parsed.key == created.key
    text = responses_parse_call(ask("x", stream=False))
    assert text is not None
    assert text.output_schema is None


@pytest.mark.parametrize(
    "extra",
    [
        {"parse_as": Verdict},
        {"stream": True},
        {"text": {"format": JSON_FORMAT}, "text_format": Verdict},  # the SDK's TypeError
        {"tools": [openai.pydantic_function_tool(Verdict)], "tool_choice": "required"},
        {"previous_response_id": "resp_1", "text_format": Verdict},
    ],
)
def test_parse_passthrough(extra: dict[str, Any]) -> None:
    assert responses_parse_call(ask("x", **extra)) is None


# -- in process, virtual time ---------------------------------------------------------


def _message_text(response: Response) -> str:
    (item,) = response.output
    assert isinstance(item, ResponseOutputMessage)
    assert (item.role, item.status) == ("assistant", "completed")
    return item.content[0].text  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_concurrent_creates_share_requests_and_get_their_own_responses() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=5, packing="always") as client:
        replies = await gather(12, lambda i: client.responses.create(**ask(f"q{i}")))
    assert [r.items for r in sim.requests] == [5, 5, 2]
    assert all(r.api == "openai.chat" for r in sim.requests)
    for i, reply in enumerate(replies):
        assert isinstance(reply, Response)
        assert reply.output_text == sim.expected_output(f"q{i}", TEXT)
        assert _message_text(reply) == reply.output_text
        assert (reply.status, reply.model, reply.instructions) == (
            "completed",
            MODEL,
            "Answer briefly.",
        )
        assert reply.id.startswith("resp_")
        assert reply.usage is not None
        usage = reply.usage
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
        assert Response.model_validate(reply.model_dump()) == reply
    assert len({r.id for r in replies}) == 12
    assert len({r.output[0].id for r in replies}) == 12
    stats = sim.statistics()
    assert sum(r.usage.input_tokens for r in replies if r.usage) == stats.prompt_tokens
    assert sum(r.usage.output_tokens for r in replies if r.usage) == stats.completion_tokens


@pytest.mark.anyio
async def test_forty_framework_calls_within_a_budget_make_at_most_ten_requests() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    instructions = "Classify the ticket by category and urgency. " * 60  # ~600 tokens
    messages: list[Any] = [{"role": "developer", "content": instructions}]
    async with wrap(sim.openai_client(max_retries=0), latency_budget=2.0, max_items=20) as client:

        async def one(i: int) -> Response:
            user: Any = {"role": "user", "content": [{"type": "input_text", "text": f"ticket {i}"}]}
            text: Any = {"format": JSON_FORMAT}
            reply: Response = await client.responses.create(
                model=MODEL, input=[*messages, user], text=text
            )
            return reply

        replies = await gather(40, one)
    assert len(sim.requests) <= 10
    for i, reply in enumerate(replies):
        assert json.loads(reply.output_text) == sim.expected_output(f"ticket {i}", SCHEMA)


@pytest.mark.anyio
async def test_responses_and_chat_calls_that_say_the_same_share_a_request() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    system = {"role": "system", "content": "Answer briefly."}
    async with wrap(sim.openai_client(max_retries=0), max_items=6, packing="always") as client:

        async def one(i: int) -> str:
            if i % 2:
                reply: Response = await client.responses.create(**ask(f"m{i}"))
                return reply.output_text
            messages: list[Any] = [system, {"role": "user", "content": f"m{i}"}]
            chat = await client.chat.completions.create(model=MODEL, messages=messages)
            return chat.choices[0].message.content or ""

        texts = await gather(6, one)
    assert [r.items for r in sim.requests] == [6]
    assert texts == [sim.expected_output(f"m{i}", TEXT) for i in range(6)]


@pytest.mark.anyio
async def test_json_schema_creates_and_parse_share_requests() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    fmt = VERDICT_FORMAT
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def one(i: int) -> Any:
            if i % 2:
                return await client.responses.parse(**ask(f"mail {i}"), text_format=Verdict)
            return await client.responses.create(**ask(f"mail {i}", text={"format": fmt}))

        replies = await gather(8, one)
    assert [r.items for r in sim.requests] == [4, 4]
    for i, reply in enumerate(replies):
        expected = sim.expected_output(f"mail {i}", fmt["schema"])
        assert json.loads(reply.output_text) == expected
        if i % 2:
            assert isinstance(reply, ParsedResponse)
            assert isinstance(reply.output_parsed, Verdict)
            assert reply.output_parsed == Verdict.model_validate(expected)
            assert reply.text is not None
            assert reply.text.format is not None
            assert reply.text.format.type == "json_schema"
        else:
            assert type(reply) is Response


@pytest.mark.anyio
async def test_a_forced_function_tool_gets_a_function_call_of_its_own() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=3, packing="always") as client:
        replies = await gather(
            6,
            lambda i: client.responses.create(
                **ask(f"t{i}", tools=[FUNCTION], tool_choice="required")
            ),
        )
    assert [r.items for r in sim.requests] == [3, 3]
    calls = []
    for i, reply in enumerate(replies):
        (item,) = reply.output
        assert isinstance(item, ResponseFunctionToolCall)
        assert (item.name, item.status) == ("verdict", "completed")
        assert json.loads(item.arguments) == sim.expected_output(f"t{i}", SCHEMA)
        assert reply.tool_choice == "required"
        calls.append(item.call_id)
    assert len(set(calls)) == 6


@pytest.mark.anyio
async def test_streamed_creates_get_the_sdks_events_of_their_own_answer() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def one(i: int) -> list[Any]:
            stream = await client.responses.create(**ask(f"s{i}", stream=True))
            async with stream:
                return [event async for event in stream]

        streams = await gather(4, one)
    assert [r.items for r in sim.requests] == [4]
    kinds = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    completed = []
    for i, events in enumerate(streams):
        assert [e.type for e in events] == kinds
        assert [e.sequence_number for e in events] == list(range(len(kinds)))
        text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
        assert text == sim.expected_output(f"s{i}", TEXT)
        done = events[-1]
        assert isinstance(done, ResponseCompletedEvent)
        assert done.response.output_text == text
        assert done.response.id == events[0].response.id
        completed.append(done.response)
    assert len({r.id for r in completed}) == 4
    stats = sim.statistics()
    assert sum(r.usage.input_tokens for r in completed if r.usage) == stats.prompt_tokens
    assert sum(r.usage.output_tokens for r in completed if r.usage) == stats.completion_tokens


@pytest.mark.anyio
async def test_the_sdks_stream_helper_coalesces_and_parses() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=3, packing="always") as client:

        async def one(i: int) -> tuple[ParsedResponse[Verdict], list[Any]]:
            async with client.responses.stream(**ask(f"v{i}"), text_format=Verdict) as stream:
                events = [event async for event in stream]
                final = await stream.get_final_response()
            return final, events

        results = await gather(6, one)
    assert [r.items for r in sim.requests] == [3, 3]
    schema = VERDICT_FORMAT["schema"]
    for i, (final, events) in enumerate(results):
        expected = Verdict.model_validate(sim.expected_output(f"v{i}", schema))
        assert final.output_parsed == expected
        done = [e for e in events if e.type == "response.output_text.done"]
        assert [e.parsed for e in done] == [expected]  # the SDK's own parsed event


@pytest.mark.anyio
async def test_a_streamed_forced_tool_streams_its_own_arguments() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=2, packing="always") as client:

        async def arguments(i: int) -> list[Any]:
            stream = await client.responses.create(
                **ask(f"f{i}", tools=[FUNCTION], tool_choice="required", stream=True)
            )
            return [event async for event in stream]

        streams = await gather(2, arguments)
    assert [r.items for r in sim.requests] == [2]
    for i, events in enumerate(streams):
        added, delta, done = events[2], events[3], events[4]
        assert added.type == "response.output_item.added"
        assert (added.item.type, added.item.arguments) == ("function_call", "")
        assert delta.type == "response.function_call_arguments.delta"
        assert done.type == "response.function_call_arguments.done"
        assert json.loads(delta.delta) == sim.expected_output(f"f{i}", SCHEMA)
        assert done.arguments == delta.delta
        final = events[-1].response.output[0]
        assert isinstance(final, ResponseFunctionToolCall)
        assert (final.name, final.arguments) == ("verdict", delta.delta)


@pytest.mark.anyio
async def test_raw_responses_of_coalesced_calls() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:
        raws = await gather(4, lambda i: client.responses.with_raw_response.create(**ask(f"r{i}")))
    assert [r.items for r in sim.requests] == [4]
    for i, raw in enumerate(raws):
        reply = raw.parse()
        assert isinstance(reply, Response)
        assert reply.output_text == sim.expected_output(f"r{i}", TEXT)
        assert raw.headers["x-coalesce"] == "on"


@pytest.mark.anyio
async def test_raw_streams_of_coalesced_calls() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.openai_client(max_retries=0), max_items=2, packing="always") as client:

        async def streamed(i: int) -> list[Any]:
            raw = await client.responses.with_raw_response.create(**ask(f"s{i}", stream=True))
            async with raw.parse() as stream:
                return [event async for event in stream]

        streams = await gather(2, streamed)
    assert [r.items for r in sim.requests] == [2]
    for i, events in enumerate(streams):
        assert isinstance(events[0], ResponseCreatedEvent)
        assert isinstance(events[-1], ResponseCompletedEvent)
        assert events[-1].response.output_text == sim.expected_output(f"s{i}", TEXT)


# -- what passes through reaches the real client untouched -----------------------------

STUB = {
    "id": "resp_from_the_server",
    "object": "response",
    "created_at": 0,
    "model": MODEL,
    "status": "completed",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


class _ResponsesServer(httpx2.AsyncBaseTransport):
    """The simulator, except that ``POST /v1/responses`` is answered here (with
    :data:`STUB`) and its request bodies are kept."""

    def __init__(self, sim: SimulatedProvider) -> None:
        self.sim = sim.transport()
        self.bodies: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path != "/v1/responses":
            return await self.sim.handle_async_request(request)
        self.bodies.append(json.loads(await request.aread()))
        return httpx2.Response(200, json=STUB, request=request)


def _client(server: _ResponsesServer) -> openai.AsyncOpenAI:
    http = httpx2.AsyncClient(transport=server)
    return openai.AsyncOpenAI(
        base_url="http://simulated-provider.test/v1", api_key="sk", http_client=http, max_retries=0
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "extra",
    [
        {"previous_response_id": "resp_earlier"},
        {"conversation": "conv_1"},
        {"background": True},
        {"store": True},
        {"tools": [{"type": "web_search"}]},
        {"tools": [FUNCTION, {**FUNCTION, "name": "other"}], "tool_choice": "required"},
        {"include": ["message.output_text.logprobs"], "top_logprobs": 2},
        {"extra_body": {"frobnicate": True}},
    ],
)
async def test_what_passes_through_reaches_the_server_untouched(extra: dict[str, Any]) -> None:
    sim = SimulatedProvider(time_scale=0.01)
    server = _ResponsesServer(sim)
    async with wrap(_client(server), packing="always") as client:
        reply = await client.responses.create(**ask("hello", **extra))
        coalesced = await client.responses.create(**ask("hello"))
    assert isinstance(reply, Response)
    assert reply.id == "resp_from_the_server"
    body = {k: v for k, v in ask("hello", **extra).items() if k != "extra_body"}
    assert server.bodies == [{**body, **extra.get("extra_body", {})}]
    assert coalesced.output_text == sim.expected_output("hello", TEXT)
    assert [r.api for r in sim.requests] == ["openai.chat"]


@pytest.mark.anyio
async def test_parse_that_passes_through_is_the_sdks_own() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    server = _ResponsesServer(sim)
    async with wrap(_client(server), packing="always") as client:
        reply = await client.responses.parse(
            **ask("x", previous_response_id="resp_earlier"), text_format=Verdict
        )
        off = await client.responses.create(**ask("y", extra_headers={"x-coalesce": "off"}))
    assert isinstance(reply, ParsedResponse)
    assert [body["input"] for body in server.bodies] == ["x", "y"]
    assert server.bodies[0]["text"]["format"] == VERDICT_FORMAT
    assert server.bodies[0]["previous_response_id"] == "resp_earlier"
    assert isinstance(off, Response)
    assert len(sim.requests) == 0


@pytest.mark.anyio
async def test_the_sdks_errors_reach_the_caller_and_calls_are_counted() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    sim.inject("server_error")
    raw = sim.openai_client(max_retries=0)
    async with wrap(raw, max_wait=0.0, max_retries=0, packing="always") as client:
        with pytest.raises(openai.InternalServerError):
            await client.responses.create(**ask("boom"))
        reply = await client.responses.create(**ask("fine"))
        stats = cast(coalesce.CoalescedClient, client).statistics()[MODEL]
    assert reply.output_text == sim.expected_output("fine", TEXT)
    assert (stats.calls, stats.calls_failed, stats.requests_failed) == (2, 1, 1)
