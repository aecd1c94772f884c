"""The engine alone: it takes calls in and answers them in real time; the lanes are the
router's. Against the simulated provider, in process, on virtual time."""

from __future__ import annotations

import math
from typing import Any, Literal

import anyio
import pydantic
import pytest

import coalesce
from coalesce import InvalidInputError
from coalesce._engine.engine import Engine
from coalesce._engine.spec import FunctionSpec, Options
from coalesce._lanes.router import LaneRouter
from coalesce.providers._client import as_provider
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio

INSTRUCTIONS = "Tag the support ticket: billing, bug or other. " + " ".join(
    f"Rule {n}: read the ticket closely and judge it by what it says happened." for n in range(40)
)


class Tag(pydantic.BaseModel):
    category: Literal["billing", "bug", "other"]


def engine_for(client: Any, **options: Any) -> Engine:
    adapter: pydantic.TypeAdapter[Tag] = pydantic.TypeAdapter(Tag)
    spec = FunctionSpec(
        name="tag",
        provider=as_provider(client),
        model="gpt-4o-mini",
        instructions=INSTRUCTIONS,
        output_schema=adapter.json_schema(),
        validate=adapter.validate_python,
    )
    return Engine(spec, Options(**options))


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(time_scale=0.01)


async def test_concurrent_calls_share_requests_and_each_gets_its_own_answer(
    sim: SimulatedProvider,
) -> None:
    engine = engine_for(sim.openai_client(), max_items=4, lane="realtime")
    tickets = [f"ticket {n}: my invoice is wrong" for n in range(8)]
    answers: dict[str, Any] = {}

    async def call(ticket: str) -> None:
        answers[ticket] = await engine.submit(ticket)

    async with anyio.create_task_group() as tg:
        for ticket in tickets:
            tg.start_soon(call, ticket)
    await engine.aclose()
    schema = pydantic.TypeAdapter(Tag).json_schema()
    assert answers == {t: Tag(**sim.expected_output(t, schema)) for t in tickets}
    stats = engine.statistics()
    assert (stats.calls, stats.requests) == (8, 2)  # two full groups of 4


async def test_a_bad_item_fails_its_own_call_at_once_and_is_recorded(
    sim: SimulatedProvider,
) -> None:
    engine = engine_for(sim.openai_client(), lane="realtime")
    with pytest.raises(InvalidInputError):
        engine.new_job({"not": math.nan})
    stats = engine.statistics()
    assert (stats.calls, stats.calls_failed, stats.requests) == (1, 1, 0)
    assert sim.requests == ()


async def test_a_calls_budget_is_its_own_then_the_blocks_then_the_functions(
    sim: SimulatedProvider,
) -> None:
    engine = engine_for(sim.openai_client(), latency_budget=2.0, lane="realtime")
    assert engine.budget_of(None) == 2.0
    assert engine.budget_of(0.5) == 0.5
    with coalesce.latency_budget(1.0):
        assert engine.budget_of(None) == 1.0
        assert engine.budget_of(0.5) == 0.5
        job = engine.new_job("a ticket")
    assert job.budget == 1.0
    assert job.deadline == pytest.approx(job.arrival + 1.0)
    assert job.plan is not None  # planned against its budget before the Job was made


async def test_in_time_asks_the_planner_for_a_request_of_the_call_alone(
    sim: SimulatedProvider,
) -> None:
    engine = engine_for(sim.openai_client(), latency_budget=30.0, lane="realtime")
    job = engine.new_job("a ticket")
    assert engine.in_time(job, 30.0)
    assert not engine.in_time(job, 0.001)  # less than the prior predicts for one item
    assert not engine.in_time(job, 0.0)
    # Every engine plans, its function's budget or not: a call's own budget is enough.
    unconfigured = engine_for(sim.openai_client(), lane="realtime")
    own = unconfigured.new_job("a ticket", budget=30.0)
    assert unconfigured.in_time(own, 30.0)
    assert not unconfigured.in_time(own, 0.001)
    assert unconfigured.in_time(unconfigured.new_job("a ticket"), math.inf)  # no budget


async def test_the_engine_knows_no_lane_the_router_does(sim: SimulatedProvider) -> None:
    engine = engine_for(sim.openai_client(), lane="auto")
    router = LaneRouter(engine)
    assert router.engine is engine
    assert {lane.value for lane in router.lanes} == {"realtime", "flex", "batch"}
    # No budget: nobody said the call may wait, so it stays in real time.
    answer = await router.submit("my invoice is wrong")
    await router.aclose()
    assert isinstance(answer, Tag)
    assert engine.statistics().calls_by_lane == {"realtime": 1}
