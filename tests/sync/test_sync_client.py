"""The synchronous wrapped client: ``openai.OpenAI`` and ``anthropic.Anthropic`` whose
calls coalesce, from 40 threads, against the simulator over HTTP (real time).

``coalesce.wrap`` hands a synchronous client to
:func:`~coalesce._wrap.sync_client.sync_coalesced`, with its async twin wrapped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from _threads import CALLS, GROUP, MOST_REQUESTS, Tag, in_threads, tickets
from openai._legacy_response import LegacyAPIResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion

import coalesce
from coalesce._wrap.sync_client import async_twin, sync_coalesced
from coalesce.testing import SimulatedProvider, expected_output

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-3-5-haiku-latest"
OPTIONS: dict[str, Any] = {"max_items": GROUP, "max_wait": 5.0, "packing": "always"}


def wrapped(client: Any, **options: Any) -> Any:
    """``coalesce.wrap(client)`` of a synchronous client."""
    return coalesce.wrap(client, **{**OPTIONS, **options})


@pytest.fixture
def openai_client(url: str) -> Iterator[Any]:
    plain = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-simulated", max_retries=0)
    client = wrapped(plain)
    yield client
    client.close()


def messages(ticket: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Tag the support ticket with its category and urgency."},
        {"role": "user", "content": ticket},
    ]


def test_40_threads_parse_through_one_client(sim: SimulatedProvider, openai_client: Any) -> None:
    assert isinstance(openai_client, openai.OpenAI)

    def parse(ticket: str) -> Any:
        return openai_client.chat.completions.parse(
            model=OPENAI_MODEL, messages=messages(ticket), response_format=Tag
        )

    items = tickets()
    replies = in_threads(parse, items)
    assert all(isinstance(reply, ParsedChatCompletion) for reply in replies)
    schema = Tag.model_json_schema()
    assert [reply.choices[0].message.parsed for reply in replies] == [
        Tag.model_validate(expected_output(item, schema)) for item in items
    ]
    assert sim.statistics().requests == CALLS // GROUP <= MOST_REQUESTS
    [statistics] = openai_client.statistics().values()
    assert (statistics.calls, statistics.requests) == (CALLS, CALLS // GROUP)


def test_40_threads_create_text_and_streams(sim: SimulatedProvider, openai_client: Any) -> None:
    def create(ticket: str) -> str:
        reply = openai_client.chat.completions.create(model=OPENAI_MODEL, messages=messages(ticket))
        assert isinstance(reply, ChatCompletion)
        return str(reply.choices[0].message.content)

    def stream(ticket: str) -> str:
        with openai_client.chat.completions.create(
            model=OPENAI_MODEL, messages=messages(ticket), stream=True
        ) as chunks:
            assert type(chunks) is openai.Stream
            parts = []
            for chunk in chunks:
                assert isinstance(chunk, ChatCompletionChunk)
                parts.extend(choice.delta.content or "" for choice in chunk.choices)
            return "".join(parts)

    items = tickets(CALLS // 2)
    assert in_threads(create, items) == [expected_output(item) for item in items]
    streamed = tickets(CALLS // 2, prefix="streamed")
    assert in_threads(stream, streamed) == [expected_output(item) for item in streamed]
    assert sim.statistics().requests == CALLS // GROUP <= MOST_REQUESTS


def test_40_threads_through_anthropic(sim: SimulatedProvider, url: str) -> None:
    plain = anthropic.Anthropic(base_url=url, api_key="sk-ant-simulated", max_retries=0)
    client = wrapped(plain)
    assert isinstance(client, anthropic.Anthropic)

    def create(ticket: str) -> str:
        reply = client.messages.create(
            model=ANTHROPIC_MODEL,
            max_tokens=200,
            system="Tag the support ticket with its category and urgency.",
            messages=[{"role": "user", "content": ticket}],
        )
        return str(reply.content[0].text)

    items = tickets()
    assert in_threads(create, items) == [expected_output(item) for item in items]
    assert sim.statistics().requests == CALLS // GROUP <= MOST_REQUESTS
    client.close()


def test_what_does_not_coalesce_goes_to_the_synchronous_client(
    sim: SimulatedProvider, openai_client: Any
) -> None:
    raw = openai_client.chat.completions.with_raw_response.create(
        model=OPENAI_MODEL, messages=messages("raw")
    )
    assert isinstance(raw, LegacyAPIResponse)  # the synchronous SDK's own
    assert raw.parse().choices[0].message.content == expected_output("raw")
    alone = openai_client.chat.completions.with_raw_response.create(
        model=OPENAI_MODEL, messages=messages("alone"), extra_headers={"x-coalesce": "off"}
    )
    assert "x-coalesce" not in alone.http_request.headers
    two_answers = openai_client.chat.completions.create(
        model=OPENAI_MODEL, messages=messages("two"), n=2
    )  # not one answer to ask for: its translator declines it
    assert isinstance(two_answers, ChatCompletion)
    assert sim.statistics().requests == 3
    assert openai_client.statistics() == {}  # none was coalesced
    assert openai_client.models is openai_client._coalesce_plain.models


def test_a_copy_coalesces_and_shares_the_statistics(url: str) -> None:
    plain = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-simulated", max_retries=0)
    openai_client = wrapped(plain, max_wait=0.0)
    copy = openai_client.with_options(timeout=30.0)
    assert isinstance(copy, openai.OpenAI)
    assert copy.timeout == 30.0
    copy.chat.completions.create(model=OPENAI_MODEL, messages=messages("copy"), max_tokens=50)
    [statistics] = openai_client.statistics().values()
    assert statistics.calls == 1
    openai_client.close()


def test_the_twin_has_the_clients_settings() -> None:
    plain = openai.OpenAI(
        api_key="sk-1",
        organization="org",
        project="proj",
        base_url="http://example.test/v1",
        timeout=12.0,
        max_retries=5,
        default_headers={"x-team": "a"},
        default_query={"q": "1"},
    )
    twin = async_twin(plain)
    assert isinstance(twin, openai.AsyncOpenAI)
    assert (twin.api_key, twin.organization, twin.project) == ("sk-1", "org", "proj")
    assert (str(twin.base_url), twin.timeout, twin.max_retries) == (
        "http://example.test/v1/",
        12.0,
        5,
    )
    assert twin.default_headers["x-team"] == "a"
    assert twin.default_query == {"q": "1"}
    claude = async_twin(anthropic.Anthropic(api_key="k", base_url="http://a.test", timeout=7.0))
    assert isinstance(claude, anthropic.AsyncAnthropic)
    assert (claude.api_key, str(claude.base_url), claude.timeout) == ("k", "http://a.test", 7.0)


def test_only_a_synchronous_sdk_client_has_a_twin() -> None:
    assert async_twin(openai.AsyncOpenAI(api_key="k")) is None
    assert async_twin(object()) is None
    with pytest.raises(TypeError, match=r"expected an openai\.OpenAI or anthropic\.Anthropic"):
        sync_coalesced(object(), None)
