"""The control: the same 40 calls written against the SDKs by hand, no framework.

If these fail, the framework tests measure the harness, not the frameworks.
"""

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
from anthropic.types import ToolUseBlock
from openai.types.chat import ParsedChatCompletion

from coalesce.testing import SimulatedProvider

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_openai_chat_parse(sim: SimulatedProvider, openai_client: openai.AsyncOpenAI) -> None:
    async def one(ticket: str) -> ParsedChatCompletion[Ticket]:
        return await openai_client.chat.completions.parse(
            model=OPENAI_MODEL,
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": ticket},
            ],
            response_format=Ticket,
        )

    replies = await gather(one)
    assert all(isinstance(reply, ParsedChatCompletion) for reply in replies)
    assert [reply.choices[0].message.parsed for reply in replies] == [
        expected_ticket(ticket) for ticket in TICKETS
    ]
    assert_coalesced(sim)


async def test_anthropic_forced_tool(
    sim: SimulatedProvider, anthropic_client: anthropic.AsyncAnthropic
) -> None:
    tool = {
        "name": "triage",
        "description": "Record the ticket's triage.",
        "input_schema": Ticket.model_json_schema(),
    }

    async def one(ticket: str) -> anthropic.types.Message:
        return await anthropic_client.messages.create(
            model=ANTHROPIC_MODEL,
            max_tokens=MAX_TOKENS,
            system=INSTRUCTIONS,
            messages=[{"role": "user", "content": ticket}],
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "tool", "name": "triage"},
        )

    replies = await gather(one)
    blocks = [reply.content[0] for reply in replies]
    assert all(isinstance(block, ToolUseBlock) for block in blocks)
    assert [Ticket.model_validate(block.input) for block in blocks] == [  # type: ignore[union-attr]
        expected_ticket(ticket) for ticket in TICKETS
    ]
    assert_coalesced(sim)
