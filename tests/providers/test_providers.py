"""The providers against the simulated OpenAI and Anthropic APIs, and their advice.

In process on virtual time (both backends); one round trip per provider over real
HTTP at the end, on the real clock.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any, Literal

import anthropic
import anyio
import httpx
import httpx2
import openai
import pytest
from pydantic import TypeAdapter

import coalesce.providers
from _providers import KINDS, DroppingTransport, close, make_provider
from coalesce._wire.packing import PackedRequest, pack_request, split_reply
from coalesce.providers import (
    AnthropicProvider,
    CallableProvider,
    Completion,
    CompletionRequest,
    OpenAICompatibleProvider,
    OpenAIProvider,
    Provider,
    RetryAdvice,
    Usage,
)
from coalesce.providers._anthropic import NONSTREAMING_MAX_TOKENS, finish_reason, nonstreaming_cap
from coalesce.providers._http import chat_url, retry_after, status_advice
from coalesce.testing import RateLimit, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

SCHEMA = TypeAdapter(Literal["pos", "neg"]).json_schema()
INPUTS = ["great film", "awful plot", "fine", "loved it", "meh", "never again"]


def packed_request(
    *, stream: bool = False, **options: Any
) -> tuple[CompletionRequest, PackedRequest]:
    packed = pack_request("Tag each review.", INPUTS, SCHEMA)
    request = CompletionRequest(
        model="gpt-4o-mini",
        system=packed.system,
        user=packed.user,
        reply_schema=packed.reply_schema,
        stream=stream,
        **options,
    )
    return request, packed


def assert_round_trip(completion: Completion, packed: PackedRequest) -> None:
    split = split_reply(completion.text, packed.ids, lambda value: value)
    assert split.values == {
        item_id: expected_output(item, SCHEMA)
        for item_id, item in zip(packed.ids, INPUTS, strict=True)
    }
    assert completion.finish_reason == "stop"
    assert not completion.truncated
    assert completion.usage is not None
    assert completion.usage.input_tokens > 0
    assert completion.usage.output_tokens > 0
    assert completion.seconds is not None
    assert completion.seconds > 0


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def provider(sim: SimulatedProvider, kind: str) -> AsyncIterator[Any]:
    provider = make_provider(sim, kind)
    yield provider
    await close(provider)


# -- round trips in process ------------------------------------------------------------


async def test_packed_request_comes_back_per_item(provider: Provider) -> None:
    request, packed = packed_request()
    completion = await provider.complete(request)
    assert_round_trip(completion, packed)
    assert completion.ttft is None
    assert isinstance(provider, Provider)


async def test_streaming_delivers_deltas(provider: Provider, sim: SimulatedProvider) -> None:
    request, packed = packed_request(stream=True)
    deltas: list[str] = []
    completion = await provider.complete(request, deltas.append)
    assert_round_trip(completion, packed)
    assert len(deltas) > 1
    assert "".join(deltas) == completion.text
    assert completion.ttft is not None
    assert completion.seconds is not None
    assert 0 < completion.ttft <= completion.seconds
    assert sim.requests[-1].stream


@pytest.mark.parametrize("stream", [False, True])
async def test_output_cap_truncates(provider: Provider, stream: bool) -> None:
    request, packed = packed_request(stream=stream, max_output_tokens=8)
    completion = await provider.complete(request)
    assert completion.finish_reason == "length"
    assert completion.truncated
    assert completion.usage is not None
    assert completion.usage.output_tokens == 8
    split = split_reply(completion.text, packed.ids, str, truncated=completion.truncated)
    assert len(split.values) < len(packed.ids)


async def test_headers_are_captured_lower_case(kind: str) -> None:
    sim = SimulatedProvider(rate_limits=RateLimit(requests_per_minute=100))
    provider = make_provider(sim, kind)
    request, _ = packed_request()
    completion = await provider.complete(request)
    await close(provider)
    assert all(name == name.lower() for name in completion.headers)
    assert completion.headers["content-type"].startswith("application/json")
    prefix = "anthropic-ratelimit-requests" if kind == "anthropic" else "x-ratelimit"
    assert (
        completion.headers[f"{prefix}-remaining{'' if kind == 'anthropic' else '-requests'}"]
        == "99"
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_plain_text_without_schema(provider: Provider, stream: bool) -> None:
    request = CompletionRequest(model="m", system="Answer.", user="hello", stream=stream)
    completion = await provider.complete(request)
    assert completion.text == expected_output("hello")
    assert completion.finish_reason == "stop"


async def test_options_pass_through_and_cap_is_sent(sim: SimulatedProvider, kind: str) -> None:
    provider = make_provider(sim, kind)
    options = {"metadata": {"user_id": "u1"}} if kind == "anthropic" else {"temperature": 0}
    request, _ = packed_request(max_output_tokens=3, options=options)
    completion = await provider.complete(request)
    await close(provider)
    assert completion.usage == Usage(completion.usage.input_tokens if completion.usage else 0, 3)


async def test_sdk_retries_are_switched_off_without_touching_the_client(
    sim: SimulatedProvider,
) -> None:
    oa, an = sim.openai_client(max_retries=5), sim.anthropic_client(max_retries=5)
    sim.inject("server_error", "server_error")
    request, _ = packed_request()
    with pytest.raises(openai.InternalServerError):
        await OpenAIProvider(oa).complete(request)
    with pytest.raises(anthropic.InternalServerError):
        await AnthropicProvider(an).complete(request)
    assert [r.status for r in sim.requests] == [500, 500]
    assert (oa.max_retries, an.max_retries) == (5, 5)


async def test_anthropic_sends_a_forced_tool_and_default_cap() -> None:
    provider = AnthropicProvider(anthropic.AsyncAnthropic(api_key="x"), default_max_tokens=100)
    request, packed = packed_request()
    args = provider.arguments(request)
    assert args["max_tokens"] == 100
    assert args["tool_choice"] == {"type": "tool", "name": "coalesce_results"}
    assert args["tools"][0]["input_schema"] == packed.reply_schema
    assert args["system"] == packed.system
    assert args["messages"] == [{"role": "user", "content": packed.user}]


async def test_anthropic_caps_a_packed_requests_tokens_where_the_sdk_demands_streaming(
    sim: SimulatedProvider,
) -> None:
    # Twenty callers' caps of 4,096 add up to 81,920: the SDK refuses that without
    # streaming (ValueError), so the packed request asks for the most it may.
    provider = AnthropicProvider(sim.anthropic_client())
    request, packed = packed_request(max_output_tokens=20 * 4096)
    assert provider.arguments(request)["max_tokens"] == NONSTREAMING_MAX_TOKENS == 21_333
    assert_round_trip(await provider.complete(request), packed)
    assert [r.status for r in sim.requests] == [200]
    streamed, _ = packed_request(max_output_tokens=20 * 4096, stream=True)
    assert provider.arguments(streamed)["max_tokens"] == 20 * 4096  # streaming may ask more
    opus, _ = packed_request(max_output_tokens=20 * 4096)
    opus = dataclasses.replace(opus, model="claude-opus-4-0")  # the SDK's own, lower limit
    assert provider.arguments(opus)["max_tokens"] == nonstreaming_cap("claude-opus-4-0") < 21_333


async def test_openai_sends_a_strict_schema() -> None:
    provider = OpenAIProvider(openai.AsyncOpenAI(api_key="x"))
    request, _ = packed_request(max_output_tokens=50, stream=True)
    args = provider.arguments(request)
    spec = args["response_format"]["json_schema"]
    assert (spec["name"], spec["strict"]) == ("coalesce_results", True)
    assert spec["schema"]["additionalProperties"] is False
    assert args["max_completion_tokens"] == 50
    assert args["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_posts_what_create_would(stream: bool) -> None:
    # The packed request skips create()'s transform of its body, not what create()
    # sends: the same URL, headers (the bearer key: create() asks for it alone), query
    # and body.
    sent: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        if stream:
            return httpx2.Response(200, text="data: [DONE]\n\n")
        message = {"role": "assistant", "content": "hi"}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        reply = {"id": "c1", "created": 7, "model": "m", "choices": [choice], "usage": usage}
        return httpx2.Response(200, json={**reply, "system_fingerprint": None})

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    client = openai.AsyncOpenAI(api_key="sk", admin_api_key="admin", http_client=http)
    provider = OpenAIProvider(client)
    request, _ = packed_request(max_output_tokens=50, stream=stream)
    extra = {"extra_headers": {"x-a": "1"}, "extra_query": {"q": "2"}, "timeout": 9.0}
    unsent = {"top_p": openai.NOT_GIVEN, "seed": openai.omit}
    request = dataclasses.replace(request, options={"temperature": 0, **unsent, **extra})
    completion = await provider.complete(request)
    await client.chat.completions.with_raw_response.create(**provider.arguments(request))
    ours, theirs = sent
    assert (ours.url, ours.headers, ours.extensions) == (
        theirs.url,
        theirs.headers,
        theirs.extensions,
    )
    assert json.loads(ours.content) == json.loads(theirs.content)
    assert ours.headers["authorization"] == "Bearer sk"
    admin = openai.AsyncOpenAI(api_key="", admin_api_key="admin", http_client=http)
    with pytest.raises(TypeError, match="authentication"):  # create() refuses it: so do we
        await admin.chat.completions.create(**provider.arguments(request))
    with pytest.raises(TypeError, match="authentication"):
        await OpenAIProvider(admin).complete(request)
    if not stream:
        assert (completion.text, completion.finish_reason) == ("hi", "length")
        assert completion.usage == Usage(3, 1)
        assert completion.reply == {"id": "c1", "created": 7, "model": "m"}


async def test_anthropic_prose_instead_of_the_tool_is_returned_as_text(
    sim: SimulatedProvider,
) -> None:
    sim.inject("prose")
    request, packed = packed_request()
    completion = await AnthropicProvider(sim.anthropic_client()).complete(request)
    assert split_reply(completion.text, packed.ids, str).values


async def test_compatible_error_carries_the_body(sim: SimulatedProvider) -> None:
    provider = make_provider(sim, "compatible")
    request, _ = packed_request(max_output_tokens=0)
    with pytest.raises(httpx.HTTPStatusError, match="max_tokens") as caught:
        await provider.complete(request)
    assert caught.value.response.status_code == 400
    assert not provider.advise(caught.value).retry


async def test_compatible_unstructured_sends_no_response_format(sim: SimulatedProvider) -> None:
    client = httpx.AsyncClient(transport=DroppingTransport(app=sim))
    provider = OpenAICompatibleProvider("http://sim.test", structured=False, http_client=client)
    request, _ = packed_request()
    completion = await provider.complete(request)
    await provider.aclose()  # not its client: still usable
    assert not client.is_closed
    await client.aclose()
    assert not provider.structured
    assert json.loads(completion.text)["results"]  # no schema: free-form outputs


async def test_compatible_closes_the_client_it_made() -> None:
    async with OpenAICompatibleProvider("http://localhost:1") as provider:
        client = provider._client
    assert client.is_closed
    assert "localhost:1/v1/chat/completions" in repr(provider)


# -- the callable provider -------------------------------------------------------------


async def test_callable_provider_wraps_text_and_completions() -> None:
    async def answer(request: CompletionRequest) -> str | Completion:
        if request.user == "full":
            return Completion("x", "length", Usage(1, 2))
        return request.user.upper()

    provider = CallableProvider(answer, structured=True)
    deltas: list[str] = []
    text = await provider.complete(CompletionRequest("m", "s", "hi", stream=True), deltas.append)
    full = await provider.complete(CompletionRequest("m", "s", "full"))
    assert (text.text, text.finish_reason, deltas) == ("HI", "stop", ["HI"])
    assert full == Completion("x", "length", Usage(1, 2))
    assert provider.structured
    assert isinstance(provider, Provider)


def test_callable_advice() -> None:
    async def fn(request: CompletionRequest) -> str:
        return ""

    assert CallableProvider(fn).advise(ConnectionError()) == RetryAdvice(retry=False)
    flaky = CallableProvider(fn, retry_on=(ConnectionError,))
    assert flaky.advise(ConnectionResetError()).retry
    assert not flaky.advise(ValueError()).retry


# -- advice, from constructed exceptions -----------------------------------------------


def _response2(status: int, headers: dict[str, str] | None = None) -> httpx2.Response:
    request = httpx2.Request("POST", "https://api.test/v1/chat/completions")
    return httpx2.Response(status, headers=headers or {}, request=request)


@functools.cache
def _sdk_provider(module: Any) -> Any:
    """One provider per SDK for the advice tests (making SDK clients is slow)."""
    if module is openai:
        return OpenAIProvider(openai.AsyncOpenAI(api_key="x"))
    return AnthropicProvider(anthropic.AsyncAnthropic(api_key="x"))


def _sdk_status_error(module: Any, status: int, headers: dict[str, str] | None = None) -> Any:
    response = _response2(status, headers)
    client = _sdk_provider(module)._client
    return client._make_status_error(f"error {status}", body=None, response=response)


ADVICE = [
    (429, {"retry-after": "3"}, RetryAdvice(True, 3.0)),
    (429, {"Retry-After": "3", "X-RateLimit-Remaining-Requests": "0"}, RetryAdvice(True, 3.0)),
    (429, {"retry-after-ms": "1500", "retry-after": "2"}, RetryAdvice(True, 1.5)),
    (429, {}, RetryAdvice(True, None)),
    (500, {}, RetryAdvice(True)),
    (503, {"retry-after": "7"}, RetryAdvice(True, 7.0)),
    (529, {}, RetryAdvice(True)),
    (408, {}, RetryAdvice(True)),
    (409, {}, RetryAdvice(True)),
    (400, {}, RetryAdvice(False)),
    (401, {}, RetryAdvice(False)),
    (404, {}, RetryAdvice(False)),
    (422, {}, RetryAdvice(False)),
    (400, {"x-should-retry": "true"}, RetryAdvice(True)),
    (500, {"x-should-retry": "false"}, RetryAdvice(False)),
]


@pytest.mark.parametrize(("status", "headers", "advice"), ADVICE)
@pytest.mark.parametrize("module", [openai, anthropic], ids=["openai", "anthropic"])
def test_sdk_status_advice(
    module: Any, status: int, headers: dict[str, str], advice: RetryAdvice
) -> None:
    error = _sdk_status_error(module, status, headers)
    assert isinstance(error, module.APIStatusError)
    assert _sdk_provider(module).advise(error) == _with_headers(advice, headers)


def _with_headers(advice: RetryAdvice, headers: dict[str, str]) -> RetryAdvice:
    """``advice`` carrying the error response's headers, as every provider reports them."""
    return dataclasses.replace(advice, headers={k.lower(): v for k, v in headers.items()})


@pytest.mark.parametrize("module", [openai, anthropic], ids=["openai", "anthropic"])
def test_sdk_transport_and_other_advice(module: Any) -> None:
    provider = _sdk_provider(module)
    request = httpx2.Request("POST", "https://api.test/")
    assert provider.advise(module.APITimeoutError(request=request)) == RetryAdvice(True)
    assert provider.advise(module.APIConnectionError(request=request)) == RetryAdvice(True)
    invalid = module.APIResponseValidationError(response=_response2(200), body=None)
    assert provider.advise(invalid) == RetryAdvice(False)
    assert provider.advise(ValueError("bad")) == RetryAdvice(False)
    assert provider.advise(httpx2.ConnectError("down")) == RetryAdvice(False)  # not ours


@pytest.mark.parametrize(("status", "headers", "advice"), ADVICE)
def test_compatible_status_advice(
    status: int, headers: dict[str, str], advice: RetryAdvice
) -> None:
    request = httpx.Request("POST", "http://local/v1/chat/completions")
    response = httpx.Response(status, headers=headers, request=request)
    error = httpx.HTTPStatusError("x", request=request, response=response)
    assert OpenAICompatibleProvider("http://local").advise(error) == _with_headers(advice, headers)


def test_compatible_transport_advice() -> None:
    provider = OpenAICompatibleProvider("http://local")
    request = httpx.Request("POST", "http://local/")
    for retryable in (
        httpx.ReadTimeout("slow", request=request),
        httpx.ConnectTimeout("slow", request=request),
        httpx.ConnectError("refused", request=request),
        httpx.RemoteProtocolError("dropped", request=request),
        httpx.ReadError("reset", request=request),
    ):
        assert provider.advise(retryable) == RetryAdvice(True), retryable
    for final in (httpx.UnsupportedProtocol("ftp", request=request), ValueError(), KeyError()):
        assert provider.advise(final) == RetryAdvice(False), final


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "nope", "retry-after": "4"}, 4.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "inf"}, None),
        ({}, None),
    ],
)
def test_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers) == seconds


def test_status_advice_ignores_retry_after_on_final_errors() -> None:
    advice = status_advice(400, {"Retry-After": "3"})
    assert advice == RetryAdvice(False, None, headers={"retry-after": "3"})


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://h:8000", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1/", "http://h:8000/v1/chat/completions"),
        ("https://h/api/openai/v2", "https://h/api/openai/v2/chat/completions"),
        ("http://h/v1/chat/completions", "http://h/v1/chat/completions"),
        ("http://h/ollama", "http://h/ollama/v1/chat/completions"),
    ],
)
def test_chat_url(base: str, url: str) -> None:
    assert chat_url(base) == url


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("tool_use", "stop"),
        ("stop_sequence", "stop"),
        (None, "stop"),
        ("max_tokens", "length"),
        ("refusal", "refusal"),
    ],
)
def test_anthropic_finish_reason(stop: str | None, finish: str) -> None:
    assert finish_reason(stop) == finish


# -- the package -----------------------------------------------------------------------


def test_all_is_sorted_and_importable() -> None:
    names = coalesce.providers.__all__
    assert list(names) == sorted(set(names))
    for name in names:
        assert hasattr(coalesce.providers, name), name


def test_importing_providers_imports_no_sdk() -> None:
    code = (
        "import sys, coalesce.providers, coalesce._engine.retry; "
        "print(sorted(m for m in ('openai', 'anthropic', 'httpx2') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- over real HTTP --------------------------------------------------------------------


class TestOverHTTP:
    """One round trip per provider through uvicorn on 127.0.0.1, on the real clock."""

    @pytest.fixture
    def anyio_backend(self, real_time_backend: Any) -> Any:
        return real_time_backend

    async def test_round_trip(self, kind: str) -> None:
        stream = True
        sim = SimulatedProvider(time_scale=0.001)
        async with sim.serve_async() as url:
            provider = make_provider(sim, kind, url)
            request, packed = packed_request(stream=stream)
            deltas: list[str] = []
            with anyio.fail_after(10):
                completion = await provider.complete(request, deltas.append)
            await close(provider)
        assert_round_trip(completion, packed)
        assert completion.headers
        if stream:
            assert len(deltas) > 1
            assert "".join(deltas) == completion.text
