"""instructor, given a wrapped client: ``from_openai`` (TOOLS, its default, and
JSON_SCHEMA) and ``from_anthropic`` (its default, a forced tool)."""

from __future__ import annotations

import anthropic
import openai
import pytest
from _integration import (
    ANTHROPIC_MODEL,
    INSTRUCTIONS,
    MAX_TOKENS,
    OPENAI_MODEL,
    TICKETS,
    Ticket,
    assert_coalesced,
    expected_ticket,
    gather,
)

from coalesce.testing import SimulatedProvider

instructor = pytest.importorskip("instructor")

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
async def test_from_openai(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, mode: object
) -> None:
    client = instructor.from_openai(openai_client, mode=mode)

    async def one(ticket: str) -> Ticket:
        answer: Ticket = await client.chat.completions.create(
            model=OPENAI_MODEL,
            response_model=Ticket,
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": ticket},
            ],
        )
        return answer

    answers = await gather(one)
    # instructor answers with its own subclass of the response model.
    assert all(isinstance(answer, Ticket) for answer in answers)
    assert [answer.model_dump() for answer in answers] == [
        expected_ticket(ticket).model_dump() for ticket in TICKETS
    ]
    assert_coalesced(sim)


async def test_from_anthropic(
    sim: SimulatedProvider, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    client = instructor.from_anthropic(anthropic_client)

    async def one(ticket: str) -> Ticket:
        answer: Ticket = await client.messages.create(
            model=ANTHROPIC_MODEL,
            max_tokens=MAX_TOKENS,
            system=INSTRUCTIONS,
            response_model=Ticket,
            messages=[{"role": "user", "content": ticket}],
        )
        return answer

    answers = await gather(one)
    # instructor answers with its own subclass of the response model.
    assert all(isinstance(answer, Ticket) for answer in answers)
    assert [answer.model_dump() for answer in answers] == [
        expected_ticket(ticket).model_dump() for ticket in TICKETS
    ]
    assert_coalesced(sim)
