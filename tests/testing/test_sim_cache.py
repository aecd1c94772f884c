"""The simulator's prompt caching: OpenAI's automatic prefix cache, Anthropic's breakpoints.

Through the official SDKs, in process, on virtual time (both backends): the TTL is
tested by sleeping past it, and the shorter time to first token of a hit exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import anyio
import openai
import pytest

from coalesce._exceptions import ConfigurationError
from coalesce.testing import (
    LatencyProfile,
    SimulatedLatency,
    SimulatedPromptCache,
    SimulatedProvider,
    compute_delays,
)
from coalesce.testing._cache import (
    CacheRequest,
    Segment,
    openai_cached,
    plan_breakpoints,
    prefix_tokens,
    serialize,
)
from coalesce.testing._cache_store import PromptCacheStore
from coalesce.testing._cli import build_parser
from coalesce.testing._clock import Clock
from coalesce.testing._config import provider_options
from coalesce.testing._tokens import count_text

pytestmark = pytest.mark.anyio

# Fast decoding: an answer is complete well within a second of its first token, so the
# TTL boundaries below are a second or more away from any request's own timeline.
PROFILE = LatencyProfile(ttft=0.5, prompt_token_seconds=0.001, tokens_per_second=1000)
GPT = "gpt-4o-mini"
SONNET = "claude-sonnet-4-20250514"
HAIKU = "claude-3-5-haiku-latest"  # caches from 2,048 tokens

SENTENCE = "The quick brown fox jumps over the lazy dog while the cat sleeps. "
LONG = SENTENCE * 120  # about 1,700 tokens
SHORT = SENTENCE * 40  # about 560 tokens

# The openai SDK stops reading its SSE generators at [DONE] without closing them;
# trio warns when such a generator is collected.
SDK_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected:ResourceWarning"
)


# ------------------------------------------------------------------ pure arithmetic


def test_openai_counts_cached_tokens_in_steps_of_128_from_1024() -> None:
    assert [openai_cached(n, 1024, 128) for n in (0, 1023, 1024, 1151, 1152, 1300)] == [
        0,
        0,
        1024,
        1024,
        1152,
        1280,
    ]


def test_prefix_tokens_counts_whole_blocks_and_the_part_of_the_cut_one() -> None:
    def count(text: str) -> int:
        return len(text.split())

    segments = [Segment("system", "a b c", 3), Segment("user", "d e f", 3)]
    text = serialize(segments)
    assert prefix_tokens(segments, len(text), count) == 12
    assert prefix_tokens(segments, 0, count) == 0
    first_block = len("\x1esystem\x1fa b c")
    assert prefix_tokens(segments, first_block, count) == 6
    assert prefix_tokens(segments, first_block + len("\x1euser\x1fd e"), count) == 11
    assert prefix_tokens(segments, first_block + 3, count) == 6  # within the head: nothing


def test_breakpoints_write_then_read_then_read_and_write_the_rest() -> None:
    tokens = [500, 1500, 1600, 3000]
    # The first breakpoint is too short to cache: only the last one counts.
    assert plan_breakpoints(tokens, [0, 3], set(), 1024, 20) == (0, 3000, None, (3,))
    assert plan_breakpoints(tokens, [0, 3], {3}, 1024, 20) == (3000, 0, 3, (3,))
    # An entry at an earlier breakpoint is read; the rest is written.
    assert plan_breakpoints(tokens, [1, 3], {1}, 1024, 20) == (1500, 1500, 1, (1, 3))
    # An entry a few blocks before a breakpoint is found by the lookback, not beyond it.
    assert plan_breakpoints(tokens, [3], {1}, 1024, 2) == (1500, 1500, 1, (3,))
    assert plan_breakpoints(tokens, [3], {1}, 1024, 1) == (0, 3000, None, (3,))
    assert plan_breakpoints(tokens, [], {1}, 1024, 20) == (0, 0, None, ())
    assert plan_breakpoints(tokens, [1], set(), 2048, 20) == (0, 0, None, ())


class HandClock(Clock):
    def __init__(self) -> None:
        super().__init__()
        self.time = 0.0

    def now(self) -> float:
        return self.time


def test_store_reads_the_nearest_usable_prompt_past_pending_and_expired_ones() -> None:
    def ask(user: str) -> CacheRequest:
        return CacheRequest((Segment("system", LONG, 3), Segment("user", user, 3)), True)

    clock = HandClock()
    store = PromptCacheStore(SimulatedPromptCache(ttl=10), 1.0, clock)
    scope = ("key", GPT)
    tokens = count_text(LONG) + 20

    def send(user: str, at: float, first_token: float = 1.0) -> int:
        clock.time = at
        use = store.lookup(ask(user), scope, tokens, at, count_text)
        store.commit(use, at, at + first_token)
        return use.read

    assert send("a", 0.0) == 0  # usable from 1 until 11
    assert send("c", 5.0, first_token=100.0) > 0  # reads "a"; "c" is pending until 105
    # "b" sorts between "a" and "c": the pending "c" is passed over, "a" is read.
    assert send("b", 6.0) > 0
    # "d" sorts last: "c" is passed over again, "b" (usable from 7) is read.
    assert send("d", 12.0) > 0
    # At 30 every entry but the pending "c" has expired, and is forgotten on the way.
    clock.time = 30.0
    assert store.lookup(ask("e"), scope, tokens, 30.0, count_text).read == 0
    assert [text[-1] for text in store.prompts["key", GPT, None].texts] == ["c"]


def test_minimum_per_model_and_validation() -> None:
    config = SimulatedPromptCache(min_tokens={"gpt-4o": 2000, "claude-3-5-haiku": 3000})
    assert config.minimum_for("gpt-4o-2024-08-06") == 2000
    assert config.minimum_for("gpt-4o-mini") == 2000  # a longer name matches its prefix
    assert config.minimum_for("gpt-4.1") == 1024
    assert config.minimum_for(HAIKU) == 3000
    assert SimulatedPromptCache().minimum_for(HAIKU) == 2048
    assert SimulatedPromptCache().minimum_for("claude-haiku-4-5-20251001") == 4096
    assert SimulatedPromptCache().minimum_for(SONNET) == 1024
    with pytest.raises(ConfigurationError, match="ttl"):
        SimulatedPromptCache(ttl=0)
    with pytest.raises(ConfigurationError, match="'gpt-4o'"):
        SimulatedPromptCache(min_tokens={"gpt-4o": 0})
    with pytest.raises(ConfigurationError, match="prompt_cache must be"):
        SimulatedProvider(prompt_cache="yes")  # type: ignore[arg-type]


def test_configuration_and_command_line() -> None:
    assert provider_options({"prompt_cache": False})["prompt_cache"] is False
    options = provider_options({"prompt_cache": {"ttl": 60, "min_tokens": {"m": 10}}})
    assert options["prompt_cache"] == SimulatedPromptCache(ttl=60, min_tokens={"m": 10})
    with pytest.raises(ConfigurationError, match="prompt_cache"):
        provider_options({"prompt_cache": {"tll": 60}})
    assert build_parser().parse_args(["--no-prompt-cache"]).no_prompt_cache is True
    assert build_parser().parse_args([]).no_prompt_cache is False


def test_cached_tokens_add_nothing_to_the_time_to_first_token() -> None:
    plain = compute_delays(PROFILE, 2000, 10)
    cached = compute_delays(PROFILE, 2000, 10, cached_tokens=1536)
    assert plain.first_token == pytest.approx(0.5 + 2.0)
    assert cached.first_token == pytest.approx(0.5 + 0.464)
    assert cached.decode == plain.decode


# ------------------------------------------------------------------------- OpenAI


@pytest.fixture
def sim() -> SimulatedProvider:
    return SimulatedProvider(latency=SimulatedLatency(default=PROFILE))


@pytest.fixture
async def oai(sim: SimulatedProvider) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sim.openai_client(max_retries=0) as client:
        yield client


@pytest.fixture
async def claude(sim: SimulatedProvider) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sim.anthropic_client(max_retries=0) as client:
        yield client


async def chat(
    client: openai.AsyncOpenAI, system: str, user: str, **options: Any
) -> tuple[int, int]:
    """One completion: (prompt_tokens, cached_tokens)."""
    reply = await client.chat.completions.create(
        model=options.pop("model", GPT),
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        **options,
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens or 0


async def test_openai_short_prompts_are_never_cached(
    sim: SimulatedProvider, oai: openai.AsyncOpenAI
) -> None:
    first = await chat(oai, SHORT, "question")
    second = await chat(oai, SHORT, "question")
    assert first == second
    assert first[0] < 1024
    assert second[1] == 0
    assert [r.cached_tokens for r in sim.requests] == [0, 0]


async def test_openai_repeated_long_prompt_is_cached_in_steps(
    sim: SimulatedProvider, oai: openai.AsyncOpenAI
) -> None:
    tokens, cold = await chat(oai, LONG, "question")
    start = anyio.current_time()
    again, warm = await chat(oai, LONG, "question")
    elapsed = anyio.current_time() - start
    assert (again, cold) == (tokens, 0)
    assert warm >= 1024
    assert (warm - 1024) % 128 == 0
    assert 0 < tokens - warm < 128 + 8  # all but the last partial step (and the priming)
    first, second = sim.requests
    assert (first.cached_tokens, second.cached_tokens) == (0, warm)
    assert (first.cache_write_tokens, second.cache_write_tokens) == (0, 0)
    assert second.prompt_tokens == tokens  # prompt_tokens still counts every token
    assert elapsed == pytest.approx(
        compute_delays(PROFILE, tokens, second.completion_tokens, cached_tokens=warm).total
    )
    stats = sim.statistics()
    assert (stats.cached_tokens, stats.cache_write_tokens) == (warm, 0)


async def test_openai_shared_prefix_is_cached_up_to_where_prompts_differ(
    oai: openai.AsyncOpenAI,
) -> None:
    await chat(oai, LONG, "alpha " * 300)
    tokens, cached = await chat(oai, LONG, "beta " * 300)
    system = count_text(LONG)
    assert tokens > system + 250
    assert system - 128 < cached <= system + 6


async def test_openai_prompt_differing_early_is_not_cached(oai: openai.AsyncOpenAI) -> None:
    await chat(oai, "Alpha. " + LONG, "question")
    assert (await chat(oai, "Beta. " + LONG, "question"))[1] == 0
    assert (await chat(oai, "Alpha. " + LONG, "question"))[1] >= 1024


async def test_openai_prompt_cache_key_scopes_the_cache(oai: openai.AsyncOpenAI) -> None:
    await chat(oai, LONG, "q", prompt_cache_key="tenant-a")
    assert (await chat(oai, LONG, "q", prompt_cache_key="tenant-b"))[1] == 0
    assert (await chat(oai, LONG, "q"))[1] == 0
    assert (await chat(oai, LONG, "q", prompt_cache_key="tenant-a"))[1] >= 1024
    assert (await chat(oai, LONG, "q", model="gpt-4o"))[1] == 0  # per model too
    with pytest.raises(openai.BadRequestError, match="prompt_cache_key"):
        await chat(oai, LONG, "q", extra_body={"prompt_cache_key": 7})


async def test_openai_entry_expires_five_minutes_after_its_last_use(
    oai: openai.AsyncOpenAI,
) -> None:
    await chat(oai, LONG, "q")
    await anyio.sleep(200)
    assert (await chat(oai, LONG, "q"))[1] > 0
    await anyio.sleep(200)  # 400 s after the write, 200 s after the hit that refreshed it
    assert (await chat(oai, LONG, "q"))[1] > 0
    await anyio.sleep(301)
    assert (await chat(oai, LONG, "q"))[1] == 0


async def test_ttl_follows_the_time_scale() -> None:
    sim = SimulatedProvider(latency=SimulatedLatency(default=PROFILE), time_scale=0.01)
    async with sim.openai_client(max_retries=0) as client:
        await chat(client, LONG, "q")
        await anyio.sleep(2.9)  # 290 simulated seconds
        assert (await chat(client, LONG, "q"))[1] > 0
        await anyio.sleep(3.1)
        assert (await chat(client, LONG, "q"))[1] == 0


async def test_concurrent_requests_miss_until_the_first_answer_begins(
    sim: SimulatedProvider, oai: openai.AsyncOpenAI
) -> None:
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(chat, oai, LONG, "q")
    assert [r.cached_tokens for r in sim.requests] == [0, 0, 0]
    assert (await chat(oai, LONG, "q"))[1] > 0


@SDK_STREAMS
async def test_openai_streamed_usage_reports_cached_tokens(oai: openai.AsyncOpenAI) -> None:
    await chat(oai, LONG, "q")
    stream = await oai.chat.completions.create(
        model=GPT,
        messages=[{"role": "system", "content": LONG}, {"role": "user", "content": "q"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= 1024


async def test_switched_off_nothing_is_cached() -> None:
    sim = SimulatedProvider(prompt_cache=False)
    async with sim.openai_client(max_retries=0) as client:
        await chat(client, LONG, "q")
        assert (await chat(client, LONG, "q"))[1] == 0
    assert sim.statistics().cached_tokens == 0


async def test_reset_empties_the_cache(sim: SimulatedProvider, oai: openai.AsyncOpenAI) -> None:
    await chat(oai, LONG, "q")
    sim.reset()
    assert (await chat(oai, LONG, "q"))[1] == 0


# ---------------------------------------------------------------------- Anthropic

EPHEMERAL = {"type": "ephemeral"}


def marked_system(text: str) -> Any:
    return [{"type": "text", "text": text, "cache_control": EPHEMERAL}]


async def message(
    client: anthropic.AsyncAnthropic, system: Any, user: str = "question", **options: Any
) -> Any:
    reply = await client.messages.create(
        model=options.pop("model", SONNET),
        max_tokens=100,
        system=system,
        messages=[{"role": "user", "content": user}],
        **options,
    )
    return reply.usage


def split(usage: Any) -> tuple[int, int, int]:
    return (
        usage.input_tokens,
        usage.cache_creation_input_tokens or 0,
        usage.cache_read_input_tokens or 0,
    )


async def test_anthropic_caches_nothing_without_cache_control(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    await message(claude, LONG)
    usage = await message(claude, LONG)
    assert split(usage) == (sim.requests[-1].prompt_tokens, 0, 0)
    assert sim.statistics().cached_tokens == sim.statistics().cache_write_tokens == 0


async def test_anthropic_marked_prefix_below_the_models_minimum_is_not_cached(
    claude: anthropic.AsyncAnthropic,
) -> None:
    assert 1024 < count_text(LONG) < 2048
    for _ in range(2):
        assert split(await message(claude, marked_system(LONG), model=HAIKU))[1:] == (0, 0)
        assert split(await message(claude, marked_system(SHORT)))[1:] == (0, 0)
    # The same prefix is long enough for Sonnet.
    assert split(await message(claude, marked_system(LONG)))[1] == count_text(LONG)


async def test_anthropic_writes_then_reads_the_marked_prefix(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    prefix = count_text(LONG)
    first = split(await message(claude, marked_system(LONG), "one question"))
    start = anyio.current_time()
    second = split(await message(claude, marked_system(LONG), "another question"))
    elapsed = anyio.current_time() - start
    assert first[1:] == (prefix, 0)
    assert second[1:] == (0, prefix)
    one, two = sim.requests
    assert first[0] == one.prompt_tokens - prefix  # input_tokens: the rest only
    assert second[0] == two.prompt_tokens - prefix
    assert (one.cached_tokens, one.cache_write_tokens) == (0, prefix)
    assert (two.cached_tokens, two.cache_write_tokens) == (prefix, 0)
    stats = sim.statistics()
    assert (stats.cached_tokens, stats.cache_write_tokens) == (prefix, prefix)
    assert elapsed == pytest.approx(
        compute_delays(
            PROFILE, two.prompt_tokens, two.completion_tokens, cached_tokens=prefix
        ).total
    )


async def test_anthropic_cache_order_is_tools_system_messages(
    claude: anthropic.AsyncAnthropic,
) -> None:
    def tool(name: str) -> dict[str, Any]:
        return {"name": name, "input_schema": {"type": "object"}}

    assert split(await message(claude, marked_system(LONG), tools=[tool("a")]))[2] == 0
    assert split(await message(claude, marked_system(LONG), tools=[tool("a")]))[2] > 0
    # A different tool comes before the system prompt: the prefix differs.
    assert split(await message(claude, marked_system(LONG), tools=[tool("b")]))[2] == 0
    # A breakpoint on the tool alone: too short to cache by itself.
    marked_tool = {**tool("c"), "cache_control": EPHEMERAL}
    assert split(await message(claude, LONG, tools=[marked_tool]))[1:] == (0, 0)


async def test_anthropic_earlier_breakpoint_is_read_and_the_rest_written(
    claude: anthropic.AsyncAnthropic,
) -> None:
    await message(claude, marked_system(LONG))
    system = [
        {"type": "text", "text": LONG, "cache_control": EPHEMERAL},
        {"type": "text", "text": SHORT, "cache_control": EPHEMERAL},
    ]
    _, written, read = split(await message(claude, system))
    assert read == count_text(LONG)
    assert written == count_text(SHORT)


async def test_anthropic_refuses_invalid_cache_control(claude: anthropic.AsyncAnthropic) -> None:
    block = {"type": "text", "text": "x", "cache_control": EPHEMERAL}
    with pytest.raises(anthropic.BadRequestError, match="maximum of 4 blocks"):
        await message(claude, [block] * 5)
    wrong = [{"type": "text", "text": "x", "cache_control": {"type": "forever"}}]
    with pytest.raises(anthropic.BadRequestError, match="ephemeral"):
        await message(claude, wrong)


async def test_anthropic_streamed_usage_reports_the_cache(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    prefix = count_text(LONG)
    starts = []
    for _ in range(2):
        async with claude.messages.stream(
            model=SONNET,
            max_tokens=100,
            system=marked_system(LONG),
            messages=[{"role": "user", "content": "q"}],
        ) as stream:
            async for event in stream:
                if event.type == "message_start":
                    starts.append(split(event.message.usage))
            final = await stream.get_final_message()
    rest = sim.requests[-1].prompt_tokens - prefix
    assert starts == [(rest, prefix, 0), (rest, 0, prefix)]
    assert split(final.usage) == (rest, 0, prefix)
    assert [r.stream for r in sim.requests] == [True, True]


async def test_anthropic_entry_expires_five_minutes_after_its_last_use(
    claude: anthropic.AsyncAnthropic,
) -> None:
    assert split(await message(claude, marked_system(LONG)))[2] == 0
    # The entry was written when the first token was out, within a second of the end.
    await anyio.sleep(299)
    assert split(await message(claude, marked_system(LONG)))[2] > 0
    await anyio.sleep(299)  # refreshed by the hit
    assert split(await message(claude, marked_system(LONG)))[2] > 0
    await anyio.sleep(301)
    assert split(await message(claude, marked_system(LONG)))[1:] == (count_text(LONG), 0)


async def test_anthropic_caches_per_api_key(sim: SimulatedProvider) -> None:
    async with contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(sim.anthropic_client(api_key="k1"))
        two = await stack.enter_async_context(sim.anthropic_client(api_key="k2"))
        await message(one, marked_system(LONG))
        assert split(await message(two, marked_system(LONG)))[2] == 0
        assert split(await message(one, marked_system(LONG)))[2] > 0


async def test_batch_lines_read_what_earlier_lines_wrote(
    sim: SimulatedProvider, claude: anthropic.AsyncAnthropic
) -> None:
    params = {
        "model": SONNET,
        "max_tokens": 50,
        "system": marked_system(LONG),
        "messages": [{"role": "user", "content": "q"}],
    }
    requests: Any = [{"custom_id": f"r{n}", "params": params} for n in range(3)]
    batch = await claude.messages.batches.create(requests=requests)
    prefix = count_text(LONG)
    assert [(r.cache_write_tokens, r.cached_tokens) for r in sim.requests] == [
        (prefix, 0),
        (0, prefix),
        (0, prefix),
    ]
    while batch.processing_status != "ended":
        await anyio.sleep(1)
        batch = await claude.messages.batches.retrieve(batch.id)
    results = [r async for r in await claude.messages.batches.results(batch.id)]
    usages = [split(r.result.message.usage)[1:] for r in results]  # type: ignore[union-attr]
    assert usages == [(prefix, 0), (0, prefix), (0, prefix)]
