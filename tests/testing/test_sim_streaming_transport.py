"""The in-process transport streams: chunks reach the client when the app sends them.

Runs on virtual time (both backends), through the official SDKs and through a bare
``httpx2`` client with hand-written ASGI apps.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import anthropic
import anyio
import httpx2
import openai
import pytest
from starlette.types import Message, Receive, Scope, Send

from coalesce.testing import (
    LatencyProfile,
    SimulatedLatency,
    SimulatedProvider,
    compute_delays,
    expected_output,
)
from coalesce.testing._inprocess import SimulatedTransport

pytestmark = pytest.mark.anyio

PROFILE = LatencyProfile(ttft=0.5, prompt_token_seconds=0.001, tokens_per_second=50)
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-3-5-haiku-latest"

# The openai SDK stops reading its SSE generators at [DONE] without closing them;
# trio warns when such a generator is collected. Nothing the transport can change.
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(
        latency=SimulatedLatency(default=PROFILE), time_scale=1.0, output_tokens=100
    )


def _assert_paced(sim: SimulatedProvider, start: float, times: list[float]) -> None:
    """Chunks arrived one by one, from the first token to the end of decoding."""
    record = sim.requests[-1]
    delays = compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens)
    assert times == sorted(times)
    assert times[0] < times[-1]
    assert len(set(times)) > 20  # not one burst: many distinct arrival times
    assert times[0] - start == pytest.approx(delays.first_token)
    # looptime rounds each of the many chunk sleeps to the microsecond
    assert times[-1] - start == pytest.approx(delays.total, abs=1e-3)


# ------------------------------------------------------------------------ openai


@SDK_STREAMS
async def test_openai_stream_arrives_chunk_by_chunk(sim: SimulatedProvider) -> None:
    async with sim.openai_client(max_retries=0) as client:
        start = anyio.current_time()
        stream = await client.chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": "long"}], stream=True
        )
        # The response is returned at its start, before the first token.
        assert anyio.current_time() == start
        times, text = [], ""
        async for chunk in stream:
            times.append(anyio.current_time())
            text += chunk.choices[0].delta.content or ""
    assert text.startswith(expected_output("long"))
    _assert_paced(sim, start, times)


async def test_openai_non_streamed_reply(sim: SimulatedProvider) -> None:
    async with sim.openai_client(max_retries=0) as client:
        start = anyio.current_time()
        reply = await client.chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": "short"}]
        )
    record = sim.requests[-1]
    assert (record.status, record.stream) == (200, False)
    assert (reply.choices[0].message.content or "").startswith(expected_output("short"))
    delays = compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens)
    assert anyio.current_time() - start == pytest.approx(delays.total)


@SDK_STREAMS
async def test_openai_connection_dropped_mid_stream(sim: SimulatedProvider) -> None:
    sim.inject("disconnect")
    received: list[float] = []

    async def read(stream: openai.AsyncStream[Any]) -> None:
        async for _ in stream:
            received.append(anyio.current_time())

    async with sim.openai_client(max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}], stream=True
        )
        with pytest.raises(openai.APIConnectionError):
            await read(stream)
    assert received  # the first half arrived before the drop
    assert sim.requests[-1].faults == ("disconnect",)


@SDK_STREAMS
async def test_openai_client_leaving_mid_stream_ends_the_app(sim: SimulatedProvider) -> None:
    async with sim.openai_client(max_retries=0) as client:
        start = anyio.current_time()
        stream = await client.chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": "long"}], stream=True
        )
        async with stream:
            async for _ in stream:
                break
        left = anyio.current_time()
        # The app has already ended (its request is logged) when the client left.
        (record,) = sim.requests
    delays = compute_delays(PROFILE, record.prompt_tokens, record.completion_tokens)
    assert left - start == pytest.approx(delays.first_token)
    assert record.finished_at == left
    # It ended at the first token, not after the whole answer: logged as the client leaving.
    assert (record.status, record.completion_tokens) == (499, 0)


@SDK_STREAMS
async def test_openai_client_cancelled_during_a_streamed_hang(sim: SimulatedProvider) -> None:
    sim.inject("hang")
    async with sim.openai_client(max_retries=0) as client:
        with anyio.move_on_after(5) as scope:
            await client.chat.completions.create(
                model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}], stream=True
            )
    assert scope.cancelled_caught
    (record,) = sim.requests
    assert (record.status, record.faults) == (499, ("hang",))


# --------------------------------------------------------------------- anthropic


async def test_anthropic_stream_arrives_chunk_by_chunk(sim: SimulatedProvider) -> None:
    async with sim.anthropic_client(max_retries=0) as client:
        start = anyio.current_time()
        times, text = [], ""
        async with client.messages.stream(
            model=ANTHROPIC_MODEL, max_tokens=500, messages=[{"role": "user", "content": "long"}]
        ) as stream:
            async for event in stream:
                times.append(anyio.current_time())
                if event.type == "text":
                    text += event.text
    assert text.startswith(expected_output("long"))
    _assert_paced(sim, start, times)


async def test_anthropic_non_streamed_reply(sim: SimulatedProvider) -> None:
    async with sim.anthropic_client(max_retries=0) as client:
        reply = await client.messages.create(
            model=ANTHROPIC_MODEL, max_tokens=500, messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.content[0].type == "text"
    assert reply.content[0].text.startswith(expected_output("hi"))
    assert sim.requests[-1].status == 200


async def test_anthropic_connection_dropped_mid_stream(sim: SimulatedProvider) -> None:
    # The anthropic SDK lets a transport error raised while reading a stream through
    # unwrapped up to 2.16 (over a real socket too); from 2.17 it is the SDK's own
    # connection error, as openai's is.
    sim.inject("disconnect")
    received: list[str] = []

    async def read() -> None:
        async with client.messages.stream(
            model=ANTHROPIC_MODEL, max_tokens=500, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            async for event in stream:
                received.append(event.type)

    async with sim.anthropic_client(max_retries=0) as client:
        dropped = (httpx2.RemoteProtocolError, anthropic.APIConnectionError)
        with pytest.raises(dropped, match="dropped mid-stream"):
            await read()
    assert received
    assert sim.requests[-1].faults == ("disconnect",)


async def test_anthropic_client_leaving_mid_stream_ends_the_app(sim: SimulatedProvider) -> None:
    async with sim.anthropic_client(max_retries=0) as client:
        async with client.messages.stream(
            model=ANTHROPIC_MODEL, max_tokens=500, messages=[{"role": "user", "content": "long"}]
        ) as stream:
            events = cast("AsyncGenerator[Any, None]", stream.__aiter__())
            async with contextlib.aclosing(events):  # trio warns about unclosed generators
                await anext(events)
        left = anyio.current_time()
        (record,) = sim.requests
    assert record.finished_at == left


# -------------------------------------------------------- the transport, bare apps


async def _body_chunks() -> AsyncIterator[bytes]:
    yield b"one,"
    yield b"two"


async def test_request_body_chunks_then_disconnect_only_when_the_client_leaves() -> None:
    received: list[Message] = []
    gone_at: list[float] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while not received or received[-1].get("more_body"):
            received.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        message = await receive()  # blocks until the client goes away
        gone_at.append(anyio.current_time())
        assert message == {"type": "http.disconnect"}

    async with (
        httpx2.AsyncClient(transport=SimulatedTransport(app), base_url="http://sim.test") as http,
        http.stream("POST", "/", content=_body_chunks()) as response,
    ):
        async with contextlib.aclosing(response.aiter_raw()) as chunks:
            assert await anext(chunks) == b"a"
            await anyio.sleep(7)
            assert not gone_at
        # Closing the reader closed the response: the app saw the client leave.
        assert gone_at == [anyio.current_time()]
    assert [(m["body"], m["more_body"]) for m in received] == [
        (b"one,", True),
        (b"two", True),
        (b"", False),
    ]


async def test_scope_matches_the_asgi_transport() -> None:
    scopes: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with httpx2.AsyncClient(transport=SimulatedTransport(app)) as http:
        response = await http.get("http://sim.test:8080/a/b?c=d")
    assert response.status_code == 204
    (scope,) = scopes
    assert scope["path"] == "/a/b"
    assert scope["raw_path"] == b"/a/b"
    assert scope["query_string"] == b"c=d"
    assert scope["server"] == ("sim.test", 8080)
    assert (scope["client"], scope["root_path"]) == (("127.0.0.1", 123), "")
    assert (scope["type"], scope["method"], scope["scheme"]) == ("http", "GET", "http")


async def _fail_after_start(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"half", "more_body": True})
    raise ValueError("broken app")


async def _fail_before_start(scope: Scope, receive: Receive, send: Send) -> None:
    raise ValueError("broken app")


async def _no_response(scope: Scope, receive: Receive, send: Send) -> None:
    pass


async def test_app_failing_mid_response_is_a_dropped_connection() -> None:
    async with httpx2.AsyncClient(transport=SimulatedTransport(_fail_after_start)) as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="broken app") as info:
            await http.get("http://sim.test/")
    assert isinstance(info.value.__cause__, ValueError)


async def test_app_failing_before_its_response() -> None:
    async with httpx2.AsyncClient(transport=SimulatedTransport(_fail_before_start)) as http:
        with pytest.raises(ValueError, match="broken app"):
            await http.get("http://sim.test/")


async def test_app_returning_without_a_response() -> None:
    async with httpx2.AsyncClient(transport=SimulatedTransport(_no_response)) as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="without starting"):
            await http.get("http://sim.test/")


async def test_head_response_has_no_body() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ignored"})

    async with httpx2.AsyncClient(transport=SimulatedTransport(app)) as http:
        response = await http.head("http://sim.test/")
    assert (response.status_code, response.content) == (200, b"")


async def test_a_client_gone_before_its_request_is_read_gets_no_answer() -> None:
    """Nothing to answer and nothing to log (over HTTP, not an error in the server's log)."""
    sim = SimulatedProvider()
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    path = "/v1/chat/completions"
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json")], "scheme": "http",
        "server": ("sim.test", 80), "client": ("127.0.0.1", 1),
    }  # fmt: skip
    await sim(scope, receive, send)
    assert sent == []
    assert sim.requests == ()
