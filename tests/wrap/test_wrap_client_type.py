"""The wrapped client is the SDK's own client type: ``isinstance`` holds, ``with_options()``
and ``copy()`` keep coalescing (their own credentials kept apart), a call's ``timeout=``
is its own limit, and ``with_raw_response`` / ``with_streaming_response`` give the SDK's
own raw-response objects, against the simulated provider in process (virtual time)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import anyio
import openai
import pydantic
import pytest
from _wrapping import TEXT, chat, msg, outcomes
from anthropic.types import Message
from openai._legacy_response import LegacyAPIResponse
from openai._response import AsyncAPIResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion

import coalesce
from coalesce._wrap import wrap
from coalesce.testing import LatencyModel, LatencyProfile, SimulatedProvider
from coalesce.testing._inprocess import in_process_client


class Verdict(pydantic.BaseModel):
    label: str
    score: int


def answer(reply: ChatCompletion) -> str | None:
    return reply.choices[0].message.content


# -- the client's own type ------------------------------------------------------------


@pytest.mark.anyio
async def test_the_wrapped_client_is_an_instance_of_the_sdks_client() -> None:
    sim = SimulatedProvider()
    raw, plain = sim.openai_client(), sim.anthropic_client()
    wrapped: Any = wrap(raw, packing="always")
    other: Any = wrap(plain, packing="always")
    assert isinstance(wrapped, openai.AsyncOpenAI)
    assert isinstance(other, anthropic.AsyncAnthropic)
    assert isinstance(wrapped, coalesce.CoalescedClient)
    assert isinstance(other, coalesce.CoalescedClient)
    assert not isinstance(raw, coalesce.CoalescedClient)
    assert repr(wrapped) == f"<coalesced {raw!r}>"
    # Its options and every resource not coalesced are the client's own.
    assert (wrapped.base_url, wrapped.api_key, wrapped.max_retries) == (
        raw.base_url,
        raw.api_key,
        raw.max_retries,
    )
    assert wrapped.models is raw.models
    assert other.models is plain.models
    assert isinstance(wrapped.chat.completions, type(raw.chat.completions))
    assert wrapped.chat.completions.create is not raw.chat.completions.create
    await wrapped.aclose()
    await other.aclose()


@pytest.mark.anyio
async def test_instructor_style_type_check_accepts_it_and_its_calls_coalesce() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")

    async def through_framework(i: int) -> ChatCompletion:
        # instructor's from_openai refuses anything but an OpenAI / AsyncOpenAI.
        if not isinstance(client, (openai.OpenAI, openai.AsyncOpenAI)):
            raise TypeError("Client must be an instance of one of: OpenAI, AsyncOpenAI")
        reply: ChatCompletion = await client.chat.completions.create(**chat(f"q{i}"))
        return reply

    replies = await outcomes(8, through_framework)
    await client.close()
    assert [answer(r) for r in replies] == [sim.expected_output(f"q{i}", TEXT) for i in range(8)]
    assert [r.items for r in sim.requests] == [4, 4]


# -- with_options() and copy() --------------------------------------------------------


@pytest.mark.anyio
async def test_with_options_still_coalesces_and_shares_engines_and_statistics() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")
    quick = client.with_options(timeout=30)
    copied = client.copy(max_retries=1)
    assert isinstance(quick, openai.AsyncOpenAI)
    assert isinstance(quick, coalesce.CoalescedClient)
    assert (quick.timeout, copied.max_retries) == (30, 1)

    def ask(i: int) -> Any:
        sender = (client, quick, copied)[i % 3]
        return sender.chat.completions.create(**chat(f"q{i}"))

    replies = await outcomes(6, ask)
    # Two requests carried the calls of the client and both copies.
    assert sorted(r.items for r in sim.requests) == [2, 4]
    assert [answer(r) for r in replies] == [sim.expected_output(f"q{i}", TEXT) for i in range(6)]
    stats = client.statistics()["gpt-4o-mini"]
    assert quick.statistics() == copied.statistics() == client.statistics()
    assert (stats.calls, stats.requests) == (6, 2)
    await quick.aclose()


@pytest.mark.anyio
async def test_copies_with_other_credentials_never_share_a_request() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=8, packing="always")
    other = client.with_options(api_key="sk-other")
    headed = client.with_options(default_headers={"x-tenant": "acme"})
    assert isinstance(other, coalesce.CoalescedClient)

    def ask(i: int) -> Any:
        sender = (client, other, headed)[i % 3]
        return sender.chat.completions.create(**chat(f"q{i}"))

    replies = await outcomes(9, ask)
    await client.aclose()
    assert [answer(r) for r in replies] == [sim.expected_output(f"q{i}", TEXT) for i in range(9)]
    assert sorted((r.api_key, r.items) for r in sim.requests) == [
        ("sk-other", 3),
        ("sk-simulated", 3),
        ("sk-simulated", 3),
    ]
    # Still one set of statistics for every copy.
    stats = client.statistics()["gpt-4o-mini"]
    assert (stats.calls, stats.requests) == (9, 3)


@pytest.mark.anyio
async def test_a_copy_with_another_base_url_sends_through_its_own_copy() -> None:
    sim, elsewhere = SimulatedProvider(), SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=8, packing="always")
    url = "http://elsewhere.test"
    moved = client.with_options(base_url=f"{url}/v1", http_client=in_process_client(elsewhere, url))
    assert isinstance(moved, coalesce.CoalescedClient)
    replies = await outcomes(
        6, lambda i: (client, moved)[i % 2].chat.completions.create(**chat(f"q{i}"))
    )
    await client.aclose()
    assert [answer(r) for r in replies] == [sim.expected_output(f"q{i}", TEXT) for i in range(6)]
    assert [r.items for r in sim.requests] == [3]
    assert [r.items for r in elsewhere.requests] == [3]


@pytest.mark.anyio
async def test_anthropic_with_options_coalesces_with_the_client() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.anthropic_client(max_retries=0), max_items=4, packing="always")
    quick = client.with_options(timeout=20.0)
    assert isinstance(quick, anthropic.AsyncAnthropic)
    replies = await outcomes(4, lambda i: (client, quick)[i % 2].messages.create(**msg(f"m{i}")))
    await client.aclose()
    assert all(isinstance(r, Message) for r in replies)
    assert [r.content[0].text for r in replies] == [
        sim.expected_output(f"m{i}", TEXT) for i in range(4)
    ]
    assert [r.items for r in sim.requests] == [4]


# -- a call's own timeout ----------------------------------------------------------------


@pytest.mark.anyio
async def test_a_calls_timeout_is_its_own_limit_and_the_others_are_answered() -> None:
    sim = SimulatedProvider(latency=LatencyModel(default=LatencyProfile(ttft=5.0)))
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")
    start = anyio.current_time()
    ended: dict[int, float] = {}

    async def ask(i: int) -> Any:
        limit = {"timeout": 1.0} if i == 0 else {"timeout": 60}
        try:
            return await client.chat.completions.create(**chat(f"q{i}", **limit))
        finally:
            ended[i] = anyio.current_time() - start

    replies = await outcomes(4, ask)
    await client.aclose()
    assert isinstance(replies[0], openai.APITimeoutError)
    assert ended[0] == pytest.approx(1.0)
    assert [answer(r) for r in replies[1:]] == [
        sim.expected_output(f"q{i}", TEXT) for i in range(1, 4)
    ]
    assert all(ended[i] > 5.0 for i in range(1, 4))
    # The request carried all four: the call that left did not stop it.
    assert [r.items for r in sim.requests] == [4]


@pytest.mark.anyio
async def test_a_copys_timeout_limits_its_calls_and_anthropic_raises_its_own_error() -> None:
    sim = SimulatedProvider(latency=LatencyModel(default=LatencyProfile(ttft=5.0)))
    client: Any = wrap(sim.anthropic_client(max_retries=0), max_items=4, packing="always")
    quick = client.with_options(timeout=2.0)

    def ask(i: int) -> Any:
        return (quick if i == 0 else client).messages.create(**msg(f"m{i}"))

    replies = await outcomes(2, ask)
    await client.aclose()
    assert isinstance(replies[0], anthropic.APITimeoutError)
    assert isinstance(replies[1], Message)
    assert [r.items for r in sim.requests] == [2]


# -- with_raw_response and with_streaming_response -------------------------------------


@pytest.mark.anyio
async def test_langchain_style_raw_response_calls_coalesce_and_parse_to_their_own_answer() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")

    async def ask(i: int) -> Any:
        # langchain-openai: the resource's with_raw_response.create, then parse().
        raw = await client.chat.completions.with_raw_response.create(**chat(f"q{i}"))
        return raw, raw.parse()

    pairs = await outcomes(8, ask)
    await client.aclose()
    assert [r.items for r in sim.requests] == [4, 4]
    for i, (raw, reply) in enumerate(pairs):
        assert isinstance(raw, LegacyAPIResponse)
        assert isinstance(reply, ChatCompletion)
        assert answer(reply) == sim.expected_output(f"q{i}", TEXT)
        assert raw.status_code == 200
        assert raw.headers["x-request-id"] == raw.request_id == reply.id
        assert reply._request_id == reply.id
        assert raw.headers["x-coalesce"] == "on"
        assert raw.http_request.url == "http://simulated-provider.test/v1/chat/completions"
        assert json.loads(raw.text)["choices"][0]["message"]["content"] == answer(reply)
        assert raw.parse(to=dict)["id"] == reply.id


@pytest.mark.anyio
async def test_raw_responses_on_the_client_and_of_parse() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")

    async def ask(i: int) -> Any:
        if i % 2:
            raw = await client.with_raw_response.chat.completions.create(**chat(f"q{i}"))
        else:
            raw = await client.chat.completions.with_raw_response.parse(
                **chat(f"q{i}", response_format=Verdict)
            )
        return raw.parse()

    replies = await outcomes(4, ask)
    await client.aclose()
    assert [r.items for r in sim.requests] == [2, 2]  # one per kind of call
    for i, reply in enumerate(replies):
        if i % 2:
            assert answer(reply) == sim.expected_output(f"q{i}", TEXT)
        else:
            assert isinstance(reply, ParsedChatCompletion)
            assert isinstance(reply.choices[0].message.parsed, Verdict)


@pytest.mark.anyio
async def test_streaming_responses_coalesce_and_parse_to_their_own_answer() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")

    async def ask(i: int) -> Any:
        resource = client.chat.completions if i % 2 else client.with_streaming_response.chat
        create = resource.with_streaming_response.create if i % 2 else resource.completions.create
        async with create(**chat(f"q{i}")) as response:
            assert isinstance(response, AsyncAPIResponse)
            body = json.loads(await response.text())
            return body, await response.parse()

    pairs = await outcomes(4, ask)
    await client.aclose()
    assert [r.items for r in sim.requests] == [4]
    for i, (body, reply) in enumerate(pairs):
        assert isinstance(reply, ChatCompletion)
        assert answer(reply) == sim.expected_output(f"q{i}", TEXT)
        assert body["choices"][0]["message"]["content"] == answer(reply)


@pytest.mark.anyio
async def test_a_raw_streamed_call_parses_to_the_sdks_own_stream_of_its_answer() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), max_items=4, packing="always")

    async def ask(i: int) -> Any:
        raw = await client.chat.completions.with_raw_response.create(
            **chat(f"q{i}", stream=True, stream_options={"include_usage": True})
        )
        assert raw.headers["content-type"] == "text/event-stream"
        stream = raw.parse()
        assert isinstance(stream, openai.AsyncStream)
        return [chunk async for chunk in stream]

    streams = await outcomes(3, ask)
    await client.aclose()
    assert [r.items for r in sim.requests] == [3]
    stats = client.statistics()["gpt-4o-mini"]
    for i, chunks in enumerate(streams):
        assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == sim.expected_output(f"q{i}", TEXT)
    assert sum(s[-1].usage.completion_tokens for s in streams) == stats.output_tokens


@pytest.mark.anyio
async def test_anthropic_raw_and_streaming_responses_coalesce() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.anthropic_client(max_retries=0), max_items=4, packing="always")

    async def ask(i: int) -> Any:
        if i % 2:
            raw = await client.messages.with_raw_response.create(**msg(f"m{i}"))
            assert isinstance(raw, anthropic._response.AsyncAPIResponse)
            assert raw.request_id == raw.headers["request-id"]
            return await raw.parse()
        async with client.with_streaming_response.messages.create(**msg(f"m{i}")) as response:
            return await response.parse()

    replies = await outcomes(4, ask)
    await client.aclose()
    assert [r.items for r in sim.requests] == [4]
    assert all(isinstance(r, Message) for r in replies)
    assert [r.content[0].text for r in replies] == [
        sim.expected_output(f"m{i}", TEXT) for i in range(4)
    ]
    assert replies[1]._request_id == replies[1].id


@pytest.mark.anyio
async def test_raw_calls_that_are_not_coalescible_get_the_sdks_own_raw_response() -> None:
    sim = SimulatedProvider()
    client: Any = wrap(sim.openai_client(max_retries=0), packing="always")
    raw = await client.chat.completions.with_raw_response.create(**chat("alone", n=2))
    off = await client.chat.completions.with_raw_response.create(
        **chat("off", extra_headers={"x-coalesce": "off"})
    )
    await client.aclose()
    for response in (raw, off):
        assert isinstance(response, LegacyAPIResponse)
        assert "x-coalesce" not in response.headers  # the server's own response
        assert isinstance(response.parse(), ChatCompletion)
    assert [r.items for r in sim.requests] == [1, 1]
    assert client.statistics() == {}
