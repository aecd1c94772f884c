"""The OpenAI Agents SDK, given a wrapped client: its default model (the Responses
API) and its ``chat_completions`` API, an agent with ``output_type=Ticket``.

The models are built as ``set_default_openai_client(client)`` (and
``set_default_openai_api("chat_completions")``) build them, without the global
settings; tracing is off (it would export to OpenAI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from _integration import (
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

pytest.importorskip("agents")

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    set_tracing_disabled,
)

pytestmark = [pytest.mark.anyio, pytest.mark.integration, ASYNCIO_ONLY]


@pytest.fixture(autouse=True)
def _no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


MODELS: dict[str, Callable[[openai.AsyncOpenAI], Any]] = {
    "responses": lambda client: OpenAIResponsesModel(OPENAI_MODEL, openai_client=client),
    "chat_completions": lambda client: OpenAIChatCompletionsModel(
        OPENAI_MODEL, openai_client=client
    ),
}


@pytest.mark.parametrize("api", list(MODELS))
async def test_agent_structured_output(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, api: str
) -> None:
    agent = Agent(
        name="triage",
        instructions=INSTRUCTIONS,
        model=MODELS[api](openai_client),
        output_type=Ticket,
    )

    async def one(ticket: str) -> RunResult:
        return await Runner.run(agent, ticket)

    results = await gather(one)
    assert all(type(result) is RunResult for result in results)
    assert all(type(result.final_output) is Ticket for result in results)
    assert [result.final_output for result in results] == [expected_ticket(t) for t in TICKETS]
    assert_coalesced(sim)
