"""A provider that never answers frees its callers in time (issue 12, point 3).

On virtual time, on asyncio and trio: with a latency budget each caller is freed at
its own deadline; with ``timeout=`` each attempt is cut off after it (and retried
while a budget leaves room); with neither, after :data:`REQUEST_TIMEOUT`. Over real
HTTP the simulated provider's ``hang`` fault shows the same through the openai SDK.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

import coalesce
from coalesce._options import REQUEST_TIMEOUT
from coalesce.providers import Completion, CompletionRequest, RetryAdvice, Usage
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


class Label(BaseModel):
    label: str


class Hanging:
    """Never answers its first ``hangs`` requests (``-1``: never answers at all); then
    answers every item with its own text after 0.1 s."""

    name = "hanging"
    structured = True

    def __init__(self, hangs: int = -1) -> None:
        self.hangs = hangs
        self.requests = 0
        self.cancelled = 0

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        self.requests += 1
        if self.hangs < 0 or self.requests <= self.hangs:
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled += 1
        await anyio.sleep(0.1)
        if not request.user.startswith("["):
            return Completion(json.dumps({"label": request.user.strip('"')}), "stop")
        items = json.loads(request.user)
        results = {i["id"]: {"label": i["input"]} for i in items}
        return Completion(json.dumps({"results": results}), "stop", usage=Usage(10, 10))

    def advise(self, error: BaseException) -> RetryAdvice:
        return RetryAdvice(retry=False)


def tagger(provider: Any, **options: Any) -> Any:
    @coalesce.prompt(packing="always", client=provider, model="m", max_wait=0.05, **options)
    async def tag(text: str) -> Label:
        """Label the text with itself."""

    return tag


async def freed_after(tag: Any, texts: list[str], spacing: float = 0.0) -> list[Any]:
    """Per call: (seconds until it returned, its result or exception)."""
    out: list[Any] = [None] * len(texts)

    async def one(n: int) -> None:
        start = anyio.current_time()
        try:
            result: Any = (await tag(texts[n])).label
        except Exception as exc:
            result = exc
        out[n] = (anyio.current_time() - start, result)

    async with anyio.create_task_group() as tg:
        for n in range(len(texts)):
            tg.start_soon(one, n)
            await anyio.sleep(spacing)
    return out


async def test_with_a_budget_each_caller_is_freed_at_its_own_deadline() -> None:
    provider = Hanging()
    tag = tagger(provider, latency_budget=1.0)
    out = await freed_after(tag, [f"t{n}" for n in range(6)], spacing=0.02)
    for seconds, result in out:
        assert isinstance(result, coalesce.RequestTimeoutError)
        assert isinstance(result, TimeoutError)
        assert "1 s latency budget" in str(result)
        assert seconds <= 1.0 + 0.1
    await tag.aclose()
    assert provider.cancelled == provider.requests  # nobody waits: the requests stopped
    stats = tag.statistics()
    assert stats.calls_failed == 6
    assert stats.requests_in_flight == 0


async def test_without_a_budget_the_timeout_frees_the_callers() -> None:
    tag = tagger(Hanging(), timeout=2.0)
    out = await freed_after(tag, ["a", "b", "c"])
    for seconds, result in out:
        assert isinstance(result, coalesce.RequestTimeoutError)
        assert "2 s timeout" in str(result)
        assert seconds <= 2.0 + 0.1  # the window's 0.05 s, then the 2 s timeout


async def test_without_budget_or_timeout_the_default_timeout_applies() -> None:
    out = await freed_after(tagger(Hanging()), ["a", "b"])
    for seconds, result in out:
        assert isinstance(result, coalesce.RequestTimeoutError)
        assert REQUEST_TIMEOUT <= seconds <= REQUEST_TIMEOUT + 0.1


async def test_a_timed_out_attempt_is_retried_while_the_budget_allows() -> None:
    provider = Hanging(hangs=1)
    tag = tagger(provider, latency_budget=5.0, timeout=0.5)
    out = await freed_after(tag, ["a", "b", "c"])
    assert [result for _, result in out] == ["a", "b", "c"]
    # The window, the cut-off attempt, a backoff of at most 0.5 s, the answer.
    assert all(seconds <= 0.05 + 0.5 + 0.5 + 0.1 + 1e-6 for seconds, _ in out)
    assert provider.requests == 2


async def test_a_caller_that_was_answered_keeps_its_answer_when_the_rest_time_out() -> None:
    provider = Hanging(hangs=0)
    tag = tagger(provider, latency_budget=10.0)
    assert (await tag("early")).label == "early"
    provider.hangs = 99  # from now on it hangs
    out = await freed_after(tag, ["late"])
    assert isinstance(out[0][1], coalesce.RequestTimeoutError)


async def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(coalesce.ConfigurationError, match="timeout"):
        tagger(Hanging(), timeout=0)


class TestOverHTTP:
    """The simulated provider's ``hang`` fault, through the openai SDK over real HTTP.

    Real time (the server runs in a thread): only what each caller gets is asserted.
    """

    @pytest.fixture
    def anyio_backend(self, real_time_backend: tuple[str, dict[str, Any]]) -> Any:
        return real_time_backend

    async def test_a_hung_server_frees_its_callers_with_a_timeout_error(self) -> None:
        sim = SimulatedProvider(time_scale=0.01)
        sim.inject("hang", "hang", "hang")
        with sim.serve() as url:
            tag = tagger(sim.openai_client(url, max_retries=0), latency_budget=0.3)
            out = await freed_after(tag, ["a", "b", "c"])
        assert all(isinstance(result, coalesce.RequestTimeoutError) for _, result in out)


@pytest.mark.parametrize("configured", [600.0, 30.0])
def test_without_budget_or_timeout_the_clients_own_timeout_applies(configured: float) -> None:
    # A drop-in keeps what the client was configured with (AsyncOpenAI(timeout=600) for
    # a slow local server): coalesce's 60 s default must not cut its requests short.
    import openai

    from coalesce._engine.group import _attempt_timeout
    from coalesce._engine.spec import Options
    from coalesce.providers import OpenAIProvider

    provider = OpenAIProvider(openai.AsyncOpenAI(api_key="k", timeout=configured))
    assert provider.default_timeout == configured
    # The SDK enforces its own timeout (and its error is retried): no limit of ours.
    assert _attempt_timeout(Options(), math.inf, provider) is None
    assert _attempt_timeout(Options(timeout=5.0), math.inf, provider) == 5.0
    assert _attempt_timeout(Options(), 10.0, provider) is None  # the budget bounds it
    assert _attempt_timeout(Options(), math.inf, Hanging()) == REQUEST_TIMEOUT


async def test_a_timeout_says_how_much_was_spent_in_coalesces_queue() -> None:
    # One request at a time (max_concurrency=1), each hanging: the first call's request
    # holds the only slot, so the second waits in coalesce's queue until the first is
    # freed at its deadline; its own request then meets its deadline at once.
    tag = tagger(Hanging(), max_items=1, max_concurrency=1, latency_budget=1.0)
    out = await freed_after(tag, ["a", "b"], spacing=0.1)
    (_, first), (_, second) = out
    assert isinstance(first, coalesce.RequestTimeoutError)
    assert isinstance(second, coalesce.RequestTimeoutError)
    assert "the provider is slower than the budget allows" in str(first)
    assert "at the provider); most of it waiting in coalesce's own queue" in str(second)
    assert "max_concurrency=" in str(second)


async def test_a_call_queued_behind_max_concurrency_is_freed_at_its_deadline_unsent() -> None:
    # Three calls at once, one request at a time, each request hanging: the first holds
    # the only slot; the other two wait in the ready queue. Each is freed at its own
    # deadline with an error that says its request was never sent, and no request is
    # sent for it once its caller is gone.
    provider = Hanging()
    tag = tagger(provider, max_items=1, max_concurrency=1, latency_budget=1.0)
    out = await freed_after(tag, ["a", "b", "c"])
    for seconds, result in out:
        assert isinstance(result, coalesce.RequestTimeoutError)
        assert seconds <= 1.0 + 0.01
    queued = [result for _, result in out if "never sent" in str(result)]
    assert len(queued) == 2
    assert "all of it in coalesce's queue" in str(queued[0])
    assert "max_concurrency=" in str(queued[0])
    assert queued[0].seconds == pytest.approx(1.0, abs=0.01)
    await tag.aclose()
    assert provider.requests == 1
    stats = tag.statistics()
    assert stats.calls_failed == 3
    assert tag.batcher_statistics().queue_depth == 0


async def test_a_queued_call_whose_slot_frees_in_time_is_sent() -> None:
    # The first request answers after 0.1 s, well inside the budget: the queued calls
    # get the slot in turn and are answered; nothing is freed early.
    provider = Hanging(hangs=0)
    tag = tagger(provider, max_items=1, max_concurrency=1, latency_budget=1.0)
    out = await freed_after(tag, ["a", "b", "c"])
    assert sorted(result for _, result in out) == ["a", "b", "c"]
    assert provider.requests == 3
    await tag.aclose()


def test_a_re_asked_calls_timeout_counts_its_earlier_requests_as_the_providers() -> None:
    from coalesce._calls import Job
    from coalesce._engine.group import _timeout_error

    # Asked at 0.2 s after 0.1 s in a window, answered wrongly, asked again at 1.9 s:
    # freed at 2.1 s, it spent 0.1 s in the queue and 2.0 s over two requests.
    job = Job(item="a", key='"a"', deadline=2.1, arrival=0.0, budget=2.1)
    job.progress.attempts, job.progress.dispatched_at = 2, 0.1
    error = _timeout_error(job, now=2.1, sent_at=1.9)
    assert "0.10 s in coalesce's queue before its first request was sent" in str(error)
    assert "2.00 s over 2 requests at the provider" in str(error)
    assert "the provider is slower than the budget allows" in str(error)
    # A first request: the queue is what came before it was sent.
    job = Job(item="b", key='"b"', deadline=2.1, arrival=0.0, budget=2.1)
    job.progress.attempts, job.progress.dispatched_at = 1, 0.1
    error = _timeout_error(job, now=2.1, sent_at=1.6)
    assert "1.60 s in coalesce's queue before its request was sent, 0.50 s at" in str(error)
