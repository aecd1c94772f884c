"""Every budget sizes the wait (issue 35): a call's own budget, however it was given
(a ``coalesce.latency_budget()`` block, ``Engine.submit(budget=)``, the drop-in client's
``x-coalesce-budget`` header), plans its window and its group exactly as the same
budget configured on the function does; a call without any budget still goes after
the default short window. Simulated provider in process, on virtual time."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
import pydantic
import pytest

import coalesce
from coalesce._engine.engine import Engine
from coalesce._engine.spec import FunctionSpec, Options
from coalesce.providers._client import as_provider
from coalesce.testing import LatencyModel, LatencyProfile, SimulatedProvider

pytestmark = [
    pytest.mark.anyio,
    # Token counts for gpt-4o-mini fall back to the bundled cl100k_base offline.
    pytest.mark.filterwarnings("ignore::coalesce.CoalesceWarning"),
]

BUDGET = 2.0
CALLS = 24
GAP = 0.12  # seconds between two calls: longer than the default 0.05 s window, and
# off the 0.5 s window's grid (a call arriving just as a window is due is a tie)
INSTRUCTIONS = "Tag the support ticket: billing, bug or other. " + " ".join(
    f"Rule {n}: read the ticket closely and judge it by what it says happened." for n in range(30)
)
SCHEMA = {
    "type": "object",
    "properties": {"category": {"type": "string", "enum": ["billing", "bug", "other"]}},
    "required": ["category"],
    "additionalProperties": False,
}


class Tag(pydantic.BaseModel):
    category: Literal["billing", "bug", "other"]


def provider() -> SimulatedProvider:
    profile = LatencyProfile(ttft=0.35, prompt_token_seconds=0.0001, tokens_per_second=80)
    return SimulatedProvider(latency=LatencyModel(default=profile), output_tokens=20)


def ticket(n: int) -> str:
    return f"ticket {n}: I was charged twice for my plan this month"


async def arrive(call: Callable[[int], Awaitable[Any]]) -> list[float]:
    """``CALLS`` calls, one every ``GAP`` seconds; each call's seconds to its answer."""
    took: dict[int, float] = {}

    async def one(n: int) -> None:
        start = anyio.current_time()
        await call(n)
        took[n] = anyio.current_time() - start

    async with anyio.create_task_group() as tg:
        for n in range(CALLS):
            tg.start_soon(one, n)
            await anyio.sleep(GAP)
    return [took[n] for n in range(CALLS)]


def groups(sim: SimulatedProvider, origin: float) -> list[tuple[float, int]]:
    """When each request reached the provider (rounded, since ``origin``), and how many
    calls it carried."""
    return [(round(record.started_at - origin, 4), record.items) for record in sim.requests]


async def prompt_groups(configured: float | None, block: float | None) -> list[tuple[float, int]]:
    """A ``coalesce.prompt`` function's requests, its budget ``configured`` on it, or
    given by a ``latency_budget(block)`` around each call."""
    sim = provider()

    async def tagged(text: str) -> Tag:  # type: ignore[empty-body]
        ...

    tagged.__doc__ = INSTRUCTIONS  # long enough for packing to pay
    tag = coalesce.prompt(
        client=sim.openai_client(max_retries=0),
        model="gpt-4o-mini",
        latency_budget=configured,
        max_items=8,
        lane="realtime",
    )(tagged)

    async def call(n: int) -> Tag:
        with coalesce.latency_budget(block) if block else contextlib.nullcontext():
            result: Tag = await tag(ticket(n))
            return result

    origin = anyio.current_time()
    latencies = await arrive(call)
    await tag.aclose()
    assert max(latencies) <= BUDGET
    return groups(sim, origin)


def engine_for(sim: SimulatedProvider, **options: Any) -> Engine:
    adapter: pydantic.TypeAdapter[Tag] = pydantic.TypeAdapter(Tag)
    spec = FunctionSpec(
        name="tag",
        provider=as_provider(sim.openai_client(max_retries=0)),
        model="gpt-4o-mini",
        instructions=INSTRUCTIONS,
        output_schema=adapter.json_schema(),
        validate=adapter.validate_python,
    )
    return Engine(spec, Options(max_items=8, **options))


async def engine_groups(configured: float | None, own: float | None) -> list[tuple[float, int]]:
    """An engine's requests, its budget ``configured``, or each call's ``own``."""
    sim = provider()
    engine = engine_for(sim, latency_budget=configured)
    origin = anyio.current_time()
    await arrive(lambda n: engine.submit(ticket(n), budget=own))
    await engine.aclose()
    return groups(sim, origin)


async def wrap_groups(configured: float | None, header: float | None) -> list[tuple[float, int]]:
    """A wrapped client's requests, its budget ``configured``, or each call's header."""
    sim = provider()
    extra: dict[str, Any] = {}
    if header is not None:
        extra["extra_headers"] = {"x-coalesce-budget": f"{header:g}"}
    async with coalesce.wrap(
        sim.openai_client(max_retries=0), latency_budget=configured, max_items=8
    ) as client:

        async def call(n: int) -> Any:
            body: dict[str, Any] = {
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": ticket(n)},
                ],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "tag", "schema": SCHEMA, "strict": True},
                },
                **extra,
            }
            return await client.chat.completions.create(**body)

        origin = anyio.current_time()
        latencies = await arrive(call)
    assert max(latencies) <= BUDGET
    return groups(sim, origin)


def packed(found: list[tuple[float, int]]) -> None:
    """The calls shared requests: the budget's wait gathered company."""
    assert sum(items for _, items in found) == CALLS
    assert len(found) <= CALLS / 3, found


async def test_a_latency_budget_block_plans_as_a_configured_budget() -> None:
    configured = await prompt_groups(BUDGET, None)
    packed(configured)
    assert await prompt_groups(None, BUDGET) == configured


async def test_a_per_call_budget_plans_as_a_configured_budget() -> None:
    configured = await engine_groups(BUDGET, None)
    packed(configured)
    assert await engine_groups(None, BUDGET) == configured


async def test_wraps_budget_header_plans_as_a_configured_budget() -> None:
    configured = await wrap_groups(BUDGET, None)
    packed(configured)
    assert await wrap_groups(None, BUDGET) == configured


async def test_a_call_without_any_budget_goes_after_the_default_window() -> None:
    # 0.1 s apart, past the 0.05 s window: every call goes alone, 0.05 s after it came.
    found = await engine_groups(None, None)
    assert found == [(round(n * GAP + 0.05, 4), 1) for n in range(CALLS)]
    # In one engine, a lone call with a budget waits a quarter of it, one without 0.05 s.
    sim = provider()
    engine = engine_for(sim)
    origin = anyio.current_time()
    await engine.submit(ticket(0), budget=BUDGET)
    answered = anyio.current_time() - origin
    await engine.submit(ticket(1))
    await engine.aclose()
    assert groups(sim, origin) == [(0.5, 1), (round(answered + 0.05, 4), 1)]


async def test_a_calls_own_budget_sizes_its_own_wait() -> None:
    # Two calls 0.3 s apart: within a quarter of a 2 s budget (0.5 s), not of 1 s (0.25 s).
    async def pair(own: float) -> list[int]:
        sim = provider()
        engine = engine_for(sim)
        await engine.submit(ticket(0), budget=30.0)  # teaches the planner (no cold start)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: engine.submit(ticket(1), budget=own))
            await anyio.sleep(0.3)
            tg.start_soon(lambda: engine.submit(ticket(2), budget=own))
        await engine.aclose()
        return [record.items for record in sim.requests[1:]]

    assert await pair(BUDGET) == [2]
    assert await pair(1.0) == [1, 1]
