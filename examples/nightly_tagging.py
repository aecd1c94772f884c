"""The nightly job: tag 50,000 support tickets through the provider's batch API.

Nobody waits for this job, so its function is pinned to the batch lane
(``lane="batch"``). Its calls wait ``batch_window`` seconds for each other, are packed
``max_items`` to a batch line (one request under one ``custom_id``) and go out as one
OpenAI batch job, billed at the batch price, half the list price: 50,000 tickets at 10
per line make 5,000 batch lines. (``lane="auto"`` with a ``coalesce.latency_budget(36 *
3600)`` block around the calls picks the same lane by deadline; see docs/lanes.md.)

Every item, line and job is written to the job store (``--store``, SQLite) before
anything is uploaded. Run the script again with the same store and each ticket is
answered from the store or, if the earlier run was killed while it waited, by the job
that run submitted: nothing is submitted, or billed, twice. The summary counts the
tickets this run's new jobs answered and those that came from earlier runs, on the
provider's side. ``coalesce jobs list --store PATH`` shows the jobs.

Somebody waiting for an answer (``copilot_endpoint.py``) belongs on another function,
in real time, ideally with another API key, so that the nightly job never competes
with that traffic.

What is simulated: the provider. By default the script serves coalesce's simulated
OpenAI API (``coalesce.testing.SimulatedProvider``) on 127.0.0.1 from a background
thread and reaches it over real HTTP through the official openai SDK. The simulator
runs ten thousand times faster than real time (``time_scale=1e-4``: the 24 h
completion window lasts 8.6 s, and 5,000 lines that take about 4 minutes of simulated
processing take 25 ms), so the run takes the time the client needs for 50,000 items
(tens of seconds), not hours. Its "model" does not read the tickets: each answer is
drawn from a hash of the ticket, which lets the script check every answer against its
own ticket. The costs are coalesce's estimates (``tag.statistics()``): the tokens the
provider reported at the model's list price, halved for batch lines, against the same
tickets sent one real-time call each.

A resume after a kill needs a provider that outlives the script, as OpenAI does (the
default simulator stops with the script, and its batches with it). At this time scale
5,000 lines take 25 s, and coalesce polls the batch after 10 s, 25 s, ...::

    coalesce simulate --port 8000 --time-scale 0.1 &
    python examples/nightly_tagging.py --simulator http://127.0.0.1:8000
    # kill -9 it while it waits for its batch, then run the same command again

Run: ``python examples/nightly_tagging.py [--tickets 50000] [--store PATH] [--simulator
URL]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import openai
from pydantic import BaseModel

import coalesce
from coalesce.testing import SimulatedProvider, expected_output

MODEL = "gpt-4o-mini"
PER_LINE = 10  # tickets packed into one batch line
TIME_SCALE = 1e-4  # the default simulator's: a day lasts 8.6 s
STORE = Path(tempfile.gettempdir()) / "coalesce-nightly-tagging.sqlite3"
PROBLEMS = [
    "I was charged twice for my subscription this month",
    "the export button crashes the whole app",
    "I can't log in since I enabled two-factor authentication",
    "could you add a dark mode?",
    "the dashboard takes a minute to load",
    "please update the VAT number on my invoices",
]


class Tag(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]


def tagger(client: openai.AsyncOpenAI, store: Path) -> coalesce.PromptFunction[[str], Tag]:
    """The nightly job's own function: batch lane only, never real time."""

    @coalesce.prompt(
        client=client,
        model=MODEL,
        lane="batch",  # background work: the batch API, at half price, within 24 h
        max_items=PER_LINE,
        store=store,  # where jobs and results outlive the process
        batch_window=1.0,  # seconds the calls wait for each other (default: a minute)
    )
    async def tag(ticket: str) -> Tag:  # type: ignore[empty-body]
        """You triage a software company's support desk. Tag the ticket with a category
        (billing: invoices, payments, refunds, plans; bug: crashes, errors, broken
        pages, slowness; account: sign-in, passwords, 2FA, permissions; other: anything
        else) and an urgency (high when the customer cannot work or money or data is
        at stake, medium when a workaround exists, low for questions and requests).
        Judge each ticket on its own words only."""

    return tag


def tickets(n: int) -> list[str]:
    return [f"Ticket #{100_000 + i}: {PROBLEMS[i * 7 % len(PROBLEMS)]}." for i in range(n)]


async def tag_all(
    tag: coalesce.PromptFunction[[str], Tag], texts: list[str]
) -> dict[str, Tag | Exception]:
    """Every ticket's tag (or its error), all calls at once: they only wait."""
    answers: dict[str, Tag | Exception] = {}

    async def one(text: str) -> None:
        try:
            answers[text] = await tag(text)
        except Exception as exc:  # reported in the summary, not raised 50,000 times
            answers[text] = exc

    async with anyio.create_task_group() as tg:
        for text in texts:
            tg.start_soon(one, text)
    await tag.aclose()
    return answers


async def provider_stats(url: str) -> dict[str, Any]:
    """The simulator's ledger: every request and batch line, and every batch created."""
    async with httpx.AsyncClient(base_url=url) as http:
        stats: dict[str, Any] = (await http.get("/_sim/stats")).json()
    return stats


def new_batches(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The batches created between the two snapshots: this run's submissions."""
    seen = {batch["batch_id"] for batch in before["batches"]}
    return [batch for batch in after["batches"] if batch["batch_id"] not in seen]


def summary(
    texts: list[str], answers: dict[str, Tag | Exception], batches: list[dict[str, Any]]
) -> list[str]:
    """What the run did, as the provider saw it (``batches``: this run's new jobs)."""
    schema = Tag.model_json_schema()
    tags = {t: a for t, a in answers.items() if isinstance(a, Tag)}
    own = sum(a.model_dump() == expected_output(t, schema) for t, a in tags.items())
    lines = sum(len(batch["custom_ids"]) for batch in batches)
    fresh = sum(batch["items"] for batch in batches)
    per_line = f"; tickets per line: {fresh / lines:.1f}" if lines else ""
    out = [
        f"tickets: {len(tags):,} tagged of {len(texts):,}"
        f" ({own:,} answers are the simulator's own for their ticket)",
        f"batch jobs submitted this run: {len(batches)}; batch lines (requests): {lines:,}"
        + per_line,
        f"answered by this run's new jobs: {fresh:,}; from earlier runs (the store, or jobs"
        f" they submitted): {max(len(tags) - fresh, 0):,}",
    ]
    failed = [a for a in answers.values() if isinstance(a, Exception)]
    if failed:
        out.append(f"failed: {len(failed):,} tickets, the first with {failed[0]!r}")
    if any(isinstance(a, openai.NotFoundError) for a in failed):
        out.append(
            "  the store holds a job this provider does not know: the default simulator"
            " forgets its batches when the script stops (see --simulator), or use another --store"
        )
    return out


def cost(stats: coalesce.PromptStatistics) -> str:
    """The batch lines this run collected, priced by coalesce (``statistics()``)."""
    if not stats.requests:
        return "estimated cost: nothing billed this run"
    return (
        f"estimated cost of the {stats.requests:,} batch lines this run collected:"
        f" ${stats.estimated_cost:.4f} at the batch price, vs"
        f" ${stats.estimated_cost_one_per_item:.4f} as one real-time call per ticket"
        f" ({stats.estimated_cost / stats.estimated_cost_one_per_item:.2f}x)"
    )


async def run(url: str, n: int, store: Path, where: str) -> None:
    texts = tickets(n)
    before = await provider_stats(url)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-simulated") as client:
        tag = tagger(client, store)
        print(f"tagging {n:,} tickets on the batch lane; job store {store}", flush=True)
        start = time.perf_counter()
        answers = await tag_all(tag, texts)
        wall = time.perf_counter() - start
        after = await provider_stats(url)
        print("\n".join(summary(texts, answers, new_batches(before, after))))
        print(cost(tag.statistics()))
    print(f"wall time: {wall:.1f} s ({where})")


async def main(n: int, store: Path, simulator: str | None) -> None:
    if simulator is not None:
        await run(simulator, n, store, f"the simulated provider at {simulator}")
        return
    sim = SimulatedProvider(time_scale=TIME_SCALE)
    async with sim.serve_async() as url:
        await run(url, n, store, f"simulated provider over HTTP, time scale {TIME_SCALE:g}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=50_000, help="tickets to tag (50,000)")
    parser.add_argument("--store", type=Path, default=STORE, help=f"the job store ({STORE})")
    parser.add_argument("--simulator", help="URL of a running `coalesce simulate` (default: own)")
    args = parser.parse_args()
    if args.tickets < 1:
        parser.error(f"--tickets must be at least 1, got {args.tickets}")
    anyio.run(main, args.tickets, args.store, args.simulator)
