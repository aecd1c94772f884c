"""``f.map(items)``: many items at once, on virtual time (asyncio and trio)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from _threads import Tag, expected, tickets

import coalesce
from coalesce import CoalesceError, ConfigurationError
from coalesce._sync.bulk import REQUESTS_AHEAD, MapCall, default_concurrency
from coalesce.providers import CallableProvider, CompletionRequest
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


def make_tag(sim: SimulatedProvider, **options: Any) -> coalesce.PromptFunction[[str], Tag]:
    @coalesce.prompt(client=sim.openai_client(max_retries=0), model="gpt-4o-mini", **options)
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket with its category and urgency."""

    return tag


async def test_2000_items_at_a_2s_budget_each_answered_in_order() -> None:
    """Every item answered or given its own error, in input order, and none waited in
    coalesce's own queue: at most ``concurrency`` calls are in flight, each started when
    a slot freed, so no budget is spent queued behind the first requests (gathered at
    once, 2,000 calls put 420 requests on the wire at the same moment)."""
    sim = SimulatedProvider()  # its default latency: free on virtual time
    tag = make_tag(sim, latency_budget=2.0)
    items = tickets(2000)
    progress: list[tuple[int, int]] = []
    results = await tag.map(items, on_progress=lambda done, total: progress.append((done, total)))
    await tag.aclose()
    answered = [result for result in results if not isinstance(result, Exception)]
    for item, result in zip(items, results, strict=True):
        assert isinstance(result, CoalesceError) or result == expected(sim, item)
    assert len(answered) >= 0.99 * len(items)
    assert progress == [(done, 2000) for done in range(1, 2001)]
    stats = tag.statistics()
    assert stats.calls == 2000
    assert stats.wait_p99 <= 0.25 * 2.0  # arrival to first request: never the budget
    assert tag.batcher_statistics().queue_depth == 0


class Calls:
    """A fake call of ``map``: item ``i`` takes ``durations[i]`` seconds; records when
    each starts and ends, and how many run at once."""

    def __init__(self, durations: list[float], fail: frozenset[int] = frozenset()) -> None:
        self.durations = durations
        self.fail = fail
        self.started: list[int] = []
        self.finished: list[int] = []
        self.cancelled: list[int] = []
        self.running = 0
        self.most = 0

    async def __call__(self, index: int) -> str:
        self.started.append(index)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(self.durations[index])
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(index)
            raise
        finally:
            self.running -= 1
        self.finished.append(index)
        if index in self.fail:
            raise ValueError(f"item {index} failed")
        return f"result {index}"


async def test_a_moving_limit_is_followed_as_calls_finish() -> None:
    """``concurrency`` given as a function is read again as calls finish: the calls in
    flight grow with it and shrink with it, and none starts above it."""
    calls = Calls([1.0] * 120)
    limits = {0: 4, 20: 10, 70: 2}

    def limit() -> int:
        return limits[max(done for done in limits if done <= len(calls.finished))]

    seen: list[tuple[int, int]] = []

    async def call(index: int) -> str:
        seen.append((calls.running + 1, limit()))
        return await calls(index)

    results = await MapCall(call, 120, concurrency=limit)
    assert results == [f"result {index}" for index in range(120)]
    assert all(running <= most for running, most in seen)
    assert calls.most == 10
    assert [running for running, _ in seen[-10:]] == [2] * 10  # shrunk back to 2


async def test_map_keeps_whole_groups_in_flight_as_the_cap_is_learned() -> None:
    """With instructions so short that packing pays only from 6 items, the learned cap
    stands at 6; the default ``concurrency`` follows the cap (16 groups' worth, not 16
    times the default 4 = 64 calls), so every wave is whole groups: no call is left over
    in a group too small to pay and sent plain. (The function's first calls, a cold
    burst, are a map of their own: what is measured is the map once the cap is known.)"""
    sim = SimulatedProvider()

    @coalesce.prompt(
        client=sim.openai_client(max_retries=0), model="gpt-4o-mini", latency_budget=2.0
    )
    async def tag(ticket: str) -> Tag:
        """Tag it."""

    await tag.map(tickets(20, prefix="warm"))
    before = tag.statistics()
    assert before.group_cap == before.smallest_paying_group == 6
    items = tickets(480)
    results = await tag.map(items)
    await tag.aclose()
    assert results == [expected(sim, item) for item in items]
    stats = tag.statistics()
    below = stats.plain_calls.get("below_paying", 0) - before.plain_calls.get("below_paying", 0)
    assert below == 0
    assert stats.requests - before.requests - stats.shadow_requests <= 480 // 6


async def test_at_most_concurrency_calls_run_and_they_start_in_input_order() -> None:
    calls = Calls([float(index % 7 + 1) for index in range(50)])
    results = await MapCall(calls, 50, concurrency=8)
    assert results == [f"result {index}" for index in range(50)]
    assert calls.most == 8
    assert calls.started == list(range(50))


async def test_iteration_yields_pairs_in_input_order_or_as_they_finish() -> None:
    durations = [5.0, 1.0, 3.0, 2.0, 4.0]
    ordered = [pair async for pair in MapCall(Calls(durations), 5, concurrency=5)]
    assert ordered == [(index, f"result {index}") for index in range(5)]
    unordered = [pair async for pair in MapCall(Calls(durations), 5, concurrency=5, ordered=False)]
    assert [index for index, _ in unordered] == [1, 3, 2, 4, 0]


async def test_a_failed_call_leaves_its_exception_in_its_place() -> None:
    results = await MapCall(Calls([1.0] * 4, fail=frozenset({2})), 4, concurrency=2)
    assert results[:2] == ["result 0", "result 1"]
    assert isinstance(results[2], ValueError)
    assert str(results[2]) == "item 2 failed"
    assert results[3] == "result 3"


async def test_return_exceptions_false_raises_the_first_failure_and_cancels_the_rest() -> None:
    calls = Calls([1.0, 5.0, 5.0, 5.0], fail=frozenset({0}))
    with pytest.raises(ValueError, match="item 0 failed"):
        await MapCall(calls, 4, concurrency=2, return_exceptions=False)
    await anyio.sleep(10)
    assert calls.started == [0, 1, 2]  # 2 took 0's slot before 0's failure was read
    assert sorted(calls.cancelled) == [1, 2]


async def test_leaving_the_loop_early_cancels_the_calls_in_flight() -> None:
    calls = Calls([1.0, 2.0, 3.0, 4.0, 5.0])
    async for index, _ in MapCall(calls, 5, concurrency=3, ordered=False):
        assert index == 0
        break
    await anyio.sleep(10)
    assert calls.finished == [0]
    assert sorted(calls.cancelled) == [1, 2, 3]
    assert calls.started == [0, 1, 2, 3]


async def test_progress_is_told_as_each_call_finishes() -> None:
    seen: list[tuple[int, int]] = []
    await MapCall(Calls([3.0, 1.0, 2.0]), 3, concurrency=3, on_progress=lambda *n: seen.append(n))
    assert seen == [(1, 3), (2, 3), (3, 3)]


async def test_no_items_give_no_results() -> None:
    assert await MapCall(Calls([]), 0, concurrency=4) == []


@pytest.mark.parametrize("concurrency", [0, -1, 1.5, True])
async def test_concurrency_must_be_a_positive_integer(concurrency: Any) -> None:
    with pytest.raises(ConfigurationError, match="concurrency must be a positive integer"):
        MapCall(Calls([]), 0, concurrency=concurrency)


async def test_progress_must_be_true_false_or_always() -> None:
    with pytest.raises(ConfigurationError, match="progress must be True, False or 'always'"):
        MapCall(Calls([]), 0, concurrency=1, progress="yes")  # type: ignore[arg-type]


async def test_each_call_has_its_whole_budget_from_its_own_start() -> None:
    """Five calls one at a time, 1.5 s each, at a 2 s budget: 7.5 s in all, and none
    is late, as the items not yet started are not yet counting."""

    async def slow(request: CompletionRequest) -> str:
        await anyio.sleep(1.5)
        return "fine"

    @coalesce.prompt(client=CallableProvider(slow), model="m", latency_budget=2.0, max_items=1)
    async def ask(question: str) -> str:
        """Answer the question."""

    start = anyio.current_time()
    results = await ask.map([f"question {index}" for index in range(5)], concurrency=1)
    assert results == ["fine"] * 5
    assert anyio.current_time() - start == pytest.approx(7.5, abs=0.1)
    assert ask.statistics().budget_misses == 0
    await ask.aclose()


async def test_an_item_is_the_argument_or_a_tuple_or_dict_of_arguments() -> None:
    asked: list[str] = []

    async def echo(request: CompletionRequest) -> str:
        asked.append(request.user)
        return "ok"

    provider = CallableProvider(echo)

    @coalesce.prompt(client=provider, model="m", max_items=1, max_wait=0.0)
    async def one(pair: tuple[int, int]) -> str:
        """Add the pair."""

    @coalesce.prompt(client=provider, model="m", max_items=1, max_wait=0.0)
    async def two(a: int, b: int) -> str:
        """Add a and b."""

    assert await one.map([(1, 2)]) == ["ok"]
    assert await two.map([(1, 2), {"a": 3, "b": 4}]) == ["ok", "ok"]
    assert json.loads(asked[0]) == [1, 2]  # one parameter: the tuple is the item
    assert sorted(asked[1:]) == ['{"a":1,"b":2}', '{"a":3,"b":4}']
    mistaken = await two.map([(1,)])
    assert isinstance(mistaken[0], TypeError)  # its own error, in its place
    for function in (one, two):
        await function.aclose()


async def test_the_default_concurrency_fills_the_requests_that_may_run() -> None:
    assert default_concurrency(4, None) == 4 * REQUESTS_AHEAD
    assert default_concurrency(10, 3) == 30
    calls: list[int] = []

    async def count(request: CompletionRequest) -> str:
        calls.append(1)
        await anyio.sleep(1.0)
        return "ok"

    @coalesce.prompt(client=CallableProvider(count), model="m", max_items=1, max_concurrency=3)
    async def ask(question: str) -> str:
        """Answer the question."""

    the_map = ask.map([f"q{index}" for index in range(7)])
    assert "3 in flight at most" in repr(the_map)
    assert await the_map == ["ok"] * 7
    await ask.aclose()


async def test_the_bar_is_labelled_with_the_functions_own_name() -> None:
    """A function defined inside another is ``main.<locals>.tag`` to Python; its bar says
    ``tag``."""
    sim = SimulatedProvider()
    tag = make_tag(sim)  # defined inside make_tag
    assert "<locals>" in tag.__qualname__
    mapped = tag.map(["a"])
    assert mapped.label == "tag"
    assert await mapped == [expected(sim, "a")]
    await tag.aclose()
