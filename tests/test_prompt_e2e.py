"""End to end over real HTTP: the official SDKs, the simulated provider, faults.

Every caller must get the answer to its own input or a clear error, never another
caller's answer, whatever the provider does to the replies.
"""

from __future__ import annotations

from typing import Any, Literal

import anthropic
import anyio
import openai
import pytest
from pydantic import BaseModel, TypeAdapter

import coalesce
from coalesce.testing import FaultPlan, SimulatedProvider

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::ResourceWarning")]

# Request-level faults are retried; reply-level faults are split around and re-asked.
FAULTS = [
    "rate_limit",
    "server_error",
    "unavailable",
    "hang",
    "disconnect",
    "malformed_json",
    "prose",
    "code_fence",
    "truncate",
    "missing_item",
    "extra_id",
    "duplicate_id",
    "out_of_order",
]


class Ticket(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: int
    sentiment: Literal["positive", "neutral", "negative"]


ADAPTER: TypeAdapter[Ticket] = TypeAdapter(Ticket)


@pytest.fixture
def anyio_backend(real_time_backend: Any) -> Any:
    return real_time_backend


async def run(sim: SimulatedProvider, sdk: str, n: int, **options: Any) -> list[Any]:
    async with sim.serve_async() as url:
        client: Any = (sim.openai_client if sdk == "openai" else sim.anthropic_client)(
            url, timeout=2.0
        )

        @coalesce.prompt(client=client, model="gpt-4o-mini", **options)
        async def tag(ticket: str) -> Ticket:
            """Tag the ticket: category, urgency 1-5, sentiment."""

        results: list[Any] = [None] * n

        async def one(index: int) -> None:
            try:
                results[index] = await tag(f"ticket {index}: please help")
            except Exception as exc:
                results[index] = exc

        async with client, anyio.create_task_group() as tg:
            for index in range(n):
                tg.start_soon(one, index)
        return results


def tally(sim: SimulatedProvider, results: list[Any]) -> tuple[int, int, list[Any]]:
    schema = ADAPTER.json_schema()
    correct = wrong = 0
    errors = []
    for index, result in enumerate(results):
        want = ADAPTER.validate_python(sim.expected_output(f"ticket {index}: please help", schema))
        if isinstance(result, Exception):
            errors.append(result)
        elif result == want:
            correct += 1
        else:
            wrong += 1
    return correct, wrong, errors


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_300_calls_make_at_most_30_requests(sdk: str) -> None:
    sim = SimulatedProvider(time_scale=0.001)
    results = await run(sim, sdk, 300, max_items=20, max_wait=0.05)
    correct, wrong, errors = tally(sim, results)
    assert (correct, wrong, errors) == (300, 0, [])
    assert sim.statistics().requests <= 2 * 15


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
@pytest.mark.parametrize("fault", FAULTS)
async def test_each_fault_at_a_high_rate_gives_no_wrong_answer(sdk: str, fault: str) -> None:
    rate = 0.2 if fault != "hang" else 0.1  # a hang costs a whole client timeout
    sim = SimulatedProvider(
        time_scale=0.001,
        faults=FaultPlan(probabilities={fault: rate}, seed=7, hang_seconds=10_000),
    )
    results = await run(sim, sdk, 200, max_items=20, max_wait=0.05)
    correct, wrong, errors = tally(sim, results)
    assert wrong == 0
    assert correct >= 0.99 * len(results), errors[:3]
    for error in errors:  # the rest: a clear error of coalesce's or the SDK's own
        assert isinstance(error, (coalesce.ItemError, openai.APIError, anthropic.APIError))


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_all_faults_mixed(sdk: str) -> None:
    chances = {fault: 0.05 for fault in FAULTS if fault != "hang"}
    sim = SimulatedProvider(time_scale=0.001, faults=FaultPlan(probabilities=chances, seed=3))
    results = await run(sim, sdk, 200, max_items=20, max_wait=0.05)
    correct, wrong, _errors = tally(sim, results)
    assert wrong == 0
    assert correct >= 0.99 * len(results)
