"""Prompt caching in the cost decision, the bill and the requests (issue 13, point 4).

The decision is pure (:mod:`coalesce._planning.cost`); the providers' request
arguments are built without sending anything; the end-to-end behaviour runs on the
simulated provider, which caches prompt prefixes as the real providers do.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import anthropic
import anyio
import openai
import pytest
from pydantic import BaseModel

import coalesce
from coalesce import Price
from coalesce._planning.cost import (
    PackingCost,
    PromptCache,
    cached_share,
    packing_saves,
    smallest_paying_group,
)
from coalesce._planning.footprint import Footprint
from coalesce._pricing import cost
from coalesce.providers import AnthropicProvider, CompletionRequest, OpenAIProvider
from coalesce.testing import SimulatedProvider

ROUND = Price(input_per_mtok=1.0, output_per_mtok=4.0, cached_input_per_mtok=0.1)
LONG = Footprint(shared=2080, plain_shared=2000, item_frame=21, answer_frame=4)
SHORT = Footprint(shared=97, plain_shared=8, item_frame=21, answer_frame=4)


def test_a_prefix_below_the_minimum_is_paid_in_full() -> None:
    cache = PromptCache(min_tokens=1024)
    assert cached_share(1023, cache, ROUND) == 1023
    assert cached_share(2000, cache, ROUND) == pytest.approx(200)
    assert cached_share(2000, None, ROUND) == 2000


def test_the_discount_comes_from_the_price_unless_declared() -> None:
    assert PromptCache().discount(ROUND) == pytest.approx(0.1)
    assert PromptCache(read_price=0.5).discount(ROUND) == 0.5
    # No cached price known: a cached token is taken to cost a full one.
    assert PromptCache().discount(Price(1.0, 4.0)) == 1.0
    assert PromptCache().discount(None) == 1.0


def test_a_warm_cache_shrinks_the_saving_of_long_instructions_but_packing_still_pays() -> None:
    cold = packing_saves(LONG, ROUND, 8)
    warm = packing_saves(LONG, ROUND, 8, PromptCache())
    # Cold: 8 x (2000 - 21 - 16) - 2080. Warm: 8 x (200 - 37) - 208.
    assert cold == 8 * 1963 - 2080
    assert warm == pytest.approx(8 * 163 - 208)
    assert 0 < warm < cold
    assert smallest_paying_group(LONG, ROUND, 8, PromptCache()) == 2


def test_a_cache_can_make_packing_stop_paying() -> None:
    # 1,100 shared tokens read at 1% cost 11 per plain call: less than a packed item's
    # 37 tokens of frames, so plain calls with a warm cache are cheaper at any size.
    costs = Footprint(shared=1180, plain_shared=1100, item_frame=21, answer_frame=4)
    cache = PromptCache(read_price=0.01)
    assert smallest_paying_group(costs, ROUND, 64) == 2
    assert smallest_paying_group(costs, ROUND, 64, cache) is None


def test_short_instructions_gain_nothing_from_a_cache() -> None:
    assert smallest_paying_group(SHORT, ROUND, 64, PromptCache()) is None
    assert packing_saves(SHORT, ROUND, 8, PromptCache()) == packing_saves(SHORT, ROUND, 8)


def test_packing_cost_learns_a_cache_from_a_reply() -> None:
    costs = Footprint(shared=1180, plain_shared=1100, item_frame=21, answer_frame=4)
    learned = PackingCost(costs, ROUND, 64, None)
    assert learned.plain_cached_tokens() == 0
    assert not learned.saw_cached(0)
    assert learned.saw_cached(1024)
    assert learned.cache == PromptCache()
    assert learned.plain_cached_tokens() == 1100
    assert not learned.saw_cached(1024)  # already known


def test_packing_cost_always_pays_when_told_to() -> None:
    always = PackingCost(SHORT, ROUND, 64, None, auto=False)
    assert always.pays_from == 2
    assert PackingCost(SHORT, ROUND, 64, None).pays_from == math.inf


def test_cache_writes_and_reads_are_billed_at_their_own_prices() -> None:
    anthropic_like = Price(1.0, 5.0, cached_input_per_mtok=0.1, cache_write_per_mtok=1.25)
    # 3,000 prompt tokens: 2,000 written to the cache, 1,000 fresh; then 2,000 read.
    write = cost(3000, 0, anthropic_like, cache_write_tokens=2000)
    read = cost(3000, 0, anthropic_like, cached_input_tokens=2000)
    assert write == pytest.approx((1000 + 2000 * 1.25) / 1e6)
    assert read == pytest.approx((1000 + 2000 * 0.1) / 1e6)


REQUEST = CompletionRequest(model="m", system="Tag it.", user="[]", cache_key="coalesce-abc")


def test_openai_sends_the_cache_key_to_a_server_that_caches() -> None:
    official = OpenAIProvider(openai.AsyncOpenAI(api_key="sk-test"))
    assert official.prompt_cache("gpt-4o-mini") == PromptCache()
    assert official.arguments(REQUEST)["prompt_cache_key"] == "coalesce-abc"
    mine = CompletionRequest(
        model="m", system="s", user="[]", cache_key="k", options={"prompt_cache_key": "mine"}
    )
    assert official.arguments(mine)["prompt_cache_key"] == "mine"


def test_openai_sends_no_cache_key_to_an_unknown_server() -> None:
    client = openai.AsyncOpenAI(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    compatible = OpenAIProvider(client)
    assert compatible.prompt_cache("m") is None
    assert "prompt_cache_key" not in compatible.arguments(REQUEST)
    declared = OpenAIProvider(client, prompt_cache=True)
    assert declared.arguments(REQUEST)["prompt_cache_key"] == "coalesce-abc"
    off = OpenAIProvider(openai.AsyncOpenAI(api_key="sk-test"), prompt_cache=False)
    assert off.prompt_cache("gpt-4o") is None


def test_anthropic_marks_the_shared_prefix_when_asked() -> None:
    provider = AnthropicProvider(anthropic.AsyncAnthropic(api_key="sk-test"))
    marked = provider.arguments(REQUEST)["system"]
    assert marked == [{"type": "text", "text": "Tag it.", "cache_control": {"type": "ephemeral"}}]
    unmarked = CompletionRequest(model="m", system="Tag it.", user="[]")
    assert provider.arguments(unmarked)["system"] == "Tag it."
    off = AnthropicProvider(anthropic.AsyncAnthropic(api_key="sk-test"), prompt_cache=False)
    assert off.arguments(REQUEST)["system"] == "Tag it."


def test_anthropic_minimum_prefix_depends_on_the_model() -> None:
    provider = AnthropicProvider(anthropic.AsyncAnthropic(api_key="sk-test"))
    assert provider.prompt_cache("claude-sonnet-4-20250514") == PromptCache(1024, 0.1)
    assert provider.prompt_cache("claude-haiku-4-5") == PromptCache(4096, 0.1)
    assert provider.prompt_cache("claude-3-5-haiku-latest") == PromptCache(2048, 0.1)


LONG_INSTRUCTIONS = " ".join(
    ["Tag the support ticket with its category and its urgency, judging it alone."] * 90
)


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


async def burst(fn: Any, n: int, start: int = 0) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(start, start + n):
            tg.start_soon(fn, f"ticket {i}")


def tagger(client: Any, model: str, **options: Any) -> Any:
    async def tag(ticket: str) -> Tag:
        """(instructions= below)"""

    return coalesce.prompt(
        client=client,
        model=model,
        instructions=LONG_INSTRUCTIONS,
        max_wait=0.1,
        packing="always",
        **{"max_items": 8, **options},
    )(tag)


@pytest.mark.anyio
async def test_a_learned_cache_unpins_the_schema_so_groups_of_any_size_read_the_prefix() -> None:
    sim = SimulatedProvider()
    tag = tagger(sim.openai_client(), "gpt-4o-mini")
    assert tag._engine.cost.cache is None  # a server not known to cache
    await burst(tag, 3)
    await burst(tag, 3, start=3)  # the same size: the pinned schema is the same
    assert sim.requests[1].cached_tokens >= 1024
    assert tag._engine.cost.cache == PromptCache()  # learned from that reply
    await burst(tag, 5, start=6)  # unpinned from now on: a new prefix, written
    await burst(tag, 4, start=11)  # another size, the same prefix: read
    await tag.aclose()
    assert [r.items for r in sim.requests] == [3, 3, 5, 4]
    assert sim.requests[3].cached_tokens >= 1024
    assert tag.statistics().cached_input_tokens == sum(r.cached_tokens for r in sim.requests)


@pytest.mark.anyio
async def test_an_enforcing_provider_keeps_the_schema_pinned() -> None:
    sim = SimulatedProvider()
    tag = tagger(sim.openai_client(), "gpt-4o-mini", schema_enforced=True)
    for start, size in ((0, 3), (3, 3), (6, 5), (11, 4)):
        await burst(tag, size, start)
    await tag.aclose()
    assert tag._engine.cost.cache is not None
    # Early answers rely on the pinned schema: a group of another size misses the cache.
    assert sim.requests[1].cached_tokens >= 1024
    assert sim.requests[3].cached_tokens == 0


@pytest.mark.anyio
async def test_the_plain_call_baseline_assumes_a_warm_cache_where_there_is_one() -> None:
    async def run(cache: bool) -> coalesce.PromptStatistics:
        sim = SimulatedProvider(prompt_cache=cache)
        tag = tagger(sim.openai_client(), "gpt-4o-mini")
        for start in range(0, 24, 6):
            await burst(tag, 6, start)
        await tag.aclose()
        return tag.statistics()

    cold, warm = await run(False), await run(True)
    assert cold.cached_input_tokens == 0 < warm.cached_input_tokens
    # Plain calls would have read their instructions from the cache too: the baseline
    # is the best plain alternative, and the saving shrinks but stays.
    assert warm.estimated_cost_one_per_item < 0.7 * cold.estimated_cost_one_per_item
    assert warm.estimated_cost < cold.estimated_cost
    assert 0 < warm.savings < cold.savings


@pytest.mark.anyio
async def test_anthropic_requests_mark_the_prefix_and_pay_the_write_once() -> None:
    sim = SimulatedProvider()
    tag = tagger(sim.anthropic_client(), "claude-sonnet-4-20250514")
    assert tag._engine.cost.cache == PromptCache(1024, 0.1)  # declared, not learned
    for start, size in ((0, 3), (3, 5), (8, 4)):
        await burst(tag, size, start)
    await tag.aclose()
    writes = [r.cache_write_tokens for r in sim.requests]
    reads = [r.cached_tokens for r in sim.requests]
    assert writes[0] >= 1024
    assert reads[0] == 0
    assert writes[1:] == [0, 0]
    assert min(reads[1:]) >= 1024
