"""instructor, given a wrapped client: ``from_openai`` (TOOLS, its default,
JSON_SCHEMA, and the modes that spell the schema out in the prompt: JSON, with
``response_format={"type": "json_object"}``, and MD_JSON, asking for a ````json`` block)
and ``from_anthropic`` (its default, a forced tool)."""

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


#: What MD_JSON appends to the user message (instructor 1.17): a plain call's answer is
#: the simulator's answer to the ticket with it.
MD_JSON_REQUEST = "Return the correct JSON response within a ```json codeblock. not the JSON_SCHEMA"


def _asked(mode: object, ticket: str) -> str:
    """The user message instructor sends for ``ticket`` in ``mode``."""
    return f"{ticket}\n\n{MD_JSON_REQUEST}" if mode == instructor.Mode.MD_JSON else ticket


@pytest.mark.parametrize(
    "mode",
    [
        instructor.Mode.TOOLS,
        instructor.Mode.JSON_SCHEMA,
        instructor.Mode.JSON,
        instructor.Mode.MD_JSON,
    ],
)
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
        expected_ticket(_asked(mode, ticket)).model_dump() for ticket in TICKETS
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
