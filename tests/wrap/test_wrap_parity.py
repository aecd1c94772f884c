"""Every object a wrapped client returns in place of an SDK object is the SDK's own.

Each scenario makes one kind of call and collects, by name, every object the caller
gets: the reply, a stream, its ``response``, each kind of event it yields, a stream
helper and what it gives at the end, a raw response and what it parses into. It runs
once through the plain SDK client and twice at once through the wrapped one (the two
calls coalesced), both against the simulated provider; then each wrapped object must
have every public attribute of the plain client's object (the names that are missing
are the failure), and be of the very same type. A new attribute the SDK adds to one of
these types, or a new type it returns, fails here by name before it fails in a user's
code.

Async clients run in process, on virtual time; the synchronous clients serve their
calls on a background loop that talks HTTP, so their scenarios run over a socket, on the
real clock, in threads.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, cast

import anthropic
import anyio.lowlevel
import openai
import pytest
from _wrapping import SCHEMA, TEXT, chat, gather, msg
from pydantic import BaseModel

import coalesce
from coalesce._wrap import wrap
from coalesce.testing import SimulatedProvider

Collected = dict[str, Any]
Scenario = Callable[[Any, int], Awaitable[Collected]]
SyncScenario = Callable[[Any, int], Collected]


class Verdict(BaseModel):
    label: Literal["spam", "ham"]
    score: int


TOOL: dict[str, Any] = {"type": "function", "function": {"name": "verdict", "parameters": SCHEMA}}
FORCED: dict[str, Any] = {"tools": [TOOL], "tool_choice": "required"}
ANTHROPIC_TOOL: dict[str, Any] = {
    "tools": [{"name": "verdict", "input_schema": SCHEMA}],
    "tool_choice": {"type": "tool", "name": "verdict"},
}


def _public(value: Any) -> set[str]:
    return {name for name in dir(value) if not name.startswith("_")}


def assert_the_sdks(plain: Collected, wrapped: Collected) -> None:
    """Each of ``wrapped``'s objects has every public attribute of ``plain``'s object
    of the same name, and its type."""
    assert sorted(wrapped) == sorted(plain)
    for name, theirs in plain.items():
        ours = wrapped[name]
        missing = sorted(_public(theirs) - _public(ours))
        assert not missing, (
            f"{name}: {type(ours).__qualname__} lacks {missing} of the SDK's"
            f" {type(theirs).__qualname__}"
        )
        assert type(ours) is type(theirs), f"{name}: {type(ours)!r}, not {type(theirs)!r}"


def _events(name: str, events: Iterable[Any]) -> Collected:
    """One event of each kind ``events`` yielded, by its type's name."""
    out: Collected = {}
    for event in events:
        out.setdefault(f"{name} {type(event).__name__}", event)
    return out


async def _stream(stream: Any, name: str = "stream") -> Collected:
    """``stream``, its ``response`` and its events, read to the end."""
    async with stream:
        events = _events(name, [event async for event in cast(AsyncIterable[Any], stream)])
    # Not read as ``stream.response``: a stream without one fails by name, below.
    return {name: stream, f"{name}.response": getattr(stream, "response", None), **events}


async def _helper(manager: Any, final: str) -> Collected:
    """A stream helper of the SDK (``chat.completions.stream``...): the manager, the
    stream it opens, its events and what its ``final`` method gives at the end."""
    async with manager as stream:
        events = _events("stream", [event async for event in stream])
        last = await getattr(stream, final)()
    return {"manager": manager, "stream": stream, **events, "final": last}


async def _raw(raw: Any) -> Collected:
    """A raw response, its ``http_response``, and what it parses into (a stream read)."""
    out = {"raw": raw, "raw.http_response": raw.http_response}
    parsed = raw.parse()
    parsed = await parsed if inspect.isawaitable(parsed) else parsed
    if hasattr(parsed, "__aiter__"):
        return {**out, **await _stream(parsed, "parsed")}
    return {**out, "parsed": parsed}


# -- OpenAI --------------------------------------------------------------------------


def _input(i: int, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "instructions": "Answer briefly.", "input": f"q{i}", **extra}


async def chat_create(client: Any, i: int) -> Collected:
    return {"reply": await client.chat.completions.create(**chat(f"q{i}"))}


async def chat_create_tool(client: Any, i: int) -> Collected:
    return {"reply": await client.chat.completions.create(**chat(f"q{i}", **FORCED))}


async def chat_create_stream(client: Any, i: int) -> Collected:
    usage = {"include_usage": True}
    kwargs = chat(f"q{i}", stream=True, stream_options=usage)
    return await _stream(await client.chat.completions.create(**kwargs))


async def chat_create_tool_stream(client: Any, i: int) -> Collected:
    kwargs = chat(f"q{i}", stream=True, **FORCED)
    return await _stream(await client.chat.completions.create(**kwargs))


async def chat_parse(client: Any, i: int) -> Collected:
    kwargs = chat(f"q{i}", response_format=Verdict)
    return {"reply": await client.chat.completions.parse(**kwargs)}


async def chat_stream_helper(client: Any, i: int) -> Collected:
    kwargs = chat(f"q{i}", response_format=Verdict)
    return await _helper(client.chat.completions.stream(**kwargs), "get_final_completion")


async def beta_chat_stream_helper(client: Any, i: int) -> Collected:
    # LangChain's path for with_structured_output(method="json_schema").astream.
    kwargs = chat(f"q{i}", response_format=Verdict)
    return await _helper(client.beta.chat.completions.stream(**kwargs), "get_final_completion")


async def chat_raw(client: Any, i: int) -> Collected:
    return await _raw(await client.chat.completions.with_raw_response.create(**chat(f"q{i}")))


async def chat_raw_stream(client: Any, i: int) -> Collected:
    kwargs = chat(f"q{i}", stream=True)
    return await _raw(await client.chat.completions.with_raw_response.create(**kwargs))


async def chat_streaming_response(client: Any, i: int) -> Collected:
    async with client.chat.completions.with_streaming_response.create(**chat(f"q{i}")) as raw:
        return await _raw(raw)


async def responses_create(client: Any, i: int) -> Collected:
    return {"reply": await client.responses.create(**_input(i))}


async def responses_create_stream(client: Any, i: int) -> Collected:
    return await _stream(await client.responses.create(**_input(i, stream=True)))


async def responses_parse(client: Any, i: int) -> Collected:
    return {"reply": await client.responses.parse(**_input(i, text_format=Verdict))}


async def responses_stream_helper(client: Any, i: int) -> Collected:
    manager = client.responses.stream(**_input(i, text_format=Verdict))
    return await _helper(manager, "get_final_response")


async def responses_raw_stream(client: Any, i: int) -> Collected:
    kwargs = _input(i, stream=True)
    return await _raw(await client.responses.with_raw_response.create(**kwargs))


OPENAI: list[Scenario] = [
    chat_create,
    chat_create_tool,
    chat_create_stream,
    chat_create_tool_stream,
    chat_parse,
    chat_stream_helper,
    beta_chat_stream_helper,
    chat_raw,
    chat_raw_stream,
    chat_streaming_response,
    responses_create,
    responses_create_stream,
    responses_parse,
    responses_stream_helper,
    responses_raw_stream,
]

# -- Anthropic -----------------------------------------------------------------------


async def messages_create(client: Any, i: int) -> Collected:
    return {"reply": await client.messages.create(**msg(f"q{i}"))}


async def messages_create_stream(client: Any, i: int) -> Collected:
    return await _stream(await client.messages.create(**msg(f"q{i}", stream=True)))


async def messages_create_tool_stream(client: Any, i: int) -> Collected:
    kwargs = msg(f"q{i}", stream=True, **ANTHROPIC_TOOL)
    return await _stream(await client.messages.create(**kwargs))


async def beta_messages_create(client: Any, i: int) -> Collected:
    return {"reply": await client.beta.messages.create(**msg(f"q{i}"))}


async def beta_messages_create_stream(client: Any, i: int) -> Collected:
    return await _stream(await client.beta.messages.create(**msg(f"q{i}", stream=True)))


async def messages_parse(client: Any, i: int) -> Collected:
    return {"reply": await client.messages.parse(**msg(f"q{i}", output_format=Verdict))}


async def messages_raw(client: Any, i: int) -> Collected:
    return await _raw(await client.messages.with_raw_response.create(**msg(f"q{i}")))


async def messages_raw_stream(client: Any, i: int) -> Collected:
    # ChatAnthropic's path for astream.
    kwargs = msg(f"q{i}", stream=True)
    return await _raw(await client.messages.with_raw_response.create(**kwargs))


ANTHROPIC: list[Scenario] = [
    messages_create,
    messages_create_stream,
    messages_create_tool_stream,
    beta_messages_create,
    beta_messages_create_stream,
    messages_parse,
    messages_raw,
    messages_raw_stream,
]


def _model(sdk: str) -> str:
    return "gpt-4o-mini" if sdk == "openai" else "claude-3-5-haiku"


def _client(sim: SimulatedProvider, sdk: str) -> Any:
    if sdk == "openai":
        return sim.openai_client(max_retries=0)
    return sim.anthropic_client(max_retries=0)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("sdk", "scenario"),
    [("openai", s) for s in OPENAI] + [("anthropic", s) for s in ANTHROPIC],
    ids=lambda value: getattr(value, "__name__", value),
)
async def test_wrapped_async_objects_are_the_sdks(sdk: str, scenario: Scenario) -> None:
    sim = SimulatedProvider()
    # The simulator ends a plain chat stream with ``data: [DONE]``, as OpenAI does, where
    # the openai SDK stops reading and leaves its decoder's async generators to the
    # garbage collector; trio warns then, and closes them one per tick (each leaves
    # the one it was reading). Coalesced streams end with their body: they are read
    # outside this block, where the warning is an error.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Async generator .* garbage collected", ResourceWarning)
        plain = await scenario(_client(sim, sdk), 0)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
    async with wrap(_client(sim, sdk), max_items=2, packing="always") as client:
        wrapped = await gather(2, lambda i: scenario(client, i))
        stats = cast(coalesce.CoalescedClient, client).statistics()[_model(sdk)]
    assert (stats.calls, stats.requests) == (2, 1)  # both calls were coalesced
    assert_the_sdks(plain, wrapped[0])


# -- synchronous clients -------------------------------------------------------------


def _read(stream: Any) -> Collected:
    """A synchronous ``stream``, its ``response`` and its events, read to the end."""
    with stream:
        events = _events("stream", list(cast(Iterator[Any], stream)))
    return {"stream": stream, "stream.response": getattr(stream, "response", None), **events}


def _read_helper(manager: Any, final: str) -> Collected:
    """A synchronous stream helper, as :func:`_helper`."""
    with manager as stream:
        events = _events("stream", list(stream))
        last = getattr(stream, final)()
    return {"manager": manager, "stream": stream, **events, "final": last}


def sync_chat_create(client: Any, i: int) -> Collected:
    return {"reply": client.chat.completions.create(**chat(f"q{i}"))}


def sync_chat_create_stream(client: Any, i: int) -> Collected:
    return _read(client.chat.completions.create(**chat(f"q{i}", stream=True)))


def sync_chat_stream_helper(client: Any, i: int) -> Collected:
    kwargs = chat(f"q{i}", response_format=Verdict)
    return _read_helper(client.chat.completions.stream(**kwargs), "get_final_completion")


def sync_responses_create_stream(client: Any, i: int) -> Collected:
    return _read(client.responses.create(**_input(i, stream=True)))


def sync_responses_stream_helper(client: Any, i: int) -> Collected:
    manager = client.responses.stream(**_input(i, text_format=Verdict))
    return _read_helper(manager, "get_final_response")


def sync_messages_create_stream(client: Any, i: int) -> Collected:
    return _read(client.messages.create(**msg(f"q{i}", stream=True)))


def sync_beta_messages_create_stream(client: Any, i: int) -> Collected:
    return _read(client.beta.messages.create(**msg(f"q{i}", stream=True)))


SYNC: list[tuple[str, SyncScenario]] = [
    ("openai", sync_chat_create),
    ("openai", sync_chat_create_stream),
    ("openai", sync_chat_stream_helper),
    ("openai", sync_responses_create_stream),
    ("openai", sync_responses_stream_helper),
    ("anthropic", sync_messages_create_stream),
    ("anthropic", sync_beta_messages_create_stream),
]


def _sync_client(sdk: str, url: str) -> Any:
    if sdk == "openai":
        return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-simulated", max_retries=0)
    return anthropic.Anthropic(base_url=url, api_key="sk-ant-simulated", max_retries=0)


@pytest.mark.parametrize(
    ("sdk", "scenario"), SYNC, ids=lambda value: getattr(value, "__name__", value)
)
def test_wrapped_sync_objects_are_the_sdks(sdk: str, scenario: SyncScenario) -> None:
    # Real sockets and threads: the group is made full by count (max_items=2, a long
    # max_wait), so both calls share one request however the threads are scheduled.
    sim = SimulatedProvider(time_scale=0.02)
    with sim.serve() as url, _sync_client(sdk, url) as plain_client:
        plain = scenario(plain_client, 0)
        client = wrap(_sync_client(sdk, url), max_items=2, max_wait=30.0, packing="always")
        try:
            with ThreadPoolExecutor(2) as threads:
                wrapped = list(threads.map(lambda i: scenario(client, i), range(2)))
            stats = client.statistics()[_model(sdk)]
        finally:
            client.close()
    assert (stats.calls, stats.requests) == (2, 1)
    assert_the_sdks(plain, wrapped[0])


# -- what the parity stands for ------------------------------------------------------


@pytest.mark.anyio
async def test_a_coalesced_stream_has_its_own_response() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=2, packing="always") as client:

        async def one(i: int) -> tuple[Any, str]:
            stream = await client.chat.completions.create(**chat(f"s{i}", stream=True))
            assert not stream.response.is_closed
            async with stream:
                text = "".join([c.choices[0].delta.content or "" async for c in stream])
            return stream, text

        (first, text), (second, _) = await gather(2, one)
    assert text == sim.expected_output("s0", TEXT)
    response = first.response
    assert isinstance(first, openai.AsyncStream)
    assert response.status_code == 200
    assert response.is_closed  # read to the end, as the SDK's
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["x-request-id"].startswith("req_")
    assert response.headers["x-request-id"] != second.response.headers["x-request-id"]
    # Both came from the one packed reply, which the headers name.
    [request] = sim.requests
    assert request.items == 2
    assert response.headers["x-coalesce-reply-id"] == second.response.headers["x-coalesce-reply-id"]
    assert response.headers["x-coalesce-group-size"] == "2"
    assert str(response.request.url) == str(client.base_url).rstrip("/") + "/chat/completions"


# The SDK's own stream, closed before its end, closes its response and leaves its
# generators to the garbage collector (a plain client's does the same); trio warns then.
@pytest.mark.filterwarnings("ignore:Async generator .* garbage collected:ResourceWarning")
@pytest.mark.anyio
async def test_a_stream_closed_early_closes_its_response() -> None:
    sim = SimulatedProvider()
    async with wrap(sim.anthropic_client(max_retries=0), max_items=2, packing="always") as client:

        async def one(i: int) -> Any:
            stream = await client.messages.create(**msg(f"s{i}", stream=True))
            first = await stream.__anext__()
            assert first.type == "message_start"
            await stream.close()
            return stream

        streams = await gather(2, one)
    assert all(stream.response.is_closed for stream in streams)
    assert all(stream.response.headers["request-id"] for stream in streams)


@pytest.mark.anyio
async def test_the_sdks_stream_helpers_answer_each_caller() -> None:
    # chat.completions.stream (what LangChain's structured astream uses) and
    # responses.stream read the coalesced stream's response and give the caller's own
    # parsed answer.
    sim = SimulatedProvider()
    async with wrap(sim.openai_client(max_retries=0), max_items=4, packing="always") as client:

        async def chat_one(i: int) -> Any:
            async with client.chat.completions.stream(
                **chat(f"c{i}", response_format=Verdict)
            ) as stream:
                await stream.until_done()
                return (await stream.get_final_completion()).choices[0].message.parsed

        async def responses_one(i: int) -> Any:
            async with client.responses.stream(**_input(i, text_format=Verdict)) as stream:
                await stream.until_done()
                return (await stream.get_final_response()).output_parsed

        chats = await gather(4, chat_one)
        responses = await gather(4, responses_one)
    assert chats == [Verdict.model_validate(sim.expected_output(f"c{i}", SCHEMA)) for i in range(4)]
    assert responses == [
        Verdict.model_validate(sim.expected_output(f"q{i}", SCHEMA)) for i in range(4)
    ]
    assert [request.items for request in sim.requests] == [4, 4]


def test_a_sync_stream_is_the_sdks_over_http() -> None:
    sim = SimulatedProvider(time_scale=0.02)
    with sim.serve() as url:
        client = wrap(_sync_client("openai", url), max_items=2, max_wait=30.0, packing="always")
        try:

            def whole(i: int) -> tuple[Any, str]:
                with client.chat.completions.create(**chat(f"s{i}", stream=True)) as stream:
                    text = "".join(c.choices[0].delta.content or "" for c in stream)
                return stream, text

            def first(i: int) -> tuple[Any, Any]:
                stream = client.chat.completions.create(**chat(f"e{i}", stream=True))
                chunk = next(iter(stream))
                stream.close()  # stops reading; nothing else is disturbed
                return stream, chunk

            with ThreadPoolExecutor(2) as threads:
                results = list(threads.map(whole, range(2)))
                closed = list(threads.map(first, range(2)))
        finally:
            client.close()
    for i, (stream, text) in enumerate(results):
        assert type(stream) is openai.Stream
        assert text == sim.expected_output(f"s{i}", TEXT)
        assert stream.response.is_closed
        assert stream.response.headers["x-coalesce-group-size"] == "2"
    for stream, chunk in closed:
        assert chunk.choices[0].delta.role == "assistant"
        assert stream.response.is_closed
    assert [request.items for request in sim.requests] == [2, 2]
