"""A cold burst of free-text calls under a budget: the first call goes alone as a probe,
the others wait for its reply (or until a typical call could only just leave alone) and are then
sized with what it taught. On a provider as slow as the prior, nothing changes.

The simulated provider in process, on virtual time; ~600 tokens of shared instructions.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

import coalesce
from coalesce.testing import LatencyModel, LatencyProfile, SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    # Token counts for gpt-4o-mini fall back to the bundled cl100k_base offline.
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]

INSTRUCTIONS = "You are a support assistant. " + (
    "Answer the customer's question briefly and politely, citing the policy where it applies. " * 40
)
BUDGET = 2.0


def fast() -> SimulatedProvider:
    """Twice as fast as the simulator's default: a short answer in about 0.3 s."""
    return SimulatedProvider(time_scale=0.5)


def as_slow_as_the_prior() -> SimulatedProvider:
    """The default prior's speed (0.45 s, 1e-4 s per prompt token, 75 tokens/s) and the
    default expected answer (50 tokens)."""
    profile = LatencyProfile(ttft=0.45, prompt_token_seconds=1e-4, tokens_per_second=75)
    return SimulatedProvider(latency=LatencyModel(default=profile), output_tokens=50)


async def timed(calls: int, one: Any) -> list[float]:
    latencies: list[float] = []

    async def timed_one(n: int) -> None:
        start = anyio.current_time()
        try:
            await one(n)
        except coalesce.RequestTimeoutError:
            latencies.append(math.inf)
        else:
            latencies.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        # All at the same instant; call 0 first, so that the probe (and what its answer's
        # size teaches) does not depend on the scheduler's order.
        tg.start_soon(timed_one, 0)
        await anyio.wait_all_tasks_blocked()
        for n in range(1, calls):
            tg.start_soon(timed_one, n)
    return latencies


async def prompt_burst(sim: SimulatedProvider, calls: int = 40) -> tuple[Any, list[float]]:
    async def answer(question: str) -> str: ...

    answer.__doc__ = INSTRUCTIONS
    fn = coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        latency_budget=BUDGET,
        max_items=20,
    )(answer)
    latencies = await timed(calls, lambda n: fn(f"question {n}: how do I reset my password?"))
    await fn.aclose()
    return fn.batcher_statistics(), latencies


async def test_a_cold_burst_of_free_text_calls_is_packed_on_a_fast_provider() -> None:
    sim = fast()
    stats, latencies = await prompt_burst(sim)
    assert len(sim.requests) <= 10, [r.items for r in sim.requests]
    assert stats.dispatch_reasons["probe"] == 1
    assert stats.dispatch_reasons["solo"] == 0
    assert max(latencies) <= BUDGET, sorted(latencies)[-3:]


async def test_a_provider_as_slow_as_the_prior_is_planned_as_before() -> None:
    sim = as_slow_as_the_prior()
    stats, latencies = await prompt_burst(sim)
    # The prior admits no pair and the probe's reply comes after the hold ended (held
    # until a typical call could only just leave alone): every call
    # goes alone, as without the cold start, and within its budget.
    assert [r.items for r in sim.requests] == [1] * 40
    assert {k: n for k, n in stats.dispatch_reasons.items() if n} == {"probe": 1, "solo": 39}
    assert max(latencies) <= BUDGET, sorted(latencies)[-3:]


async def test_a_cold_burst_of_plain_text_chat_calls_through_wrap_is_packed() -> None:
    sim = fast()
    client = coalesce.wrap(sim.openai_client(), latency_budget=BUDGET, max_items=20)

    async def one(n: int) -> None:
        reply = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"question {n}: how do I reset my password?"},
            ],
        )
        assert reply.choices[0].message.content

    latencies = await timed(40, one)
    assert len(sim.requests) <= 10, [r.items for r in sim.requests]
    assert sum(r.items for r in sim.requests) == 40
    assert max(latencies) <= BUDGET, sorted(latencies)[-3:]
    reasons = client.statistics()["gpt-4o-mini"].dispatch_reasons
    assert reasons["probe"] == 1


async def test_a_cold_burst_at_default_options_pays_back_its_probe() -> None:
    # Issue 37: free text learns its cap from 4; the burst held through the probe goes
    # one over it, so that 40 calls take no more requests than groups of 4 alone would.
    sim = fast()

    async def answer(question: str) -> str: ...

    answer.__doc__ = INSTRUCTIONS
    fn = coalesce.prompt(
        client=sim.openai_client(max_retries=0), model="gpt-4o-mini", latency_budget=BUDGET
    )(answer)
    latencies = await timed(40, lambda n: fn(f"question {n}: how do I reset my password?"))
    await fn.aclose()
    assert len(sim.requests) <= 10
    assert [r.items for r in sim.requests] == [1, 5, 5, 5, 5, 5, 5, 5, 4]
    assert max(latencies) <= BUDGET, sorted(latencies)[-3:]
    # Later calls, made after the probe's reply, meet the cap itself.
    assert fn.statistics().group_cap == 4


async def test_wrap_at_default_options_packs_a_cold_burst_of_chat_calls_as_widely() -> None:
    sim = fast()
    client = coalesce.wrap(sim.openai_client(), latency_budget=BUDGET)

    async def one(n: int) -> None:
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"question {n}: how do I reset my password?"},
            ],
        )

    latencies = await timed(40, one)
    assert len(sim.requests) <= 10, [r.items for r in sim.requests]
    assert max(latencies) <= BUDGET, sorted(latencies)[-3:]
