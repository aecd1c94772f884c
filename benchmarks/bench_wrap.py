"""The drop-in client, streamed and not, side by side with the plain SDK client.

300 chat completions (short replies of about 25 tokens) arrive as a Poisson stream at
60/s and go to the simulated provider in its own process over real HTTP (time to first
token 0.35 s, 80 tokens/s), through the official openai SDK, three ways:

* the plain ``AsyncOpenAI`` client, one request per call, streamed;
* ``coalesce.wrap(client)`` with ``stream=False``: each caller gets a ``ChatCompletion``
  once the packed reply is complete (its usage share needs the whole reply);
* ``coalesce.wrap(client)`` with ``stream=True``: each caller's stream opens as soon as
  the streaming split has its own answer.

Both wrapped modes use ``latency_budget=2.0``, ``max_wait=0.2``. It prints the time to
each caller's answer (the first content chunk when streamed), requests and prompt
tokens, and the ratios to the plain client.

``--system "Be very brief."`` (4 tokens) shows instructions too short for packing to
pay: coalesce then passes the calls through, and should match the plain client.

Run: ``python benchmarks/bench_wrap.py [--calls 300] [--rate 60] [--seed 1] [--system TEXT]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings
from typing import Any

import anyio
import httpx
import openai

import coalesce
from coalesce._demo import at_arrivals, simulated_provider

MODEL = "gpt-4o-mini"
SYSTEM = (
    "You are the assistant of a software company's help centre. Answer the customer's"
    " question in one short sentence, politely, without greetings or sign-offs."
)


def messages(i: int, system: str) -> list[dict[str, str]]:
    question = f"Question {i}: how do I reset my password on the mobile app?"
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


async def run(url: str, arrivals: list[float], mode: str, system: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as http:
        await http.post("/_sim/reset")
    raw = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", timeout=30.0)
    client: Any = raw
    if mode != "plain":
        client = coalesce.wrap(raw, latency_budget=2.0, max_wait=0.2, max_items=64)
    streamed = mode != "wrapped, not streamed"
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = time.perf_counter()
        reply = await client.chat.completions.create(
            model=MODEL, messages=messages(i, system), stream=streamed
        )
        if streamed:
            answered = None
            async for chunk in reply:
                if answered is None and chunk.choices and chunk.choices[0].delta.content:
                    answered = time.perf_counter()
            assert answered is not None, "a stream ended without content"
        else:
            assert reply.choices[0].message.content
            answered = time.perf_counter()
        latencies.append(answered - start)

    await at_arrivals(arrivals, range(len(arrivals)), one)
    await client.close()
    async with httpx.AsyncClient(base_url=url) as http:
        totals = (await http.get("/_sim/stats")).json()["totals"]
    ordered = sorted(latencies)
    return {
        "p50": statistics.median(ordered),
        "p95": ordered[int(0.95 * (len(ordered) - 1))],
        "within": sum(t <= 2.0 for t in ordered) / len(ordered),
        "requests": totals["requests"],
        "prompt_tokens": totals["prompt_tokens"],
    }


async def main(calls: int, rate: float, seed: int, system: str) -> None:
    rng = random.Random(seed)
    arrivals, at = [], 0.0
    for _ in range(calls):
        at += rng.expovariate(rate)
        arrivals.append(at)
    modes = ["plain", "wrapped, not streamed", "wrapped, streamed"]
    with simulated_provider(output_tokens=25) as url:
        runs = {mode: await run(url, arrivals, mode, system) for mode in modes}
    base = runs["plain"]
    print(
        f"{calls} calls, Poisson arrivals at {rate:g}/s (seed {seed}); simulated provider over"
        " HTTP (TTFT 0.35 s, 80 tokens/s), replies of about 25 tokens; wrapped:"
        f" latency_budget=2.0, max_wait=0.2; system prompt: {system!r}\n"
    )
    print(
        "| mode | answer p50 | answer p95 | within 2 s | requests | prompt tokens"
        " | p50 vs plain | p95 vs plain | prompt tokens vs plain |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs.items():
        print(
            f"| {name} | {r['p50']:.2f} s | {r['p95']:.2f} s | {r['within']:.1%}"
            f" | {r['requests']} | {r['prompt_tokens']:,} | {r['p50'] / base['p50']:.2f}x"
            f" | {r['p95'] - base['p95']:+.2f} s"
            f" | {r['prompt_tokens'] / base['prompt_tokens']:.2f}x |"
        )
    whole, split = runs["wrapped, not streamed"], runs["wrapped, streamed"]
    print(
        f"\nStreamed callers get their answer {split['p50'] / whole['p50']:.2f}x as late"
        " (p50) as callers of the same coalesced requests who wait for the whole reply."
    )


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rate", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--system", default=SYSTEM, help="the system prompt")
    args = parser.parse_args()
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)  # offline token counts
    anyio.run(main, args.calls, args.rate, args.seed, args.system)
