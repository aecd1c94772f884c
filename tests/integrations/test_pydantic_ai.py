"""pydantic-ai, given a wrapped client: the default ``openai:`` model (the Responses
API), ``OpenAIChatModel`` with tool output (its default) and with native output, both
models with ``PromptedOutput`` (the schema in the instructions, ``json_object`` asked),
and ``AnthropicModel``."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from _integration import (
    ANTHROPIC_MODEL,
    ASYNCIO_ONLY,
    INSTRUCTIONS,
    OPENAI_MODEL,
    TICKETS,
    Ticket,
    assert_coalesced,
    expected_ticket,
    gather,
)

from coalesce.testing import SimulatedProvider

pydantic_ai = pytest.importorskip("pydantic_ai")

from pydantic_ai import (  # noqa: E402
    Agent,
    AgentRunResult,
    NativeOutput,
    PromptedOutput,
    ToolOutput,
)
from pydantic_ai.models.anthropic import AnthropicModel  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.anthropic import AnthropicProvider  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.integration, ASYNCIO_ONLY]


async def _run_all(sim: SimulatedProvider, agent: Agent[None, Ticket]) -> None:
    async def one(ticket: str) -> AgentRunResult[Ticket]:
        return await agent.run(ticket)

    results = await gather(one)
    assert all(isinstance(result, AgentRunResult) for result in results)
    assert all(type(result.output) is Ticket for result in results)
    assert [result.output for result in results] == [expected_ticket(t) for t in TICKETS]
    assert_coalesced(sim)


async def test_default_openai_model_responses_api(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI
) -> None:
    # What Agent("openai:gpt-4o-mini") builds, on the wrapped client.
    model = OpenAIResponsesModel(OPENAI_MODEL, provider=OpenAIProvider(openai_client=openai_client))
    await _run_all(sim, Agent(model, output_type=Ticket, instructions=INSTRUCTIONS))


@pytest.mark.parametrize(
    "output",
    [ToolOutput(Ticket), NativeOutput(Ticket), PromptedOutput(Ticket)],
    ids=["tool_output", "native_output", "prompted_output"],
)
async def test_openai_chat_model(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, output: Any
) -> None:
    model = OpenAIChatModel(OPENAI_MODEL, provider=OpenAIProvider(openai_client=openai_client))
    await _run_all(sim, Agent(model, output_type=output, instructions=INSTRUCTIONS))


async def test_openai_responses_model_prompted_output(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI
) -> None:
    # The schema in the instructions, text.format json_object.
    model = OpenAIResponsesModel(OPENAI_MODEL, provider=OpenAIProvider(openai_client=openai_client))
    agent = Agent(model, output_type=PromptedOutput(Ticket), instructions=INSTRUCTIONS)
    await _run_all(sim, agent)


async def test_anthropic_model(
    sim: SimulatedProvider, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    provider = AnthropicProvider(anthropic_client=anthropic_client)
    model = AnthropicModel(ANTHROPIC_MODEL, provider=provider)
    await _run_all(sim, Agent(model, output_type=Ticket, instructions=INSTRUCTIONS))
