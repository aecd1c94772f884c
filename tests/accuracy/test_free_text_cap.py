"""Free text gets the guard and the learned cap at default options (issue 37's Done-when),
on the simulated provider in process, on virtual time: ``-> str`` answers, a 2 s budget,
Poisson arrivals at 100 calls/s (bench_cap's latency profile: 0.35 s to the first
token, 80 tokens/s)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

import coalesce
from coalesce.testing import (
    LatencyModel,
    LatencyProfile,
    PackingDegradation,
    SimulatedProvider,
    expected_output,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]

BUDGET = 2.0
INSTRUCTIONS = "You are the assistant of a software company's support desk. " + (
    "Name the product the ticket is about, in the words a customer would use. " * 25
)
PROFILE = LatencyProfile(ttft=0.35, prompt_token_seconds=0.00005, tokens_per_second=80.0)


@dataclass(frozen=True)
class PastPosition(PackingDegradation):
    """Packed answers go wrong past position 6 (counted from 1); plain ones never do."""

    def degrades(self, item_input: Any, size: int, position: int) -> bool:
        return size > 1 and position >= 6


def simulator(degradation: PackingDegradation | None = None) -> SimulatedProvider:
    return SimulatedProvider(latency=LatencyModel(default=PROFILE), degradation=degradation)


def tickets(n: int) -> list[str]:
    problems = ["my invoice is wrong", "the app crashes on start", "I cannot log in"]
    return [f"Ticket {i}: {problems[i % 3]} since this morning, please help" for i in range(n)]


def function(sim: SimulatedProvider, **options: Any) -> Any:
    async def product(ticket: str) -> str: ...

    return coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        instructions=INSTRUCTIONS,
        latency_budget=BUDGET,
        **options,
    )(product)


@dataclass
class Run:
    arrivals: list[float]
    latencies: list[float]
    answers: list[Any]


async def stream(fn: Any, texts: list[str], rate: float = 100.0, seed: int = 1) -> Run:
    """Each text at its Poisson arrival; each call's arrival, latency and answer."""
    rng, clock, offsets = random.Random(seed), 0.0, []
    for _ in texts:
        clock += rng.expovariate(rate)
        offsets.append(clock)
    n = len(texts)
    run = Run([0.0] * n, [math.inf] * n, [None] * n)
    start = anyio.current_time()

    async def one(i: int) -> None:
        await anyio.sleep(start + offsets[i] - anyio.current_time())
        run.arrivals[i] = anyio.current_time()
        try:
            run.answers[i] = await fn(texts[i])
        except coalesce.CoalesceError as exc:
            run.answers[i] = exc
        else:
            run.latencies[i] = anyio.current_time() - run.arrivals[i]

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    await fn.aclose()
    return run


def right(text: str) -> str:
    return str(expected_output(text, {"type": "string"}))


async def test_free_text_learns_a_cap_that_costs_at_most_027x_plain_prompt_tokens() -> None:
    sim = simulator()
    plain = function(sim, max_items=1, shadow=0)
    for text in tickets(10):
        await plain(text)
    await plain.aclose()
    per_plain = sum(r.prompt_tokens for r in sim.requests) / 10
    sim.reset()
    fn = function(sim)
    texts = tickets(3000)
    run = await stream(fn, texts)
    measured = range(2000, 3000)
    begin = run.arrivals[2000]
    spent = sum(r.prompt_tokens for r in sim.requests if r.started_at >= begin)
    assert spent <= 0.27 * per_plain * len(measured)
    assert all(run.answers[i] == right(texts[i]) for i in measured)
    assert sum(run.latencies[i] <= BUDGET for i in measured) >= 0.99 * len(measured)
    stats = fn.statistics()
    assert stats.group_cap >= 8  # it learned past the safe start of 4
    assert all(new > old for old, new, _ in stats.cap_learning.moves)  # never fell


async def test_free_text_wrong_past_position_6_lowers_the_cap_to_6_and_raises_the_alarm() -> None:
    sim = simulator(PastPosition())
    events: list[Any] = []
    fn = function(sim, on_event=events.append)
    texts = tickets(2000)
    run = await stream(fn, texts)
    stats = fn.statistics()
    assert stats.group_cap <= 6
    wrong = [answer != right(text) for answer, text in zip(run.answers, texts, strict=True)]
    assert sum(wrong[-500:]) <= 10  # a call that failed counts as wrong here
    answered = [w for w, a in zip(wrong, run.answers, strict=True) if isinstance(a, str)]
    assert sum(answered) == sum(r.degraded for r in sim.requests)  # each one packing's
    alarms = [e for e in events if isinstance(e, coalesce.DisagreementAlarm)]
    assert alarms
    assert alarms[-1].cap <= 6


async def test_wrap_learns_the_cap_of_chat_calls_without_a_schema() -> None:
    # What the gateway carries too: plain-text chat, default options.
    sim = SimulatedProvider()
    client = coalesce.wrap(sim.openai_client())

    async def one(n: int) -> None:
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": f"Ticket {n}: my invoice is wrong"},
            ],
        )

    for start in range(0, 800, 32):
        async with anyio.create_task_group() as tg:
            for n in range(start, start + 32):
                tg.start_soon(one, n)
    await client.aclose()
    stats = client.statistics()["gpt-4o-mini"]
    assert stats.group_cap > 4
    assert stats.shadow_requests > 0
