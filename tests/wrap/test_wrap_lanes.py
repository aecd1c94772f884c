"""The drop-in client's lanes (issue 23): ``x-coalesce-lane`` per call (else
``wrap(lane=...)``) through the lane router: flex at half the price, falling back to
real time where flex refuses; the batch lane on its durable store. Each caller gets its
own answer in the SDK's own type. On the simulated provider, on virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _wrapping import chat, gather, msg

import coalesce
from coalesce.testing import BatchTiming, FlexProcessing, SimulatedProvider, expected_output

pytestmark = pytest.mark.anyio

TIMING = BatchTiming(validating=1.0, per_request=1.0, finalizing=1.0)
N = 6


#: A batch-lane caller waits for its job: its own time limit must be long enough.
DAY = 86400.0
#: The batch lane's tests run on trio's virtual clock, which the conftest holds still
#: while the store's worker threads run; asyncio's (looptime) jumps to the next timer,
#: the caller's own time limit, while a thread works.
on_trio = pytest.mark.parametrize("anyio_backend", ["trio"], indirect=True)


def lane(name: str) -> dict[str, Any]:
    return {"extra_headers": {"x-coalesce-lane": name}}


def tiers(sim: SimulatedProvider) -> list[str | None]:
    return [record.service_tier for record in sim.requests]


async def test_flex_by_header_packs_the_calls_each_its_own_answer() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    client = coalesce.wrap(sim.openai_client(), max_items=N, packing="always", batch_window=1.0)
    async with client:
        raws = await gather(
            N,
            lambda i: client.chat.completions.with_raw_response.create(
                **chat(f"text {i}"), **lane("flex")
            ),
        )
    replies = [raw.parse() for raw in raws]
    assert [r.choices[0].message.content for r in replies] == [
        expected_output(f"text {i}") for i in range(N)
    ]
    assert tiers(sim) == ["flex"]  # one packed flex request
    assert {raw.headers["x-coalesce-lane"] for raw in raws} == {"flex"}
    assert {raw.headers["x-coalesce-group-size"] for raw in raws} == {str(N)}
    used = sum(r.usage.prompt_tokens for r in replies)
    assert used == sim.requests[0].prompt_tokens  # the shares add up to the request's


async def test_a_call_flex_refuses_is_answered_in_real_time() -> None:
    # A refusal for capacity with no budget left for flex's promise: real time at once.
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0, script=[True]))
    client = coalesce.wrap(sim.openai_client(), max_items=N, packing="always", batch_window=1.0)
    async with client:
        raws = await gather(
            N,
            lambda i: client.chat.completions.with_raw_response.create(
                **chat(f"text {i}"),
                extra_headers={"x-coalesce-lane": "flex", "x-coalesce-budget": "60"},
            ),
        )
    replies = [raw.parse() for raw in raws]
    assert [r.choices[0].message.content for r in replies] == [
        expected_output(f"text {i}") for i in range(N)
    ]
    assert tiers(sim) == ["flex", "default"]  # refused, then one real-time request
    assert {raw.headers["x-coalesce-lane"] for raw in raws} == {"realtime"}
    assert sum(r.usage.prompt_tokens for r in replies) == sim.requests[1].prompt_tokens


async def test_wraps_lane_is_the_default_and_the_header_wins() -> None:
    sim = SimulatedProvider(flex=FlexProcessing(unavailable=0))
    client = coalesce.wrap(sim.openai_client(), lane="flex", batch_window=0.5, packing="always")
    async with client:
        await client.chat.completions.create(**chat("a"))
        await client.chat.completions.create(**chat("b"), **lane("realtime"))
    assert tiers(sim) == ["flex", "default"]


@on_trio
async def test_batch_by_header_on_the_store_and_again_from_the_store(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    store = tmp_path / "jobs.sqlite3"
    options: dict[str, Any] = {"max_items": 3, "packing": "always", "batch_window": 5.0}
    client = coalesce.wrap(sim.openai_client(), store=store, poll_interval=2.0, **options)
    async with client:
        raws = await gather(
            N,
            lambda i: client.chat.completions.with_raw_response.create(
                **chat(f"text {i}"), **lane("batch"), timeout=DAY
            ),
        )
    replies = [raw.parse() for raw in raws]
    assert [r.choices[0].message.content for r in replies] == [
        expected_output(f"text {i}") for i in range(N)
    ]
    assert sim.requests == [] or all(r.service_tier is None for r in sim.requests)
    assert len(sim.batch_submissions) == 1
    assert sum(len(s.custom_ids) for s in sim.batch_submissions) == 2  # 6 items, 3 to a line
    assert {raw.headers["x-coalesce-lane"] for raw in raws} == {"batch"}
    assert {raw.headers["x-coalesce-group-size"] for raw in raws} == {"3"}
    assert all(r.usage.prompt_tokens > 0 for r in replies)
    # Another client on the same store: its answers from the store, nothing submitted.
    again = coalesce.wrap(sim.openai_client(), store=store, **options)
    async with again:
        texts = await gather(
            N,
            lambda i: again.chat.completions.create(
                **chat(f"text {i}"), **lane("batch"), timeout=DAY
            ),
        )
    assert [t.choices[0].message.content for t in texts] == [
        expected_output(f"text {i}") for i in range(N)
    ]
    assert len(sim.batch_submissions) == 1


@on_trio
async def test_partitions_never_share_a_batch_line_nor_a_stored_answer(tmp_path: Path) -> None:
    sim = SimulatedProvider(batches=TIMING)
    options: dict[str, Any] = {"max_items": 4, "packing": "always", "batch_window": 5.0}
    client = coalesce.wrap(sim.openai_client(), store=tmp_path / "jobs.sqlite3", **options)

    def ask(i: int) -> Any:
        headers = {"x-coalesce-lane": "batch", "x-coalesce-partition": f"tenant-{i % 2}"}
        return client.chat.completions.create(
            **chat("same text"), extra_headers=headers, timeout=DAY
        )

    async with client:
        replies = await gather(2, ask)
    assert [r.choices[0].message.content for r in replies] == [expected_output("same text")] * 2
    assert sum(len(s.custom_ids) for s in sim.batch_submissions) == 2  # one line per tenant


async def test_a_lane_the_provider_lacks_or_no_lane_is_refused_by_name() -> None:
    sim = SimulatedProvider()
    wrapped = coalesce.wrap(sim.anthropic_client(), packing="always")
    with pytest.raises(coalesce.ConfigurationError, match="lane='flex' is not offered"):
        await wrapped.messages.create(**msg("a"), **lane("flex"))
    with pytest.raises(coalesce.ConfigurationError, match="x-coalesce-lane header must be"):
        await wrapped.messages.create(**msg("a"), **lane("later"))
    await wrapped.aclose()
    with pytest.raises(coalesce.ConfigurationError, match="lane='flex' is not offered"):
        coalesce.wrap(sim.anthropic_client(), lane="flex")
