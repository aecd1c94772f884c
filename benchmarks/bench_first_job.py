"""The first job on a fresh store (issue 35): what a new user's first runs cost against
plain calls, shadow calls included.

Three workloads, each on a fresh ``$COALESCE_STORE`` (nothing learned before), through
``@coalesce.prompt`` with a pydantic output model at default options (the README's
``latency_budget=2.0``, nothing else), against the simulated provider over real HTTP
(``SimulatedProvider().serve()``, the official openai SDK):

* a burst: 50 calls at the same instant;
* ``f.map`` of 500 items at its default concurrency;
* ``f.map`` of 100 items.

Each runs twice: as plain SDK calls (``chat.completions.parse`` with the output model,
one request per item, no coalesce: the baseline) and through coalesce. Requests and
prompt tokens come from the simulator's own ledger, so shadow checks count. Two sets of
instructions: the README's ``Tag`` docstring (about 110 tokens) and its first line
alone (where packing pays only from groups of 5).

Run: ``python benchmarks/bench_first_job.py [--budget 2] [--instructions readme,short]``;
about a minute.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Literal
from unittest import mock

import anyio
import httpx
import openai
from pydantic import BaseModel

import coalesce
from coalesce.testing import SimulatedProvider

MODEL = "gpt-4o-mini"
README = """Tag the support ticket with a category and an urgency.

Categories: billing (invoices, charges, refunds, plans), bug (something in the
product fails or behaves wrongly), account (sign-in, passwords, users, settings),
other (anything else, including praise and feature requests).
Urgency: high when the customer cannot work or is losing money now, or mentions a
deadline today; medium when something is wrong but there is a workaround; low for
questions, requests and anything that can wait. Judge by what the ticket says has
happened, not by its tone: an angry ticket about a typo is still low.
"""
INSTRUCTIONS = {"readme": README, "short": README.splitlines()[0]}
PROBLEMS = [
    "I was charged twice for my plan this month",
    "the export button crashes the app",
    "I cannot sign in since the password reset",
    "love the new dashboard, thanks",
]


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


def tickets(n: int) -> list[str]:
    return [f"Ticket {i}: {PROBLEMS[i % len(PROBLEMS)]}." for i in range(n)]


Ask = Callable[[str], Awaitable[Any]]


async def burst(ask: Ask, items: list[str]) -> None:
    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(ask, item)


def plain_ask(client: openai.AsyncOpenAI, instructions: str) -> Ask:
    async def ask(ticket: str) -> Any:
        reply = await client.chat.completions.parse(
            model=MODEL,
            messages=[
                {"role": "system", "content": instructions},
                {"role": "user", "content": ticket},
            ],
            response_format=Tag,
        )
        return reply.choices[0].message.parsed

    return ask


async def plain(url: str, instructions: str, workload: str, items: list[str]) -> None:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim") as client:
        ask = plain_ask(client, instructions)
        if workload == "burst":
            await burst(ask, items)
        else:  # as many in flight as coalesce's map keeps: 64
            limit = anyio.Semaphore(64)

            async def one(item: str) -> None:
                async with limit:
                    await ask(item)

            await burst(one, items)


async def coalesced(
    url: str, instructions: str, workload: str, items: list[str], budget: float
) -> coalesce.PromptStatistics:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", max_retries=0)

    async def tag(ticket: str) -> Tag: ...

    tag.__doc__ = instructions
    options = {} if budget <= 0 else {"latency_budget": budget}
    fn = coalesce.prompt(client=client, model=MODEL, **options)(tag)
    try:
        if workload == "burst":
            await burst(fn, items)
        else:
            await fn.map(items)
    finally:
        await fn.aclose()
        await client.close()
    return fn.statistics()


async def ledger(url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=url) as http:
        totals: dict[str, int] = (await http.get("/_sim/stats")).json()["totals"]
        await http.post("/_sim/reset")
    return totals


WORKLOADS = [("burst", 50, "50 calls at once"), ("map", 500, "map, 500"), ("map", 100, "map, 100")]


async def row(url: str, name: str, workload: str, n: int, label: str, budget: float) -> str:
    instructions, items = INSTRUCTIONS[name], tickets(n)
    await ledger(url)
    await plain(url, instructions, workload, items)
    base = await ledger(url)
    with (
        tempfile.TemporaryDirectory() as store,
        mock.patch.dict(os.environ, {"COALESCE_STORE": os.path.join(store, "jobs.sqlite3")}),
    ):
        stats = await coalesced(url, instructions, workload, items, budget)
    ours = await ledger(url)
    ratio = ours["prompt_tokens"] / base["prompt_tokens"]
    return (
        f"| {name} | {label} | {base['requests']} | {ours['requests']} |"
        f" {stats.shadow_requests} | {base['prompt_tokens']:,} | {ours['prompt_tokens']:,} |"
        f" {ratio:.3f}x | {stats.savings:.0%} | {stats.smallest_paying_group} |"
        f" {stats.group_cap} |"
    )


async def main(args: argparse.Namespace) -> None:
    with SimulatedProvider().serve() as url:
        print(
            f"A fresh store per row; @coalesce.prompt(latency_budget={args.budget:g}) with a"
            " pydantic output, against the simulated provider over HTTP; prompt tokens from"
            " its ledger (shadow calls included)\n"
        )
        print(
            "| instructions | workload | plain requests | coalesce requests | of them shadow"
            " | plain prompt tokens | coalesce prompt tokens | x plain | saved (cost)"
            " | smallest paying group | cap at the end |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in args.instructions.split(","):
            for workload, n, label in WORKLOADS:
                print(await row(url, name, workload, n, label, args.budget), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--instructions", default="readme,short")
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)
    anyio.run(main, parser.parse_args())
