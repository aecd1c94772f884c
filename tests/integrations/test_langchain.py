"""LangChain, given a wrapped client: ``ChatOpenAI.ainvoke`` (plain text),
``.with_structured_output(Ticket)`` (and with ``method="json_mode"``, the schema spelled
out in the prompt), the same with ``use_responses_api=True``, and
``ChatAnthropic.with_structured_output(Ticket)``.

``ChatOpenAI`` takes the client as ``root_async_client`` (and its chat completions as
``async_client``); ``ChatAnthropic`` takes none: it builds its client lazily in the
cached property ``_async_client``, which is the only place to put a wrapped one.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from _integration import (
    ANTHROPIC_MODEL,
    ASYNCIO_ONLY,
    INSTRUCTIONS,
    MAX_TOKENS,
    OPENAI_MODEL,
    TICKETS,
    Ticket,
    assert_coalesced,
    expected_text,
    expected_ticket,
    gather,
)

from coalesce.testing import SimulatedProvider

pytest.importorskip("langchain_openai")
pytest.importorskip("langchain_anthropic")

from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI

pytestmark = [pytest.mark.anyio, pytest.mark.integration, ASYNCIO_ONLY]


def _chat_openai(client: openai.AsyncOpenAI, url: str, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=OPENAI_MODEL,
        api_key="sk-simulated",
        base_url=url + "/v1",
        root_async_client=client,
        async_client=client.chat.completions,
        **options,
    )


def _messages(ticket: str) -> list[tuple[str, str]]:
    return [("system", INSTRUCTIONS), ("human", ticket)]


async def test_chat_openai_ainvoke(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, url: str
) -> None:
    # Plain text: nothing bounds the answer's size, so the first call goes alone as a
    # probe and the others are held for its reply (the cold start), then packed.
    llm = _chat_openai(openai_client, url)

    async def one(ticket: str) -> Any:
        return await llm.ainvoke(_messages(ticket))

    answers = await gather(one)
    assert all(type(answer) is AIMessage for answer in answers)
    assert [answer.content for answer in answers] == [expected_text(t) for t in TICKETS]
    assert_coalesced(sim)


@pytest.mark.parametrize("use_responses_api", [False, True], ids=["chat", "responses_api"])
async def test_chat_openai_with_structured_output(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, url: str, use_responses_api: bool
) -> None:
    llm = _chat_openai(openai_client, url, use_responses_api=use_responses_api)
    structured = llm.with_structured_output(Ticket)

    async def one(ticket: str) -> Any:
        return await structured.ainvoke(_messages(ticket))

    answers = await gather(one)
    assert all(type(answer) is Ticket for answer in answers)
    assert answers == [expected_ticket(ticket) for ticket in TICKETS]
    assert_coalesced(sim)


#: ``json_mode`` sends ``response_format={"type": "json_object"}`` and nothing of the
#: schema: the prompt must spell it out (as LangChain's documentation says).
JSON_MODE_INSTRUCTIONS = (
    f"{INSTRUCTIONS}\nAnswer with one JSON object valid against this JSON schema:"
    f" {json.dumps(Ticket.model_json_schema())}"
)


@pytest.mark.parametrize("use_responses_api", [False, True], ids=["chat", "responses_api"])
async def test_chat_openai_with_structured_output_json_mode(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, url: str, use_responses_api: bool
) -> None:
    llm = _chat_openai(openai_client, url, use_responses_api=use_responses_api)
    structured = llm.with_structured_output(Ticket, method="json_mode")

    async def one(ticket: str) -> Any:
        return await structured.ainvoke([("system", JSON_MODE_INSTRUCTIONS), ("human", ticket)])

    answers = await gather(one)
    assert all(type(answer) is Ticket for answer in answers)
    assert answers == [expected_ticket(ticket) for ticket in TICKETS]
    assert_coalesced(sim)


async def test_chat_anthropic_with_structured_output(
    sim: SimulatedProvider, anthropic_client: anthropic.AsyncAnthropic, url: str
) -> None:
    llm = ChatAnthropic(
        model_name=ANTHROPIC_MODEL,
        api_key="sk-ant-simulated",
        base_url=url,
        max_tokens=MAX_TOKENS,
        timeout=None,
        stop=None,
    )
    llm.__dict__["_async_client"] = anthropic_client  # fills the cached property
    structured = llm.with_structured_output(Ticket)

    async def one(ticket: str) -> Any:
        return await structured.ainvoke(_messages(ticket))

    answers = await gather(one)
    assert all(type(answer) is Ticket for answer in answers)
    assert answers == [expected_ticket(ticket) for ticket in TICKETS]
    assert_coalesced(sim)


# LangChain dumps each event of the SDK's ``chat.completions.stream`` helper with
# ``model_dump()``, and pydantic warns about the generic ``parsed`` field: it does so
# with the plain client too.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_chat_openai_structured_output_astream(
    sim: SimulatedProvider, openai_client: openai.AsyncOpenAI, url: str
) -> None:
    # With a json_schema, astream goes through the SDK's beta.chat.completions.stream
    # helper, which reads the coalesced stream's response: the SDK's own AsyncStream.
    structured = _chat_openai(openai_client, url).with_structured_output(
        Ticket, method="json_schema"
    )

    async def one(ticket: str) -> list[Any]:
        return [chunk async for chunk in structured.astream(_messages(ticket))]

    streams = await gather(one)
    assert all(chunks and type(chunks[-1]) is Ticket for chunks in streams)
    assert [chunks[-1] for chunks in streams] == [expected_ticket(ticket) for ticket in TICKETS]
    assert_coalesced(sim)
