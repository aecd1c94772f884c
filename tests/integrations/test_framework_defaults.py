"""Frameworks' own defaults, which users do not choose: pydantic-ai's ``AnthropicModel``
sends a Claude model's whole output limit as ``max_tokens`` (64,000 for Haiku 4.5).

The simulator refuses, as Anthropic does, a ``max_tokens`` above the model's output
limit and a prompt past its window; 40 calls through the wrapped client are each
answered, in at most 10 requests, none refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from _integration import (
    ASYNCIO_ONLY,
    CALLS,
    INSTRUCTIONS,
    TICKETS,
    Ticket,
    assert_coalesced,
    expected_ticket,
    gather,
)

import coalesce
from coalesce.testing import SimulatedProvider

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, AgentRunResult, NativeOutput, ToolOutput
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.providers.anthropic import AnthropicProvider

pytestmark = [pytest.mark.anyio, pytest.mark.integration, ASYNCIO_ONLY]

MODEL = "claude-haiku-4-5"
#: The wrapped client's budget: the other framework tests' (see ``conftest.BUDGET``).
BUDGET = 5.0


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(
        time_scale=0.5, output_limit={MODEL: 64_000}, context_window={MODEL: 200_000}
    )


@pytest.fixture
async def limited_client(
    sim: SimulatedProvider, url: str
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    raw = sim.anthropic_client(url)
    async with coalesce.wrap(raw, latency_budget=BUDGET, max_items=CALLS // 2) as client:
        yield client


@pytest.mark.parametrize(
    "output", [ToolOutput(Ticket), NativeOutput(Ticket)], ids=["tool_output", "native_output"]
)
async def test_pydantic_ai_anthropic_model_with_its_default_max_tokens(
    sim: SimulatedProvider, limited_client: anthropic.AsyncAnthropic, output: Any
) -> None:
    model = AnthropicModel(MODEL, provider=AnthropicProvider(anthropic_client=limited_client))
    agent = Agent(model, output_type=output, instructions=INSTRUCTIONS)

    async def one(ticket: str) -> AgentRunResult[Ticket]:
        return await agent.run(ticket)

    results = await gather(one)
    assert all(type(result.output) is Ticket for result in results)
    assert [result.output for result in results] == [expected_ticket(t) for t in TICKETS]
    assert {record.status for record in sim.requests} == {200}
    assert_coalesced(sim)
