"""A cold burst of free-text calls (issue 24, item 2): how many requests 40 calls made at
once take, and how many answer within a 2 s budget, on a provider faster than the
latency prior.

40 calls arrive at the same instant, each a fresh process's first: a function that
returns free text (``-> str`` through ``@coalesce.prompt``; plain-text chat calls through
``coalesce.wrap``), a 2 s latency budget, a fresh ``$COALESCE_STORE`` (nothing learned
before). The server is ``coalesce simulate`` in its own process, over HTTP, answering a
plain call in about 0.4 s (``--ttft``, ``--tokens-per-second``, ``--answer-tokens``). The
default prior expects 1.6 s for one free-text answer, so no group fits it: the first call
goes alone as a probe and the others wait for its reply, then go in groups sized from
what it taught, at most the group cap (4 until one is learned, or ``max_items=``).

Arms, side by side: plain calls (one request each, no coalesce), each surface at
default options, and each with ``max_items=5`` and ``max_items=20``. Per arm: requests,
the items of each in the order sent, the share within budget, p50 and max latency.

Run: ``python benchmarks/bench_cold.py [--calls 40] [--budget 2]``; about half a minute.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

import anyio
import httpx
import openai

import coalesce
from coalesce._demo import simulated_provider

MODEL = "gpt-4o-mini"
INSTRUCTIONS = "You are a support assistant. " + (
    "Answer the customer's question in one short sentence, citing the policy where it applies. "
    * 12
)

Call = Callable[[int], Awaitable[str]]


def question(n: int) -> str:
    return f"Question {n}: how do I reset my password on the mobile app?"


async def burst(calls: int, one: Call) -> list[float]:
    """``calls`` calls at once; each one's latency (inf if it failed)."""
    latencies = [0.0] * calls

    async def timed(n: int) -> None:
        start = time.monotonic()
        try:
            await one(n)
        except coalesce.CoalesceError:
            latencies[n] = float("inf")
        else:
            latencies[n] = time.monotonic() - start

    async with anyio.create_task_group() as tg:
        for n in range(calls):
            tg.start_soon(timed, n)
    return latencies


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)


async def chat(client: Any, n: int) -> str:
    """Question ``n`` as a chat call with the shared instructions; the reply's text."""
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": question(n)},
        ],
    )
    return str(reply.choices[0].message.content or "")


async def plain(url: str, calls: int, budget: float, options: dict[str, Any]) -> list[float]:
    client = sdk(url)
    try:
        return await burst(calls, lambda n: chat(client, n))
    finally:
        await client.close()


async def prompt(url: str, calls: int, budget: float, options: dict[str, Any]) -> list[float]:
    client = sdk(url)

    @coalesce.prompt(
        client=client, model=MODEL, instructions=INSTRUCTIONS, latency_budget=budget, **options
    )
    async def answer(text: str) -> str:  # type: ignore[empty-body]
        """(instructions= above)"""

    try:
        return await burst(calls, lambda n: answer(question(n)))
    finally:
        await answer.aclose()  # leaves the client to its owner
        await client.close()


async def wrap(url: str, calls: int, budget: float, options: dict[str, Any]) -> list[float]:
    client = coalesce.wrap(sdk(url), latency_budget=budget, **options)
    try:
        return await burst(calls, lambda n: chat(client, n))
    finally:
        await client.aclose()


ARMS: list[tuple[str, Callable[..., Awaitable[list[float]]], dict[str, Any]]] = [
    ("plain calls (no coalesce)", plain, {}),
    ("prompt, default options", prompt, {}),
    ("prompt, max_items=5", prompt, {"max_items": 5}),
    ("prompt, max_items=20", prompt, {"max_items": 20}),
    ("wrap, default options", wrap, {}),
    ("wrap, max_items=5", wrap, {"max_items": 5}),
    ("wrap, max_items=20", wrap, {"max_items": 20}),
]


async def sizes(url: str) -> list[int]:
    async with httpx.AsyncClient(base_url=url) as http:
        records = (await http.get("/_sim/stats")).json()["requests"]
        await http.post("/_sim/reset")
    return [int(r["items"]) for r in sorted(records, key=lambda r: r["started_at"])]


async def main(args: argparse.Namespace) -> None:
    latency = {
        "default": {
            "ttft": args.ttft,
            "prompt_token_seconds": 1e-4,
            "tokens_per_second": args.tokens_per_second,
        }
    }
    with simulated_provider(latency=latency, output_tokens=args.answer_tokens) as url:
        await sizes(url)
        print(
            f"{args.calls} free-text calls at once, latency_budget={args.budget:g} s, a fresh"
            f" store each; coalesce simulate over HTTP (ttft {args.ttft} s,"
            f" {args.tokens_per_second:g} tokens/s, answers of {args.answer_tokens} tokens)\n"
        )
        print("| arm | requests | items per request, in order | within budget | p50 | max |")
        print("|---|---:|---|---:|---:|---:|")
        for name, arm, options in ARMS:
            with (
                tempfile.TemporaryDirectory() as store,
                mock.patch.dict(
                    os.environ, {"COALESCE_STORE": os.path.join(store, "jobs.sqlite3")}
                ),
            ):
                latencies = await arm(url, args.calls, args.budget, options)
            items = await sizes(url)
            within = sum(t <= args.budget for t in latencies) / len(latencies)
            worst = max(latencies)
            print(
                f"| {name} | {len(items)} | {compact(items)} | {within:.0%} |"
                f" {statistics.median(latencies):.2f} s |"
                f" {'failed' if worst == float('inf') else f'{worst:.2f} s'} |"
            )


def compact(items: list[int]) -> str:
    """``[1, 4, 4, 4, 3]`` as ``1, 4 x3, 3``."""
    runs = [(n, len(list(run))) for n, run in itertools.groupby(items)]
    return ", ".join(f"{n} x{count}" if count > 1 else str(n) for n, count in runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--ttft", type=float, default=0.1, help="the simulator's, seconds")
    parser.add_argument("--tokens-per-second", type=float, default=300.0)
    parser.add_argument("--answer-tokens", type=int, default=30, help="tokens of one answer")
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)
    anyio.run(main, parser.parse_args())
