"""Streaming split: do short answers come back before a long neighbour is written?

A group of 16 items, one of whose outputs is 20x longer than the others (a rambling
complaint among one-liners), goes through ``coalesce.prompt`` to the simulated
provider over real HTTP with the official openai SDK. We compare the mean latency of
the 15 short items with the streaming split (each caller resolved as soon as its own
result is complete) against without it (everyone waits for the whole reply).

Run: ``python benchmarks/bench_streaming.py [--time-scale 0.5]``. Ratios do not depend
on the time scale; the absolute times do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Literal

import anyio
from pydantic import BaseModel

import coalesce
from coalesce.testing import LatencyModel, LatencyProfile, SimulatedProvider

SHORT_TOKENS = 20
LONG_TOKENS = 20 * SHORT_TOKENS
ITEMS = 16


class Reply(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    answer: str


def tickets(long_first: bool) -> list[str]:
    short = [f"ticket {n}: the app logs me out" for n in range(ITEMS - 1)]
    long = "ticket 99: " + " ".join(["I have been a customer for years and"] * 12)
    return [long, *short] if long_first else [*short, long]


def output_tokens(item: Any) -> int:
    return LONG_TOKENS if str(item).startswith("ticket 99") else SHORT_TOKENS


async def one_group(url: str, sim: SimulatedProvider, stream: bool, long_first: bool) -> float:
    async with sim.openai_client(url) as client:

        @coalesce.prompt(client=client, model="gpt-4o-mini", max_items=ITEMS, stream=stream)
        async def answer(ticket: str) -> Reply:
            """Categorise the ticket and draft a one-paragraph answer."""

        done: dict[str, float] = {}
        start = time.perf_counter()

        async def call(ticket: str) -> None:
            await answer(ticket)
            done[ticket] = time.perf_counter() - start

        async with anyio.create_task_group() as tg:
            for ticket in tickets(long_first):
                tg.start_soon(call, ticket)
        await answer.aclose()
    return statistics.fmean(t for ticket, t in done.items() if not ticket.startswith("ticket 99"))


async def main(time_scale: float, rounds: int) -> None:
    sim = SimulatedProvider(
        time_scale=time_scale,
        output_tokens=output_tokens,
        latency=LatencyModel(
            default=LatencyProfile(ttft=0.35, prompt_token_seconds=0.0, tokens_per_second=80)
        ),
    )
    rows = []
    async with sim.serve_async() as url:
        # The caller's order does not matter: coalesce puts short inputs first.
        for long_first in (True, False):
            with_split = [await one_group(url, sim, True, long_first) for _ in range(rounds)]
            without = [await one_group(url, sim, False, long_first) for _ in range(rounds)]
            rows.append((long_first, statistics.median(with_split), statistics.median(without)))
    print(
        f"{ITEMS} items per group, one output {LONG_TOKENS} tokens, the others {SHORT_TOKENS};"
        f" simulated provider over HTTP (TTFT 0.35 s, 80 tokens/s, time scale {time_scale});"
        f" median of {rounds} rounds\n"
    )
    print(
        "| long item submitted | mean latency of the 15 short items: streaming split | without | ratio |"
    )
    print("|---|---:|---:|---:|")
    for long_first, streamed, plain in rows:
        where = "first" if long_first else "last"
        print(f"| {where} | {streamed:.3f} s | {plain:.3f} s | {streamed / plain:.2f}x |")
    worst = max(streamed / plain for _, streamed, plain in rows)
    print(f"\nTarget <= 0.5x: {'HOLDS' if worst <= 0.5 else 'FAILS'} (worst {worst:.2f}x)")


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    anyio.run(main, args.time_scale, args.rounds)
