"""Testing your own LLM code against coalesce's simulated provider.

Copy this file next to your tests and run it::

    pytest examples/test_with_simulator.py

The code under test, ``tag_reviews``, packs several reviews into one chat completion
(coalesce's wire format) and returns one answer per review. The simulated provider
answers deterministically, so each test knows the exact expected answer.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from coalesce.testing import SimulatedProvider, expected_output

# The fixtures simulated_provider, simulated_provider_url, simulated_provider_options.
pytest_plugins = ["coalesce.testing.pytest_plugin"]


async def tag_reviews(client: openai.AsyncOpenAI, reviews: list[str]) -> list[Any]:
    """The code under test: one request, one answer per review, matched by id."""
    items = [{"id": str(n), "input": review} for n, review in enumerate(reviews, 1)]
    reply = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "system", "content": "Tag each review."},
            {"role": "user", "content": json.dumps(items)},
        ],
    )
    by_id = json.loads(reply.choices[0].message.content or "")["results"]  # {id: answer}
    return [by_id[item["id"]] for item in items]  # KeyError if the model skipped one


@pytest.fixture
def simulated_provider_options() -> dict[str, Any]:
    # These tests run on the real clock: make the simulated model 1000x faster.
    return {"time_scale": 0.001}


@pytest.mark.anyio
async def test_each_review_gets_its_own_answer(simulated_provider: SimulatedProvider) -> None:
    async with simulated_provider.openai_client(max_retries=0) as client:
        tags = await tag_reviews(client, ["great", "awful", "meh"])
    assert tags == [expected_output("great"), expected_output("awful"), expected_output("meh")]
    stats = simulated_provider.statistics()
    assert (stats.requests, stats.items) == (1, 3)


@pytest.mark.anyio
async def test_a_server_error_reaches_the_caller(simulated_provider: SimulatedProvider) -> None:
    simulated_provider.inject("server_error")  # the next request gets a 500
    async with simulated_provider.openai_client(max_retries=0) as client:
        with pytest.raises(openai.InternalServerError):
            await tag_reviews(client, ["great"])
        assert await tag_reviews(client, ["great"]) == [expected_output("great")]


@pytest.mark.anyio
async def test_a_missing_item_is_noticed(simulated_provider: SimulatedProvider) -> None:
    simulated_provider.inject("missing_item")  # the reply leaves one review out
    async with simulated_provider.openai_client(max_retries=0) as client:
        with pytest.raises(KeyError):
            await tag_reviews(client, ["great", "awful"])
    assert simulated_provider.requests[-1].faults == ("missing_item",)


@pytest.mark.anyio
async def test_over_real_http(simulated_provider_url: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{simulated_provider_url}/v1", api_key="sk-test", max_retries=0
    ) as client:
        assert await tag_reviews(client, ["great"]) == [expected_output("great")]
