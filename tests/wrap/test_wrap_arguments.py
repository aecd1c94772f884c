"""Arguments that do not change the answer do not stop ``coalesce.wrap``'s calls from
coalescing: ``extra_headers`` (sent with the packed request; calls group only with calls
sending the same), ``extra_body`` / ``extra_query`` that are ``None`` or empty,
``timeout`` (the caller's own, read into the call), user content as text parts,
``developer`` messages, Anthropic's ``beta.messages.create`` without betas that change
the answer. Anything else still passes through untouched. Pure reads first, then the
official SDKs against the simulated provider in process, on virtual time."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
from _wrapping import SCHEMA, SYSTEM, TEXT, accumulated, chat, gather, msg
from anthropic.types.beta import BetaMessage
from openai.types.chat import ChatCompletion

from coalesce._wrap import wrap
from coalesce._wrap.anthropic_messages import (
    NEUTRAL_BETAS,
    anthropic_beta_call,
    anthropic_create_call,
)
from coalesce._wrap.call import split_transport
from coalesce._wrap.openai_chat import openai_create_call
from coalesce.testing import SimulatedProvider

FRAMEWORK = {"User-Agent": "framework/1.0", "x-trace": "abc"}


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text} for text in texts]


def key(call: Any) -> str:
    assert call is not None
    return str(call.key)


# -- pure reads -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"extra_body": None},
        {"extra_body": {}},
        {"extra_query": None},
        {"extra_query": {}},
        {"extra_headers": None},
        {"extra_headers": {}},
        {"timeout": None},
        {"timeout": 30},
        {"timeout": 2.5},
        {"extra_body": None, "extra_query": None, "extra_headers": {}, "timeout": 10},
    ],
)
def test_arguments_that_change_nothing_keep_the_call_and_its_key(extra: dict[str, Any]) -> None:
    assert key(openai_create_call(chat("x", **extra))) == key(openai_create_call(chat("x")))
    assert key(anthropic_create_call(msg("x", **extra))) == key(anthropic_create_call(msg("x")))


def test_timeout_is_read_into_the_call_not_its_key() -> None:
    call = openai_create_call(chat("x", timeout=30))
    assert call is not None
    assert (call.timeout, call.options) == (30.0, {})
    streamed = openai_create_call(chat("x", timeout=2.5, stream=True))
    assert streamed is not None
    assert (streamed.timeout, streamed.stream) == (2.5, True)
    told = anthropic_create_call(msg("x", timeout=7))
    assert told is not None
    assert told.timeout == 7.0
    none = openai_create_call(chat("x", timeout=None))
    assert none is not None
    assert none.timeout is None


def test_extra_headers_are_sent_and_keyed() -> None:
    call = openai_create_call(chat("x", extra_headers=FRAMEWORK))
    assert call is not None
    assert call.options == {"extra_headers": FRAMEWORK}
    reordered = dict(reversed(FRAMEWORK.items()))
    assert key(openai_create_call(chat("x", extra_headers=reordered))) == call.key
    assert key(openai_create_call(chat("x"))) != call.key
    other = {**FRAMEWORK, "x-trace": "def"}
    assert key(openai_create_call(chat("x", extra_headers=other))) != call.key
    told = anthropic_create_call(msg("x", extra_headers=FRAMEWORK, temperature=0))
    assert told is not None
    assert told.options == {"temperature": 0, "extra_headers": FRAMEWORK}


@pytest.mark.parametrize(
    "extra",
    [
        {"extra_body": {"x": 1}},
        {"extra_body": []},
        {"extra_query": {"api-version": "2024"}},
        {"extra_headers": {"x-count": 1}},  # not text: what would the SDK send?
        {"extra_headers": {"anthropic-beta": "output-128k-2025-02-19"}},
        {"extra_headers": {"OpenAI-Beta": "assistants=v2"}},
        {"extra_headers": "User-Agent: x"},
        {"timeout": 0},
        {"timeout": -1},
        {"timeout": float("inf")},
        {"timeout": float("nan")},
        {"timeout": True},
        {"timeout": "30"},
        {"timeout": httpx2.Timeout(30.0)},
    ],
)
def test_arguments_that_may_change_the_answer_pass_through(extra: dict[str, Any]) -> None:
    assert split_transport(extra) is None
    assert openai_create_call(chat("x", **extra)) is None
    assert anthropic_create_call(msg("x", **extra)) is None


def test_text_parts_are_the_text_they_hold() -> None:
    one = openai_create_call(chat(parts("hello")))
    assert one is not None
    assert one.item == "hello"
    assert one.key == key(openai_create_call(chat("hello")))
    two = openai_create_call(chat(parts("first", "second")))
    assert two is not None
    assert two.item == "first\n\nsecond"
    block = anthropic_create_call(msg(parts("hello")))
    assert block is not None
    assert block.item == "hello"
    assert block.key == key(anthropic_create_call(msg("hello")))


def test_earlier_turns_and_system_as_text_parts() -> None:
    messages = [
        {"role": "system", "content": parts("Answer briefly.")},
        {"role": "user", "content": parts("My name is Ada.")},
        {"role": "assistant", "content": parts("Hello Ada.")},
        {"role": "user", "content": parts("What is my name?")},
    ]
    call = openai_create_call({"model": "m", "messages": messages})
    assert call is not None
    assert call.item == "What is my name?"
    assert call.instructions.startswith("Answer briefly.")
    assert "[user] My name is Ada." in call.instructions
    assert "[assistant] Hello Ada." in call.instructions


def test_developer_messages_are_system_instructions() -> None:
    developer = {"role": "developer", "content": "Answer briefly."}
    call = openai_create_call(
        {"model": "gpt-4o-mini", "messages": [developer, chat("x")["messages"][1]]}
    )
    assert call is not None
    assert call.key == key(openai_create_call(chat("x")))
    assert call.instructions.startswith("Answer briefly.")
    as_parts = {"role": "developer", "content": parts("Answer briefly.")}
    again = openai_create_call(
        {"model": "gpt-4o-mini", "messages": [as_parts, {"role": "user", "content": "x"}]}
    )
    assert key(again) == call.key


IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


@pytest.mark.parametrize(
    "content",
    [
        [],
        [IMAGE],
        [{"type": "text", "text": "look"}, IMAGE],
        [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        [{"type": "text", "text": 3}],
        [{"type": "text"}],
        ["hi"],
        {"type": "text", "text": "hi"},
    ],
)
def test_content_that_is_not_only_text_passes_through(content: Any) -> None:
    assert openai_create_call(chat(content)) is None
    assert anthropic_create_call(msg(content)) is None
    earlier = [{"role": "user", "content": content}, {"role": "user", "content": "x"}]
    assert openai_create_call({"model": "m", "messages": earlier}) is None


@pytest.mark.parametrize("betas", [None, [], sorted(NEUTRAL_BETAS)])
def test_beta_messages_without_betas_that_change_the_answer(betas: list[str] | None) -> None:
    given = msg(parts("x"), system="Be kind.", temperature=0)
    beta = anthropic_beta_call(given if betas is None else {**given, "betas": betas})
    assert beta is not None
    assert beta == anthropic_create_call(given)


@pytest.mark.parametrize(
    "extra",
    [
        {"betas": ["output-128k-2025-02-19"]},
        {"betas": ["prompt-caching-2024-07-31", "context-management-2025-06-27"]},
        {"betas": "prompt-caching-2024-07-31"},
        {"container": "container_1"},
        {"context_management": {"edits": []}},
        {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"stop_sequences": ["\n"]},
    ],
)
def test_beta_messages_with_what_may_change_the_answer_pass_through(extra: dict[str, Any]) -> None:
    assert anthropic_beta_call(msg("x", **extra)) is None


# -- against the simulated provider ---------------------------------------------------


def recording_openai(sim: SimulatedProvider, seen: list[httpx2.Request]) -> openai.AsyncOpenAI:
    """An ``AsyncOpenAI`` in process to ``sim`` that records each HTTP request it sends."""

    async def record(request: httpx2.Request) -> None:
        seen.append(request)

    http = httpx2.AsyncClient(transport=sim.transport(), event_hooks={"request": [record]})
    return openai.AsyncOpenAI(
        base_url="http://simulated-provider.test/v1", api_key="sk", http_client=http, max_retries=0
    )


@pytest.mark.anyio
async def test_what_frameworks_add_still_coalesces_and_the_headers_are_sent() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    seen: list[httpx2.Request] = []
    developer: Any = {"role": "developer", "content": "Answer briefly."}

    def user(text: str) -> Any:
        return {"role": "user", "content": parts(text)}

    async with wrap(recording_openai(sim, seen), max_items=4, packing="always") as client:

        async def ask(i: int) -> ChatCompletion:
            reply: ChatCompletion = await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[developer, user(f"q{i}")],
                extra_headers=FRAMEWORK,
                extra_body=None,
                extra_query=None,
                timeout=30,
            )
            return reply

        replies = await gather(8, ask)
    assert [r.items for r in sim.requests] == [4, 4]
    for i, reply in enumerate(replies):
        assert isinstance(reply, ChatCompletion)
        assert reply.choices[0].message.content == sim.expected_output(f"q{i}", TEXT)
    assert len({r.id for r in replies}) == 8
    assert len(seen) == 2
    for request in seen:
        assert request.headers["user-agent"] == "framework/1.0"
        assert request.headers["x-trace"] == "abc"
        body = json.loads(request.content)
        assert "extra_headers" not in body
        assert len(json.loads(body["messages"][-1]["content"])) == 4  # a packed request


@pytest.mark.anyio
async def test_calls_with_different_headers_never_share_a_request() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    seen: list[httpx2.Request] = []
    async with wrap(recording_openai(sim, seen), max_items=8, packing="always") as client:

        async def ask(i: int) -> ChatCompletion:
            headers = {"x-tenant": "a" if i % 2 else "b"}
            reply: ChatCompletion = await client.chat.completions.create(
                **chat(f"t{i}", extra_headers=headers)
            )
            return reply

        replies = await gather(8, ask)
    # Together they would have filled one request of eight.
    assert sorted(r.items for r in sim.requests) == [4, 4]
    assert sorted(request.headers["x-tenant"] for request in seen) == ["a", "b"]
    for i, reply in enumerate(replies):
        assert reply.choices[0].message.content == sim.expected_output(f"t{i}", TEXT)


@pytest.mark.anyio
async def test_anthropic_text_blocks_and_headers_coalesce() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.anthropic_client(max_retries=0), max_items=3, packing="always") as client:
        replies = await gather(
            6,
            lambda i: client.messages.create(
                **msg(parts(f"a{i}"), extra_headers=FRAMEWORK, extra_body={}, timeout=20.0)
            ),
        )
    assert [r.items for r in sim.requests] == [3, 3]
    for i, reply in enumerate(replies):
        block = reply.content[0]
        assert block.type == "text"
        assert block.text == sim.expected_output(f"a{i}", TEXT)


@pytest.mark.anyio
async def test_beta_messages_create_coalesces_each_with_its_own_beta_message() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    tool = {
        "tools": [{"name": "verdict", "description": "Classify the mail.", "input_schema": SCHEMA}],
        "tool_choice": {"type": "any"},
    }
    async with wrap(sim.anthropic_client(max_retries=0), max_items=4, packing="always") as client:

        async def ask(i: int) -> Any:
            extra = tool if i % 2 else {}
            return await client.beta.messages.create(
                **msg(parts(f"b{i}"), system="Be kind.", extra_headers=FRAMEWORK, **extra)
            )

        replies = await gather(8, ask)
    assert sorted(r.items for r in sim.requests) == [4, 4]  # text and tool calls apart
    for i, reply in enumerate(replies):
        assert isinstance(reply, BetaMessage)
        block = reply.content[0]
        if i % 2:
            assert block.type == "tool_use"
            assert (block.name, reply.stop_reason) == ("verdict", "tool_use")
            assert block.input == sim.expected_output(f"b{i}", SCHEMA)
        else:
            assert block.type == "text"
            assert block.text == sim.expected_output(f"b{i}", TEXT)
    stats = sim.statistics()
    assert sum(r.usage.input_tokens for r in replies) == stats.prompt_tokens
    assert sum(r.usage.output_tokens for r in replies) == stats.completion_tokens


@pytest.mark.anyio
async def test_streamed_beta_messages_are_the_sdks_beta_events() -> None:
    from anthropic.lib.streaming._beta_messages import accumulate_event

    sim = SimulatedProvider(time_scale=0.01)
    async with wrap(sim.anthropic_client(max_retries=0), max_items=2, packing="always") as client:

        async def ask(i: int) -> Any:
            stream = await client.beta.messages.create(**msg(f"s{i}", stream=True, betas=[]))
            snapshot = None
            async for event in stream:
                snapshot = accumulated(
                    accumulate_event,
                    event=event,
                    current_snapshot=snapshot,
                    json_bufs={},
                    request_headers=httpx2.Headers(),
                )
            return snapshot

        messages = await gather(2, ask)
    assert len(sim.requests) == 1
    for i, message in enumerate(messages):
        assert message is not None
        assert message.content[0].type == "text"
        assert message.content[0].text == sim.expected_output(f"s{i}", TEXT)


class _Spy:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return await self.real(**kwargs)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "extra",
    [
        {"extra_body": {"logit_bias": {}}},
        {"extra_query": {"trace": "1"}},
        {"timeout": openai.Timeout(30.0)},
        {"extra_headers": {"x-count": "1"}, "logprobs": True},
        {"messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE]}]},
    ],
)
async def test_openai_calls_that_may_change_the_answer_reach_the_real_client_untouched(
    extra: dict[str, Any],
) -> None:
    sim = SimulatedProvider(time_scale=0.01)
    raw = sim.openai_client(max_retries=0)
    spy = _Spy(raw.chat.completions.create)
    raw.chat.completions.create = spy  # type: ignore[method-assign]
    async with wrap(raw, packing="always") as client:
        kwargs = chat("hello", **extra)
        reply = await client.chat.completions.create(**kwargs)
    assert spy.calls == [kwargs]
    assert isinstance(reply, ChatCompletion)
    assert len(sim.requests) == 1


@pytest.mark.anyio
async def test_beta_messages_with_betas_reach_the_real_client_untouched() -> None:
    sim = SimulatedProvider(time_scale=0.01)
    raw = sim.anthropic_client(max_retries=0)
    spy = _Spy(raw.beta.messages.create)
    raw.beta.messages.create = spy  # type: ignore[method-assign]
    async with wrap(raw, packing="always") as client:
        kwargs = msg("x", betas=["output-128k-2025-02-19"])
        reply = await client.beta.messages.create(**kwargs)
        coalesced = await client.beta.messages.create(**msg("y"))
    assert spy.calls == [kwargs]
    assert isinstance(reply, BetaMessage)
    assert isinstance(coalesced, BetaMessage)
