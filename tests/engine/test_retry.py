"""Retrying provider requests: the pure decisions, then real faults from the simulator.

Faults run in process on virtual time (both backends), so waits are asserted exactly;
the hang past an SDK timeout runs over real HTTP.
"""

from __future__ import annotations

import random
from typing import Any

import anthropic
import anyio
import anyio.lowlevel
import httpx
import openai
import pytest

import coalesce
from _providers import KINDS, close, make_provider
from coalesce import ConfigurationError
from coalesce._calls import Retry
from coalesce._engine.retry import (
    backoff_delay,
    complete_with_retries,
    next_wait,
)
from coalesce.providers import (
    CallableProvider,
    Completion,
    CompletionRequest,
    OpenAICompatibleProvider,
    OpenAIProvider,
    RetryAdvice,
)
from coalesce.testing import FaultPlan, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

REQUEST = CompletionRequest(model="m", system="Answer.", user="hello")
CONNECTION_ERRORS = {
    "openai": openai.APIConnectionError,
    "anthropic": anthropic.APIConnectionError,
    "compatible": httpx.TransportError,
}
STATUS_ERRORS = {
    "openai": openai.APIStatusError,
    "anthropic": anthropic.APIStatusError,
    "compatible": httpx.HTTPStatusError,
}


def _status(error: BaseException) -> int:
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code
    status: int = error.status_code  # type: ignore[attr-defined]
    return status


# -- pure decisions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "unit", "delay"),
    [
        (1, 0.0, 0.25),
        (1, 0.999999, 0.5),
        (2, 0.0, 0.5),
        (3, 0.5, 1.5),
        (5, 0.0, 4.0),
        (9, 0.0, 4.0),
    ],
)
def test_backoff_delay(attempt: int, unit: float, delay: float) -> None:
    assert backoff_delay(attempt, unit) == pytest.approx(delay, abs=1e-5)


def test_backoff_is_capped() -> None:
    assert max(backoff_delay(n, 0.999999) for n in range(1, 40)) <= 8.0


def test_next_wait() -> None:
    retry = RetryAdvice(retry=True)
    assert next_wait(1, RetryAdvice(retry=False), 0.0, 0.0, None) is None
    assert next_wait(1, retry, 0.0, 10.0, None) == 0.25
    assert next_wait(1, RetryAdvice(True, after=3.0), 0.0, 10.0, None) == 3.0
    assert next_wait(1, RetryAdvice(True, after=3.0), 0.0, 10.0, 13.5) == 3.0
    assert next_wait(1, RetryAdvice(True, after=3.0), 0.0, 10.0, 13.0) is None
    assert next_wait(2, retry, 0.0, 10.0, 10.4) is None


async def test_bad_arguments() -> None:
    provider = CallableProvider(_echo)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        await complete_with_retries(provider, REQUEST, max_attempts=0)
    with pytest.raises(ConfigurationError, match="attempt_timeout"):
        await complete_with_retries(provider, REQUEST, attempt_timeout=0)


# -- against the simulator -------------------------------------------------------------


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider()


@pytest.fixture(params=KINDS)
async def provider(sim: SimulatedProvider, request: pytest.FixtureRequest) -> Any:
    provider = make_provider(sim, str(request.param))
    yield provider
    await close(provider)


@pytest.mark.parametrize(
    ("fault", "status", "stream"),
    [
        ("rate_limit", 429, False),
        ("server_error", 500, True),
        ("unavailable", 503, False),
        ("disconnect", 200, False),
        ("disconnect", 200, True),
    ],
)
async def test_fault_is_retried(
    sim: SimulatedProvider, provider: Any, fault: str, status: int, stream: bool
) -> None:
    sim.inject(fault)
    events: list[Retry] = []
    request = CompletionRequest(model="m", system="Answer.", user="hello", stream=stream)
    start = anyio.current_time()
    completion = await complete_with_retries(
        provider, request, on_retry=events.append, rng=random.Random(0)
    )
    assert completion.text == expected_output("hello")
    assert sim.requests[0].faults == (fault,)
    assert [r.status for r in sim.requests][1:] == [200]
    (event,) = events
    assert event.attempt == 1
    if fault == "rate_limit":
        assert event.delay == 1.0  # retry-after-ms from the 429
        assert anyio.current_time() - start > 1.0
    else:
        assert 0.25 <= event.delay <= 0.5  # first backoff step
    if fault != "disconnect":
        assert _status(event.error) == status


async def test_bad_request_is_not_retried(sim: SimulatedProvider, provider: Any) -> None:
    kind = _kind(provider)
    request = CompletionRequest(model="m", system="s", user="u", max_output_tokens=0)
    events: list[Retry] = []
    with pytest.raises(STATUS_ERRORS[kind]) as caught:
        await complete_with_retries(provider, request, on_retry=events.append)
    assert _status(caught.value) == 400
    assert events == []  # (the simulator logs no request it could not parse)


async def test_attempts_are_bounded(sim: SimulatedProvider, provider: Any) -> None:
    sim.inject(*["server_error"] * 5)
    events: list[Retry] = []
    with pytest.raises(Exception) as caught:  # noqa: PT011 - each provider's own type
        await complete_with_retries(provider, REQUEST, max_attempts=3, on_retry=events.append)
    assert _status(caught.value) == 500
    assert type(caught.value).__module__.split(".")[0] in ("openai", "anthropic", "httpx")
    assert [r.status for r in sim.requests] == [500, 500, 500]
    assert [e.attempt for e in events] == [1, 2]


async def test_deadline_stops_retrying_and_reraises_the_sdk_error(sim: SimulatedProvider) -> None:
    provider = await _warm(OpenAIProvider(sim.openai_client(max_retries=2)))
    sim.inject("rate_limit", "rate_limit")
    deadline = anyio.current_time() + 0.5  # retry-after is 1 s: no time for another try
    with pytest.raises(openai.RateLimitError):
        await complete_with_retries(provider, REQUEST, deadline=deadline)
    assert [r.status for r in sim.requests] == [200, 429]  # nor did the SDK retry


async def test_deadline_allows_retries_that_fit(sim: SimulatedProvider) -> None:
    provider = await _warm(OpenAIProvider(sim.openai_client()))
    sim.inject("rate_limit")
    deadline = anyio.current_time() + 30
    completion = await complete_with_retries(provider, REQUEST, deadline=deadline)
    assert completion.text == expected_output("hello")
    assert [r.status for r in sim.requests] == [200, 429, 200]


async def test_deadline_does_not_cut_a_running_attempt() -> None:
    # A budget is a planning target: a reply that comes a little late still answers
    # every caller of the request; only the client's timeout stops a hang.
    sim = SimulatedProvider(faults=FaultPlan(script=["hang"], hang_seconds=100))
    provider = OpenAIProvider(sim.openai_client())
    start = anyio.current_time()
    completion = await complete_with_retries(provider, REQUEST, deadline=start + 5)
    assert completion.text == expected_output("hello")
    assert anyio.current_time() - start >= 100 * sim.time_scale


async def test_hang_is_cut_by_attempt_timeout_and_retried() -> None:
    sim = SimulatedProvider(faults=FaultPlan(script=["hang"], hang_seconds=100))
    provider = OpenAIProvider(sim.openai_client())
    events: list[Retry] = []
    completion = await complete_with_retries(
        provider,
        REQUEST,
        attempt_timeout=10,
        deadline=anyio.current_time() + 60,  # a budget leaves room for another attempt
        on_retry=events.append,
    )
    assert completion.text == expected_output("hello")
    assert isinstance(events[0].error, coalesce.RequestTimeoutError)
    assert [r.faults for r in sim.requests] == [("hang",), ()]


async def test_without_a_deadline_a_timed_out_attempt_is_not_retried() -> None:
    # The timeout is then the longest its callers wait.
    sim = SimulatedProvider(faults=FaultPlan(script=["hang"], hang_seconds=100))
    provider = OpenAIProvider(sim.openai_client())
    started = anyio.current_time()
    with pytest.raises(coalesce.RequestTimeoutError, match="10 s timeout"):
        await complete_with_retries(provider, REQUEST, attempt_timeout=10)
    assert anyio.current_time() - started == pytest.approx(10, abs=0.01)
    assert len(sim.requests) == 1


async def test_last_attempt_timeout_raises_timeout_error() -> None:
    sim = SimulatedProvider(faults=FaultPlan(script=["hang", "hang"], hang_seconds=100))
    provider = OpenAIProvider(sim.openai_client())
    with pytest.raises(TimeoutError):
        await complete_with_retries(provider, REQUEST, attempt_timeout=10, max_attempts=2)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])  # httpx's ASGITransport buffers
async def test_partial_stream_is_not_retried(kind: str) -> None:
    sim = SimulatedProvider(output_tokens=300)
    provider = make_provider(sim, kind)
    sim.inject("disconnect")
    deltas: list[str] = []
    request = CompletionRequest(model="m", system="s", user="hello", stream=True)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - each provider's own type
        await complete_with_retries(provider, request, on_text=deltas.append)
    await close(provider)
    assert isinstance(caught.value, tuple(CONNECTION_ERRORS.values()))
    assert deltas  # the caller saw part of the reply: a second one must not follow
    assert len(sim.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_without_listener_is_retried(kind: str) -> None:
    sim = SimulatedProvider(output_tokens=300)
    provider = make_provider(sim, kind)
    sim.inject("disconnect")
    request = CompletionRequest(model="m", system="s", user="hello", stream=True)
    completion = await complete_with_retries(provider, request)
    await close(provider)
    assert completion.text == sim.expected_output("hello")
    assert len(sim.requests) == 2


async def test_callable_retry_on() -> None:
    calls: list[int] = []

    async def flaky(request: CompletionRequest) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("flaky")
        return "ok"

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    provider = CallableProvider(flaky, retry_on=(ConnectionError,))
    completion = await complete_with_retries(provider, REQUEST, rng=random.Random(1), sleep=sleep)
    assert completion == Completion("ok", "stop", seconds=0.0)
    assert len(calls) == 3
    unit = random.Random(1)
    assert slept == [backoff_delay(1, unit.random()), backoff_delay(2, unit.random())]


async def test_callable_without_retry_on_fails_at_once() -> None:
    calls: list[int] = []

    async def broken(request: CompletionRequest) -> str:
        calls.append(1)
        raise ConnectionResetError("down")

    with pytest.raises(ConnectionResetError):
        await complete_with_retries(CallableProvider(broken), REQUEST)
    assert len(calls) == 1


async def _warm(provider: OpenAIProvider) -> OpenAIProvider:
    """Send one request first: the SDK's first call waits for a worker thread (platform
    headers), and trio's autojumping clock would meanwhile jump to a test's deadline."""
    await provider.complete(REQUEST)
    return provider


def _kind(provider: Any) -> str:
    if isinstance(provider, OpenAICompatibleProvider):
        return "compatible"
    return "openai" if isinstance(provider, OpenAIProvider) else "anthropic"


async def _echo(request: CompletionRequest) -> str:
    return request.user


# -- over real HTTP: the SDK's own timeout -------------------------------------------------


class TestOverHTTP:
    @pytest.fixture
    def anyio_backend(self, real_time_backend: Any) -> Any:
        return real_time_backend

    @pytest.mark.parametrize("kind", KINDS)
    async def test_hang_past_the_client_timeout_is_retried(self, kind: str) -> None:
        sim = SimulatedProvider(
            time_scale=0.001, faults=FaultPlan(script=["hang"], hang_seconds=60_000)
        )
        async with sim.serve_async() as url:
            if kind == "openai":
                provider: Any = OpenAIProvider(sim.openai_client(url, timeout=0.2))
            elif kind == "anthropic":
                provider = make_provider(sim, kind, url)
                provider._client = provider._client.with_options(timeout=0.2)
            else:
                provider = OpenAICompatibleProvider(url, timeout=0.2)
            events: list[Retry] = []
            with anyio.fail_after(10):
                completion = await complete_with_retries(
                    provider, REQUEST, on_retry=events.append, sleep=_no_sleep
                )
            await close(provider)
        assert completion.text == expected_output("hello")
        assert type(events[0].error).__name__ in ("APITimeoutError", "ReadTimeout")

    async def test_partial_stream_is_not_retried(self) -> None:
        sim = SimulatedProvider(time_scale=0.001, output_tokens=300)
        sim.inject("disconnect")
        deltas: list[str] = []
        request = CompletionRequest(model="m", system="s", user="hello", stream=True)
        async with sim.serve_async() as url, OpenAICompatibleProvider(url) as provider:
            with anyio.fail_after(10), pytest.raises(httpx.TransportError):
                await complete_with_retries(provider, request, on_text=deltas.append)
        assert deltas
        assert len(sim.requests) == 1


async def _no_sleep(seconds: float) -> None:
    await anyio.lowlevel.checkpoint()


# -- the last attempt goes alone (issue 24) ---------------------------------------------

#: Every packed reply loses an item (a plain call cannot).
LOSSY = {"missing_item": 0.5, "duplicate_id_wrong_first": 0.5}


def _tagger(sim: SimulatedProvider, events: list[Any], **options: Any) -> Any:
    @coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        packing="always",
        on_event=events.append,
        **options,
    )
    async def tag(ticket: str) -> dict[str, str]:
        """Tag the support ticket."""

    return tag


async def _answers(fn: Any, items: list[str], spacing: float = 0.0) -> list[Any]:
    out: list[Any] = [None] * len(items)

    async def one(index: int) -> None:
        await anyio.sleep(index * spacing)
        try:
            out[index] = await fn(items[index])
        except Exception as exc:
            out[index] = exc

    async with anyio.create_task_group() as tg:
        for index in range(len(items)):
            tg.start_soon(one, index)
    return out


def _requests(events: list[Any]) -> list[coalesce.RequestEvent]:
    return [e for e in events if isinstance(e, coalesce.RequestEvent)]


async def test_the_last_attempt_is_a_plain_call_of_one_item() -> None:
    # The first reply of 8 is cut half way; its lost items' second attempt is their
    # last (max_attempts=2): each alone, plain, all at once. Packed again, every reply
    # would lose one of them for good.
    sim = SimulatedProvider(faults=FaultPlan(script=["truncate"], probabilities=LOSSY))
    events: list[Any] = []
    tag = _tagger(sim, events, max_items=8, max_attempts=2, max_wait=1.0)
    items = [f"ticket {n}" for n in range(8)]
    answers = await _answers(tag, items)
    await tag.aclose()
    schema = {"type": "object", "additionalProperties": {"type": "string"}}
    assert answers == [sim.expected_output(item, schema) for item in items]
    last = [e for e in _requests(events) if e.attempt == 2]
    assert len(last) >= 3
    assert [(e.items, e.plain, e.reask) for e in last] == [(1, True, True)] * len(last)
    assert [r.items for r in sim.requests] == [8] + [1] * len(last)
    assert len({r.started_at for r in sim.requests[1:]}) == 1  # at once


async def test_an_item_is_asked_alone_only_on_its_last_attempt() -> None:
    # max_attempts=3: the second attempt of the cut reply's items is still packed.
    sim = SimulatedProvider(faults=FaultPlan(script=["truncate", None, None]))
    events: list[Any] = []
    tag = _tagger(sim, events, max_items=8, max_attempts=3, max_wait=1.0)
    await _answers(tag, [f"ticket {n}" for n in range(8)])
    await tag.aclose()
    second = [e for e in _requests(events) if e.attempt == 2]
    assert second
    assert all(not e.plain for e in second)
    assert not [e for e in _requests(events) if e.attempt == 3]


async def test_400_of_400_answered_through_prompt_under_reply_faults() -> None:
    faults = {
        "duplicate_id_wrong_first": 0.1,
        "duplicate_id": 0.1,
        "missing_item": 0.1,
        "extra_id": 0.1,
        "out_of_order": 0.1,
    }
    sim = SimulatedProvider(faults=FaultPlan(probabilities=faults, seed=3))
    events: list[Any] = []
    tag = _tagger(sim, events, max_items=8)
    items = [f"ticket {n}" for n in range(400)]
    answers = await _answers(tag, items, spacing=0.01)
    await tag.aclose()
    schema = {"type": "object", "additionalProperties": {"type": "string"}}
    assert answers == [sim.expected_output(item, schema) for item in items]
    assert sim.statistics().faults > 25
    assert all(e.items == 1 and e.plain for e in _requests(events) if e.attempt == 4)
