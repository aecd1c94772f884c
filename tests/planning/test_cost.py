"""Packing only where it pays (issue 13, point 3).

The decision is pure (:mod:`coalesce._planning.cost`), tested with hand-built
footprints; then through ``@coalesce.prompt`` and ``coalesce.wrap`` on the simulated
provider, on virtual time.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel

import coalesce
from coalesce import Price
from coalesce._planning.cost import packing_saves, smallest_paying_group
from coalesce._planning.footprint import Footprint
from coalesce.testing import SimulatedProvider

ROUND = Price(input_per_mtok=1.0, output_per_mtok=4.0)


def test_packing_pays_from_the_group_whose_shared_saving_covers_the_frames() -> None:
    # Each plain call pays 71 shared tokens; a packed item adds 21 in and 4 out (16 at
    # the 4x output price): 34 saved per item, against 151 shared once: 5 items pay.
    footprint = Footprint(shared=151, plain_shared=71, item_frame=21, answer_frame=4)
    assert smallest_paying_group(footprint, ROUND, max_items=8) == 5
    assert packing_saves(footprint, ROUND, 4) == 4 * 34 - 151 < 0
    assert packing_saves(footprint, ROUND, 5) == 5 * 34 - 151 > 0
    assert smallest_paying_group(footprint, ROUND, max_items=4) is None  # 5 > max_items


def test_short_instructions_never_pay() -> None:
    footprint = Footprint(shared=97, plain_shared=8, item_frame=21, answer_frame=4)
    assert smallest_paying_group(footprint, ROUND, max_items=64) is None
    assert packing_saves(footprint, ROUND, 64) < 0


def test_long_instructions_pay_from_two_and_the_price_ratio_matters() -> None:
    footprint = Footprint(shared=1135, plain_shared=1055, item_frame=21, answer_frame=4)
    assert smallest_paying_group(footprint, ROUND, max_items=8) == 2
    # Output priced at 300x input: each answer's 4-token frame outweighs the saving.
    dear_output = Price(input_per_mtok=1.0, output_per_mtok=300.0)
    assert smallest_paying_group(footprint, dear_output, max_items=8) is None
    # Unknown price: the usual 4x ratio.
    assert smallest_paying_group(footprint, None, max_items=8) == 2


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: int


async def burst(fn: Any, n: int, text: str = "ticket", *, close: bool = True) -> list[float]:
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = anyio.current_time()
        await fn(f"{text} {i}")
        latencies.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    if close:
        await fn.aclose()
    return latencies


@pytest.mark.anyio
async def test_a_function_whose_packing_cannot_pay_sends_its_calls_plain_at_once() -> None:
    sim = SimulatedProvider()
    with pytest.warns(coalesce.CoalesceWarning, match="packing cannot pay"):

        @coalesce.prompt(client=sim.openai_client(), model="gpt-4o-mini", max_wait=0.5)
        async def summarise(text: str) -> str:
            """Summarise."""

    latencies = await burst(summarise, 6)
    assert [r.items for r in sim.requests] == [1] * 6
    # No wait for company: the 0.5 s window was never waited.
    alone = SimulatedProvider()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", coalesce.CoalesceWarning)

        @coalesce.prompt(client=alone.openai_client(), model="gpt-4o-mini", max_items=1)
        async def one_by_one(text: str) -> str:
            """Summarise."""

    baseline = await burst(one_by_one, 6)
    assert max(latencies) == pytest.approx(max(baseline), abs=0.01)


@pytest.mark.anyio
async def test_a_group_too_small_to_pay_goes_plain_and_a_large_one_packed() -> None:
    sim = SimulatedProvider()

    @coalesce.prompt(client=sim.openai_client(), model="gpt-4o-mini", max_wait=0.1, max_items=8)
    async def tag(ticket: str) -> Tag:
        """Tag the support ticket with a category and an urgency from 1 to 5."""

    assert tag._engine.pays_from == 5
    await burst(tag, 3, close=False)
    assert [r.items for r in sim.requests] == [1, 1, 1]
    await burst(tag, 8)
    assert [r.items for r in sim.requests][3:] == [8]


@pytest.mark.anyio
async def test_packing_always_packs_what_auto_would_not() -> None:
    sim = SimulatedProvider()

    @coalesce.prompt(client=sim.openai_client(), model="gpt-4o-mini", packing="always")
    async def summarise(text: str) -> str:
        """Summarise."""

    await burst(summarise, 4)
    assert [r.items for r in sim.requests] == [4]


def test_packing_must_be_auto_or_always() -> None:
    with pytest.raises(coalesce.ConfigurationError, match="packing must be 'auto' or 'always'"):

        @coalesce.prompt(client=SimulatedProvider().openai_client(), model="m", packing="yes")  # type: ignore[arg-type]
        async def f(text: str) -> str:
            """F."""


@pytest.mark.anyio
async def test_wrap_passes_calls_through_when_packing_cannot_pay() -> None:
    def chat(i: int) -> dict[str, Any]:
        return {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"question {i}"},
            ],
        }

    async def ask_all(client: Any) -> None:
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(lambda i=i: client.chat.completions.create(**chat(i)))

    plain = SimulatedProvider()
    await ask_all(plain.openai_client(max_retries=0))
    sim = SimulatedProvider()
    client: Any = coalesce.wrap(sim.openai_client(max_retries=0), max_wait=0.5)
    with pytest.warns(coalesce.CoalesceWarning, match="packing cannot pay"):
        await ask_all(client)
    # Sent as the application wrote them: the same requests as without coalesce.
    assert sorted(r.prompt_tokens for r in sim.requests) == sorted(
        r.prompt_tokens for r in plain.requests
    )
    assert [r.items for r in sim.requests] == [1] * 5
    assert all(stats.calls == 0 for stats in client.statistics().values())
    await client.aclose()
