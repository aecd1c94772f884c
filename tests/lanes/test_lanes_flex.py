"""The flex lane (issue 14, point 1): OpenAI ``service_tier="flex"`` at half the price,
packed; a refusal for capacity falls back to real time while the budget allows. On the
simulated provider, on virtual time."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import openai
import pytest

import coalesce
from coalesce.testing import FlexProcessing, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

MINUTES = 60.0
FLEX_BUDGET = 30 * MINUTES  # past flex's promise (15 min) and its window (60 s)


def tagger(client: Any, **options: Any) -> Any:
    async def summarise(text: str) -> str:
        """Summarise the text."""

    options.setdefault("packing", "always")
    return coalesce.prompt(client=client, model="gpt-4o-mini", **options)(summarise)


async def ask_all(fn: Any, texts: list[str], budget: float | None) -> dict[str, Any]:
    answers: dict[str, Any] = {}

    async def one(text: str) -> None:
        with coalesce.latency_budget(budget):
            try:
                answers[text] = await fn(text)
            except Exception as exc:  # kept, to be asserted on
                answers[text] = exc

    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    return answers


def tiers(sim: SimulatedProvider) -> list[str | None]:
    return [record.service_tier for record in sim.requests]


async def test_minutes_of_budget_go_to_flex_packed_at_half_the_price() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    rules = " ".join(f"Rule {n}: keep the summary short and factual." for n in range(40))
    fn = tagger(sim.openai_client(), max_items=5, instructions=f"Summarise the text. {rules}")
    texts = [f"text {i}" for i in range(20)]
    answers = await ask_all(fn, texts, budget=FLEX_BUDGET)
    await fn.aclose()
    assert answers == {text: expected_output(text) for text in texts}  # each its own
    assert tiers(sim) == ["flex"] * 4  # 20 items, 5 per request
    stats = fn.statistics()
    assert dict(stats.calls_by_lane) == {"flex": 20}
    assert set(stats.cost_by_lane) == {"flex"}
    assert stats.cost_by_lane["flex"] == pytest.approx(stats.estimated_cost)
    # Packed and at half the list price: well under the one-per-item real-time baseline.
    assert stats.estimated_cost < 0.5 * stats.estimated_cost_one_per_item
    assert stats.flex_fallbacks == 0


async def test_flex_bills_half_of_what_the_same_requests_cost_in_real_time() -> None:
    costs = {}
    for lane in ("flex", "realtime"):
        sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
        fn = tagger(sim.openai_client(), max_items=5, lane=lane, max_wait=60.0)
        await ask_all(fn, [f"text {i}" for i in range(10)], budget=None)
        await fn.aclose()
        assert fn.statistics().requests == 2
        costs[lane] = fn.statistics().estimated_cost
    assert costs["flex"] == pytest.approx(costs["realtime"] / 2)


async def test_a_refused_flex_group_is_asked_in_flex_again_after_a_backoff() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    sim.inject_flex(True)  # the first flex request: 429 resource_unavailable
    fn = tagger(sim.openai_client(), max_items=5)
    texts = [f"text {i}" for i in range(5)]
    answers = await ask_all(fn, texts, budget=FLEX_BUDGET)
    await fn.aclose()
    assert answers == {text: expected_output(text) for text in texts}
    assert tiers(sim) == ["flex", "flex"]  # no real-time request, at list price
    refused, answered = sim.requests
    assert refused.status == 429
    assert answered.started_at - refused.finished_at == 30.0  # the backoff
    stats = fn.statistics()
    assert (stats.flex_retries, stats.flex_fallbacks) == (5, 0)
    assert dict(stats.calls_by_lane) == {"flex": 5}
    assert stats.calls == 5  # each call counted once, not once per asking
    assert stats.retries == 0


async def test_flex_is_asked_again_while_the_budget_allows_then_real_time_answers() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=1.0))  # flex always refuses
    fn = tagger(sim.openai_client(), max_items=5)
    texts = [f"text {i}" for i in range(5)]
    answers = await ask_all(fn, texts, budget=20 * MINUTES)
    await fn.aclose()
    assert answers == {text: expected_output(text) for text in texts}
    # Asked again after 30, 60 and 120 s; after a fourth refusal a wait of 240 s
    # would leave less than flex's promise (15 min) and window (60 s): real time.
    assert tiers(sim) == ["flex"] * 4 + ["default"]
    starts = [record.started_at for record in sim.requests]
    assert [later - earlier for earlier, later in itertools.pairwise(starts[:4])] == [
        30.0,
        60.0,
        120.0,
    ]
    stats = fn.statistics()
    assert (stats.flex_retries, stats.flex_fallbacks) == (15, 5)
    assert dict(stats.calls_by_lane) == {"realtime": 5}


async def test_a_model_without_flex_falls_back_and_flex_is_not_asked_again() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0, models=["o3"]))
    fn = tagger(sim.openai_client(), max_items=5)
    first = await ask_all(fn, ["a", "b"], budget=FLEX_BUDGET)
    second = await ask_all(fn, ["c"], budget=FLEX_BUDGET)
    await fn.aclose()
    assert first | second == {t: expected_output(t) for t in "abc"}
    assert tiers(sim)[0] == "flex"
    assert sim.requests[0].status == 400
    assert "flex" not in tiers(sim)[1:]
    assert fn.statistics().flex_fallbacks == 2


async def test_auto_keeps_seconds_in_real_time_and_anthropic_has_no_flex() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    fn = tagger(sim.openai_client())
    await ask_all(fn, ["a"], budget=2.0)
    await ask_all(fn, ["b"], budget=None)
    await fn.aclose()
    assert tiers(sim) == ["default", "default"]

    claude = SimulatedProvider()
    fn = tagger(claude.anthropic_client())
    answers = await ask_all(fn, ["c"], budget=FLEX_BUDGET)
    await fn.aclose()
    assert answers == {"c": expected_output("c")}
    assert dict(fn.statistics().calls_by_lane) == {"realtime": 1}
    with pytest.raises(coalesce.ConfigurationError, match=r"lane='flex' is not offered"):
        tagger(claude.anthropic_client(), lane="flex")


async def test_no_fallback_when_real_time_cannot_answer_within_the_budget() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=1.0))
    fn = tagger(sim.openai_client(), lane="flex", batch_window=0.0, latency_budget=0.05)
    answers = await ask_all(fn, ["a"], budget=None)
    await fn.aclose()
    assert isinstance(answers["a"], openai.RateLimitError)  # flex's refusal, as it came
    assert tiers(sim) == ["flex"]  # nothing sent that could not arrive in time
    assert fn.statistics().flex_fallbacks == 0
