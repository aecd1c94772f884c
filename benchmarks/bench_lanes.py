"""What each lane costs: real time one per item, real time packed, flex, batch, batch packed.

N support tickets (10,000 by default) are tagged through ``@coalesce.prompt`` against
the simulated provider in its own process over real HTTP, at a time scale that makes
the batch APIs' 24 h window a minute and a half, through the official SDK of each
provider. Five ways:

* real time, one request per item (``lane="realtime"``, ``max_items=1``);
* real time, packed (``lane="realtime"``, ``max_items=K``, ``packing="always"``);
* flex, packed (OpenAI only: ``lane="flex"``, ``max_items=K``; the simulator refuses 5%
  of flex requests with 429 ``resource_unavailable``, and those calls fall back to
  real time);
* batch, one item per line (``lane="batch"``, ``max_items=1``: plain requests);
* batch, packed (``lane="batch"``, ``max_items=K``).

Costs are computed from the provider's ledger (prompt and completion tokens of every
request or batch line it served) at the model's list prices, halved for batch lines
and flex requests (the providers' discount); refused requests are not billed. The
last column is coalesce's own ``statistics().estimated_cost`` for the same run, to
check it. Each caller's answer is checked against the simulator's own answer for its
input.

Run: ``python benchmarks/bench_lanes.py [--items 10000] [--per-line 10] [--provider openai]
[--waves 512]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import openai

import coalesce
from coalesce._demo import simulated_provider
from coalesce._pricing import cost, price_for
from coalesce.testing import expected_output

WAVES = [512]  # real-time callers in flight at once (--waves)
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku"}
INSTRUCTIONS = (
    "You are the triage assistant of a software company's support desk. Summarise the"
    " customer's ticket in one short sentence that names the product area and what the"
    " customer needs, without greetings, names or any personal data.\n"
    "Product areas: billing (invoices, refunds, plans, taxes, payment methods), accounts"
    " (sign-in, passwords, two-factor, SSO, roles and seats), data (imports, exports,"
    " CSV and Excel files, API access, webhooks, integrations with CRMs and help desks),"
    " reports (dashboards, scheduled reports, charts, filters), mobile (the iOS and"
    " Android apps, notifications, offline mode) and other.\n"
    "Rules: name exactly one product area, the first that fits; say what the customer"
    " needs, not how they feel; keep version numbers, error codes and file formats the"
    " customer gives; never include email addresses, phone numbers, order numbers or"
    " names; write in English whatever the ticket's language; at most 25 words; no"
    " trailing period; if the ticket asks several things, summarise the first and add"
    " 'and more'; if it is spam or empty, write 'no request'."
)


def client_for(kind: str, url: str) -> Any:
    if kind == "openai":
        return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", timeout=60)
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-sim", timeout=60)


async def run(url: str, kind: str, texts: list[str], **options: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as http:
        await http.post("/_sim/reset")
    store = Path(tempfile.mkdtemp()) / "jobs.sqlite3"

    async def summarise(ticket: str) -> str:
        """(instructions= above)"""

    client = client_for(kind, url)  # closed below: a leaked client's sockets are closed
    # later by the garbage collector, by file descriptor, under another run's connections
    fn = coalesce.prompt(
        client=client,
        model=MODELS[kind],
        instructions=INSTRUCTIONS,
        store=store,
        batch_window=5.0,
        max_concurrency=64,
        **options,
    )(summarise)
    answers: dict[str, str] = {}
    # Real-time callers at most --waves at a time (a web server's worth); batch-lane callers all
    # at once, as a nightly job's are: they only wait.
    limiter = anyio.CapacityLimiter(WAVES[0] if options["lane"] == "realtime" else len(texts))

    async def one(text: str) -> None:
        async with limiter:
            answers[text] = await fn(text)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    await fn.aclose()
    wall = time.perf_counter() - start
    await client.close()
    async with httpx.AsyncClient(base_url=url) as http:
        stats = (await http.get("/_sim/stats")).json()
    return {"answers": answers, "stats": stats, "wall": wall, "own": fn.statistics()}


def bill(stats: dict[str, Any], model: str) -> tuple[float, int, int, int]:
    """Dollars, real-time requests, flex requests and batch lines in the ledger."""
    price = price_for(model)
    assert price is not None
    total, requests, flex, lines = 0.0, 0, 0, 0
    for record in stats["requests"]:
        if record.get("status") != 200:
            continue
        dollars = cost(record["prompt_tokens"], record["completion_tokens"], price)
        if record.get("batch_id"):
            lines += 1
            total += dollars / 2  # the batch APIs' discount
        elif record.get("service_tier") == "flex":
            flex += 1
            total += dollars / 2  # flex is billed at batch prices
        else:
            requests += 1
            total += dollars
    return total, requests, flex, lines


async def main(items: int, per_line: int, kind: str) -> None:
    texts = [f"ticket {i}: the export to CSV fails since the update" for i in range(items)]
    modes = {
        "real time, one per item": {"lane": "realtime", "max_items": 1},
        f"real time, packed {per_line}": {
            "lane": "realtime",
            "max_items": per_line,
            "packing": "always",
            "max_wait": 0.2,
        },
        f"flex, packed {per_line}": {"lane": "flex", "max_items": per_line},
        "batch, one per line": {"lane": "batch", "max_items": 1},
        f"batch, packed {per_line}": {"lane": "batch", "max_items": per_line},
    }
    if kind != "openai":
        modes = {name: mode for name, mode in modes.items() if mode["lane"] != "flex"}
    rows = []
    with simulated_provider(time_scale=0.001) as url:
        for name, options in modes.items():
            result = await run(url, kind, texts, **options)
            right = sum(result["answers"].get(t) == expected_output(t) for t in texts)
            dollars, requests, flex, lines = bill(result["stats"], MODELS[kind])
            own = result["own"].estimated_cost
            rows.append((name, dollars, requests, flex, lines, right, result["wall"], own))
    base = rows[0][1]
    print(
        f"{items:,} calls through @coalesce.prompt, {kind} SDK and simulated API over HTTP"
        f" (time scale 0.001), model {MODELS[kind]}; batch lines and flex requests at half"
        " the list price\n"
    )
    print(
        "| lane | cost (USD) | vs one per item | real-time requests | flex requests"
        " | batch lines | own answer | wall | coalesce's estimate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, dollars, requests, flex, lines, right, wall, own in rows:
        print(
            f"| {name} | {dollars:.4f} | {dollars / base:.2f}x | {requests:,} | {flex:,}"
            f" | {lines:,} | {right / items:.1%} | {wall:.1f} s | {own:.4f} |"
        )


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--per-line", type=int, default=10)
    parser.add_argument("--provider", choices=sorted(MODELS), default="openai")
    parser.add_argument("--waves", type=int, default=512, help="real-time callers at once")
    args = parser.parse_args()
    WAVES[0] = args.waves
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)  # offline token counts
    anyio.run(main, args.items, args.per_line, args.provider)
