"""Packing against plain calls with and without the provider's prompt cache.

For shared instructions of about 20, 200 and 2,000 tokens, and the simulated provider's
prompt cache off or on (warm after the first calls, as OpenAI's automatic caching of
prefixes from 1,024 tokens), the same Poisson stream of calls goes out two ways over
real HTTP with the official openai SDK:

* plain calls, one request per item (the SDK's ``parse`` with ``prompt_cache_key``);
* ``@coalesce.prompt`` at a 2 s latency budget, which decides for itself whether to
  pack (and how many) or to send plain calls.

Costs come from the provider's own ledger (prompt, cached and completion tokens) at the
model's list prices, so they do not depend on coalesce's accounting. The table shows
each cost, the ratio, what coalesce chose and the smallest group it found to pay.

Run: ``python benchmarks/bench_cache.py [--calls 300] [--rate 100] [--model gpt-4.1-mini]``.
"""

from __future__ import annotations

import argparse
import os
import random
import warnings
from contextlib import AbstractContextManager
from typing import Any, Literal

import anyio
import httpx
import openai
from pydantic import BaseModel

import coalesce
from coalesce._demo import run as run_workload
from coalesce._demo import simulated_provider
from coalesce._planning.tokens import count_tokens
from coalesce._pricing import cost, price_for

BUDGET = 2.0
MAX_WAIT = 0.5
SENTENCES = [
    "Tag each support ticket with the team that should handle it and its urgency.",
    "Billing covers invoices, payments, refunds, plans, prices, taxes and receipts.",
    "Bugs are crashes, errors, broken pages and features that misbehave or are slow.",
    "Account covers sign-in, passwords, two-factor authentication and permissions.",
    "Anything else, feature requests and praise included, is 'other'.",
    "Urgency is high when the customer cannot work or money or data is at stake.",
    "It is medium when a workaround exists, and low for questions and requests.",
    "Judge each ticket on its own words only, never on the other tickets.",
]


class Triage(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


def instructions(tokens: int, model: str) -> str:
    """Instructions of about ``tokens`` tokens, cut from the sentences repeated."""
    words: list[str] = []
    sentence = 0
    while count_tokens(" ".join(words), model) < tokens:
        words.extend(SENTENCES[sentence % len(SENTENCES)].split())
        sentence += 1
    while count_tokens(" ".join(words), model) > tokens and len(words) > 1:
        words.pop()
    return " ".join(words)


def tickets(n: int) -> list[str]:
    problems = ["my invoice is wrong", "the app crashes on start", "I cannot log in"]
    return [f"Ticket {i}: {problems[i % 3]} since this morning" for i in range(n)]


def simulator(cache: bool) -> AbstractContextManager[str]:
    settings: dict[str, Any] = {"output_tokens": 12}
    if not cache:
        settings["prompt_cache"] = False
    return simulated_provider(**settings)


async def ledger(url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=url) as http:
        totals: dict[str, int] = (await http.get("/_sim/stats")).json()["totals"]
    return totals


async def measure(url: str, model: str, text: str, arrivals: list[float], **options: Any) -> Any:
    async with httpx.AsyncClient(base_url=url) as http:
        await http.post("/_sim/reset")
    holder: dict[str, Any] = {}
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", timeout=30.0) as client:
        measured = await run_workload(
            client,
            model,
            tickets(len(arrivals)),
            arrivals,
            instructions=text,
            output_type=Triage,
            **options,
        )
    totals = await ledger(url)
    price = price_for(model)
    assert price is not None
    holder["cost"] = cost(
        totals["prompt_tokens"],
        totals["completion_tokens"],
        price,
        cached_input_tokens=totals.get("cached_tokens", 0),
    )
    holder.update(totals=totals, run=measured)
    return holder


async def one_cell(url: str, model: str, tokens: int, arrivals: list[float]) -> dict[str, Any]:
    text = instructions(tokens, model)
    plain = await measure(url, model, text, arrivals, plain=True, cache_key="bench-cache")
    packed = await measure(
        url, model, text, arrivals, max_items=16, max_wait=MAX_WAIT, latency_budget=BUDGET
    )
    paying = packed["run"].smallest_paying_group
    return {"tokens": count_tokens(text, model), "plain": plain, "packed": packed, "paying": paying}


async def main(calls: int, rate: float, model: str) -> None:
    rng = random.Random(1)
    arrivals, at = [], 0.0
    for _ in range(calls):
        at += rng.expovariate(rate)
        arrivals.append(at)
    rows = []
    for cache in (False, True):
        with simulator(cache) as url:
            for tokens in (20, 200, 2000):
                cell = await one_cell(url, model, tokens, arrivals)
                rows.append((cache, cell))
    print(
        f"{calls} calls, Poisson arrivals at {rate:g}/s, model {model} (list prices), the"
        f" simulated provider over HTTP; coalesce: latency_budget={BUDGET:g},"
        f" max_wait={MAX_WAIT:g}, max_items=16\n"
    )
    print(
        "| instructions | prompt cache | plain: cost (cached tokens) | coalesce: cost"
        " (cached tokens) | coalesce vs plain | coalesce chose | smallest paying group"
        " | coalesce p95 | within budget |"
    )
    print("|---:|---|---:|---:|---:|---|---:|---:|---:|")
    for cache, cell in rows:
        plain, packed = cell["plain"], cell["packed"]
        run = packed["run"]
        ordered = sorted(run.latencies)
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        within = sum(t <= BUDGET for t in ordered) / len(ordered)
        choice = f"packed, {run.mean_group:.1f} items/request"
        if cell["paying"] is None:
            choice = "plain calls at once"
        elif run.mean_group < 1.5:
            choice = "mostly plain calls"
        print(
            f"| {cell['tokens']:,} tokens | {'warm' if cache else 'off'}"
            f" | ${plain['cost']:.4f} ({plain['totals'].get('cached_tokens', 0):,})"
            f" | ${packed['cost']:.4f} ({packed['totals'].get('cached_tokens', 0):,})"
            f" | {packed['cost'] / plain['cost']:.2f}x | {choice}"
            f" | {cell['paying']} | {p95:.2f} s | {within:.1%} |"
        )


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--model", default="gpt-4.1-mini")
    args = parser.parse_args()
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)  # offline token counts
    anyio.run(main, args.calls, args.rate, args.model)
