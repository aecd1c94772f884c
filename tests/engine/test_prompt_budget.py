"""The latency budget sizes groups: tighter budgets give smaller groups, looser ones
larger, and a budget that cannot be met is reported. Simulated provider in process,
on virtual time, calls arriving every 10 ms."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

import coalesce
from coalesce._engine.spec import Options
from coalesce._planning.planner import PlanLimits
from coalesce._planning.state import Planning
from coalesce._planning.tokens import estimator_for
from coalesce.providers import CallableProvider, Completion, CompletionRequest, Usage
from coalesce.testing import LatencyModel, LatencyProfile, SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    # Token counts for gpt-4o-mini fall back to the bundled cl100k_base offline.
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]


class Tag(BaseModel):
    label: Literal["billing", "bug", "other"]


def provider() -> SimulatedProvider:
    profile = LatencyProfile(ttft=0.35, prompt_token_seconds=0.0001, tokens_per_second=80)
    return SimulatedProvider(latency=LatencyModel(default=profile), output_tokens=20)


async def run(
    budget: float, calls: int = 200, **options: Any
) -> tuple[SimulatedProvider, Any, list[float]]:
    sim = provider()

    @coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        latency_budget=budget,
        max_wait=0.5,
        max_items=64,
        **options,
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket."""

    latencies: list[float] = []

    async def one(n: int) -> None:
        start = anyio.current_time()
        try:
            await tag(f"ticket {n}: something is wrong with my account")
        except coalesce.RequestTimeoutError:  # freed at its deadline: counted as late
            latencies.append(math.inf)
        else:
            latencies.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        for n in range(calls):
            tg.start_soon(one, n)
            await anyio.sleep(0.01)
    await tag.aclose()
    return sim, tag.batcher_statistics(), latencies


async def test_tighter_budgets_give_smaller_groups() -> None:
    sizes = {}
    # A declared prior close to the provider keeps the cold start short, so the sizes
    # reflect the budgets rather than the first calls sent alone.
    prior = coalesce.LatencyPrior(overhead=0.4, prefill_per_token=1e-4, decode_per_token=1 / 80)
    for budget in (1.0, 1.5, 2.0):  # below the slow start's cap of 8 items
        _sim, stats, latencies = await run(budget, latency_prior=prior)
        sizes[budget] = stats.mean_batch_size
        late = [t for t in latencies[50:] if t > budget]  # after the model has learned
        assert len(late) <= 0.01 * len(latencies[50:]), (budget, sorted(latencies)[-5:])
    assert sizes[1.0] < sizes[1.5] < sizes[2.0], sizes


async def test_an_unmeetable_budget_is_reported_not_silently_missed() -> None:
    _sim, stats, latencies = await run(0.2, calls=20)
    assert stats.dispatch_reasons["solo"] == 20
    assert stats.mean_batch_size == 1
    # Nobody waits past the budget: each caller is freed at its deadline, with an error.
    assert latencies == [math.inf] * 20


async def test_an_explicit_timeout_lets_calls_outlive_their_budget() -> None:
    _sim, stats, latencies = await run(0.2, calls=5, timeout=10.0)
    assert stats.dispatch_reasons["solo"] == 5
    assert all(0.2 < t < 10.0 for t in latencies), latencies


async def test_per_call_budget_override() -> None:
    sim = provider()

    @coalesce.prompt(
        client=sim.openai_client(max_retries=0), model="gpt-4o-mini", latency_budget=5.0
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket."""

    with coalesce.latency_budget(0.2), pytest.raises(coalesce.RequestTimeoutError, match=r"0\.2 s"):
        await tag("urgent")
    assert tag.batcher_statistics().dispatch_reasons["solo"] == 1
    assert tag.statistics().unmeetable_budgets == 1
    with (
        pytest.raises(coalesce.ConfigurationError, match="latency_budget"),
        coalesce.latency_budget(-1),
    ):
        pass


async def _grouped_under(rate_limits: Any) -> tuple[float, int]:
    profile = LatencyProfile(ttft=0.35, prompt_token_seconds=0.0001, tokens_per_second=80)
    sim = SimulatedProvider(
        latency=LatencyModel(default=profile), output_tokens=20, rate_limits=rate_limits
    )

    @coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        latency_budget=20.0,
        max_wait=0.05,
        max_items=64,
        max_retries=8,
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket."""

    async with anyio.create_task_group() as tg:
        for n in range(150):
            tg.start_soon(tag, f"ticket {n}")
            await anyio.sleep(0.05)
    await tag.aclose()
    return tag.batcher_statistics().mean_batch_size, sim.statistics().rate_limited


async def test_when_requests_per_minute_bind_groups_grow_within_budget() -> None:
    from coalesce.testing import RateLimit

    free_size, _ = await _grouped_under(None)
    bound_size, refused = await _grouped_under(RateLimit(requests_per_minute=40))
    assert bound_size > 2 * free_size, (free_size, bound_size)
    assert refused <= 3


def test_a_reask_is_refused_when_tokens_bind_and_it_cannot_be_on_time() -> None:
    from coalesce._planning.planner import PlanItem

    planning = Planning(
        PlanLimits(max_items=8, shared_tokens=300), 20, None, estimator_for("gpt-4")
    )
    item = PlanItem(input_tokens=30, output_tokens=20, deadline=10.0, arrival=0.0)
    assert planning.may_reask([item], deadline=10.0, now=0.0)  # no quota known yet
    for n in range(5):  # a pace that spends the token quota before it resets
        reply = Completion("{}", "stop", usage=Usage(4000, 1000), seconds=1.0)
        planning.learn(reply, 1, None, now=n * 0.1)
    planning.read_quota(
        {"x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "30s"}, now=0.5
    )
    assert not planning.may_reask([item], deadline=10.0, now=0.5)
    assert planning.may_reask([item], deadline=60.0, now=0.5)


async def test_a_custom_token_estimator_and_wait_times_in_statistics() -> None:
    counted: list[str] = []

    class Words:
        def count(self, text: str) -> int:
            counted.append(text)
            return len(text.split())

    sim = provider()

    @coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        latency_budget=5.0,
        max_wait=0.25,
        token_estimator=Words(),
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket with its category: billing for invoices, charges,
        refunds and plans; bug for anything in the product that fails or misbehaves;
        account for sign-in, passwords, users and settings; other for the rest."""

    # Instructions long enough for packing to pay: the lone call waits for company (a
    # call that no group could pay for would go at once).
    await tag("the app crashes")
    assert any("the app crashes" in text for text in counted)
    stats = tag.statistics()
    assert stats.wait_p50 == pytest.approx(0.25)
    with pytest.raises(coalesce.ConfigurationError, match="token_estimator"):

        @coalesce.prompt(
            client=sim.openai_client(), model="m", latency_budget=1.0, token_estimator=object()
        )
        async def bad(ticket: str) -> Tag:
            """Tag."""


async def test_a_provider_that_cannot_stream_is_planned_as_whole_replies() -> None:
    async def answer(request: CompletionRequest) -> str:
        await anyio.sleep(0.5)  # one piece, at the end
        if not request.user.startswith("["):
            return json.dumps({"label": "bug"})  # a group of one, asked as a plain call
        ids = [item["id"] for item in json.loads(request.user)]
        return json.dumps({"results": {i: {"label": "bug"} for i in ids}})

    @coalesce.prompt(
        client=CallableProvider(answer, structured=True),
        model="gpt-4o-mini",
        latency_budget=5.0,
        max_wait=0.5,
        schema_enforced=True,  # streamed answers would be handed over early...
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket."""

    planning = tag._engine.planning
    assert planning is not None
    assert planning.limits.streaming
    assert (await tag("first")).label == "bug"
    # The reply came whole: every member of a group now waits for all of it.
    assert not planning.limits.streaming
    assert not planning.configured.streaming
    await tag.aclose()


def test_a_plain_call_teaches_the_output_size_without_a_frame() -> None:
    # Regression: a plain call's output was learned minus the packed answer's key, so
    # sizes learned from lone calls were short and groups planned from them ran late.
    planning = Planning(
        PlanLimits(per_item_output_overhead_tokens=4), 20, None, estimator_for("gpt-4")
    )
    for n in range(10):  # the estimate follows once it has 10 observations
        alone = Completion("{}", "stop", usage=Usage(100, 30), seconds=1.0)
        planning.learn(alone, 1, "alone", float(n), packed=False)
        pair = Completion("{}", "stop", usage=Usage(200, 70), seconds=1.5)
        planning.learn(pair, 2, "pair", float(n))
        reply = "out-1 word word"
        said = Completion(reply, "stop", usage=Usage(100, 30), seconds=1.0)
        planning.learn(said, 1, "text", float(n), packed=False, text=reply)
    assert planning.outputs.expected("alone") == 30
    assert planning.outputs.expected("pair") == 31  # 70 / 2 - 4 for each answer's key
    # Packed, a text answer is a JSON string: its quotes are planned for too.
    quotes = planning.estimator.count('"out-1 word word"') - planning.estimator.count(reply)
    assert quotes > 0
    assert planning.outputs.expected("text") == 30 + quotes


async def test_under_a_budget_a_group_of_one_is_asked_as_a_plain_call() -> None:
    seen: list[str] = []

    async def answer(request: CompletionRequest) -> str:
        seen.append(request.user)
        return json.dumps({"label": "bug"})

    @coalesce.prompt(
        client=CallableProvider(answer), model="gpt-4o-mini", latency_budget=5.0, max_wait=0.0
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket."""

    assert (await tag("alone")).label == "bug"
    assert seen == ["alone"]
    await tag.aclose()


async def _spaced(spacing: float, calls: int, **options: Any) -> tuple[Any, Any, list[float]]:
    """``calls`` calls ``spacing`` seconds apart at a 4 s budget; the batcher's and the
    function's statistics and each call's latency."""
    sim = provider()
    prior = coalesce.LatencyPrior(overhead=0.4, prefill_per_token=1e-4, decode_per_token=1 / 80)

    @coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        latency_budget=4.0,
        latency_prior=prior,
        max_items=16,
        **options,
    )
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket. Read the whole ticket before choosing a label."""

    latencies: list[float] = []

    async def one(n: int) -> None:
        start = anyio.current_time()
        await tag(f"ticket {n}: something is wrong with my account")
        latencies.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        for n in range(calls):
            tg.start_soon(one, n)
            await anyio.sleep(spacing)
    await tag.aclose()
    return tag.batcher_statistics(), tag.statistics(), latencies


async def test_with_a_budget_the_default_window_is_a_quarter_of_it() -> None:
    # Calls 0.2 s apart: a 0.05 s window never holds two, a quarter of 4 s holds five.
    batcher, stats, latencies = await _spaced(0.2, 40)
    assert batcher.mean_batch_size >= 4
    assert stats.wait_p99 <= 1.0 + 1e-6  # nobody waited past a quarter of the budget
    assert max(latencies) <= 4.0


async def test_a_given_max_wait_is_kept_whatever_the_budget() -> None:
    batcher, stats, _latencies = await _spaced(0.2, 40, max_wait=0.05)
    assert batcher.mean_batch_size == 1
    assert stats.wait_p99 <= 0.05 + 1e-6
    # 0.05 given explicitly is not the default, even though it is the same number.
    assert coalesce_window(max_wait=0.05, latency_budget=4.0) == 0.05
    assert coalesce_window(latency_budget=4.0) == 1.0
    assert coalesce_window() == 0.05


def coalesce_window(**options: Any) -> float:
    return Options(**options).window
