"""Groups sized against a latency budget, side by side with the alternatives.

600 calls arrive as a Poisson stream at 100/s and go to the simulated provider over
real HTTP with the official openai SDK (time to first token 0.35 s, 80 output tokens/s,
outputs of a couple of tens of tokens, a shared instruction of about 400 tokens). Four
ways:

* one call per item, without coalesce: the SDK's ``parse`` with the output model, as
  the application does today (the baseline of every ratio);
* ``coalesce.prompt`` with groups of one (``max_items=1``): what coalesce costs when
  there is nothing to pack (a group of one is asked as a plain call);
* fixed groups of 20 (``max_items=20``, ``max_wait=0.5``, no budget);
* coalesced at ``latency_budget=2.0`` with ``max_wait=0.5``: the planner sizes each
  group, starting from coalesce's default prior (nothing declared about the provider).

``--ttft``, ``--tokens-per-second``, ``--prefill`` and ``--jitter`` give the simulated
server another latency profile: the planner is not tuned to one.

It prints p50/p95/p99 latency, the share of calls within the budget, requests, prompt
tokens and estimated cost, and the best group size for this budget computed from the
simulated model's parameters beside the planner's mean group size.

Run: ``python benchmarks/bench_budget.py [--calls 600] [--rate 100] [--seed 1]
[--ttft 0.35] [--tokens-per-second 80] [--prefill 0.00005] [--jitter 0]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import warnings
from contextlib import AbstractContextManager
from typing import Any, Literal

import anyio
import httpx
import openai
from group_sizing import best_group_size
from pydantic import BaseModel, TypeAdapter

import coalesce
from coalesce._demo import run as run_workload
from coalesce._demo import simulated_provider
from coalesce._planning.tokens import count_tokens
from coalesce._pricing import cost, price_for
from coalesce._wire.packing import pack_request
from coalesce.providers._shapes import openai_response_format

MODEL = "gpt-4o-mini"
BUDGET = 2.0
MAX_WAIT = 0.5
TTFT = 0.35
PREFILL = 0.00005  # seconds per prompt token before the first token
TOKENS_PER_SECOND = 80.0
JITTER = 0.0
OUTPUT_TOKENS = 12  # content tokens per item's output (its key in the reply adds about 3)

INSTRUCTIONS = (
    "You are the triage assistant of a software company's support desk. For each"
    " support ticket you receive, decide which team should handle it and how urgent"
    " it is. Use the category 'billing' for invoices, payments, refunds, plans,"
    " prices, taxes and receipts; 'bug' for crashes, errors, broken pages, features"
    " that do not behave as documented and performance problems; 'account' for"
    " sign-in, passwords, two-factor authentication, email changes, team membership"
    " and permissions; and 'other' for everything else, including feature requests,"
    " praise and questions about the roadmap. Urgency is 'high' when the customer"
    " cannot work at all, money is at stake, or data may be lost or exposed; 'medium'"
    " when they can work around the problem but it costs them time; and 'low' for"
    " questions, cosmetic problems and requests. Sentiment is the customer's tone,"
    " not the severity of the problem: 'negative' when they are angry or frustrated,"
    " 'positive' when they are friendly or grateful, 'neutral' otherwise. Judge each"
    " ticket on its own words only; do not let other tickets influence it. If a"
    " ticket mentions several problems, classify the one the customer most wants"
    " solved. If a ticket is empty, unreadable or in a language you do not know, use"
    " 'other', 'low' and 'neutral'. Never invent details that the ticket does not"
    " contain, never address the customer, and never add explanations: answer only"
    " with the requested fields, exactly as specified by the output format, for"
    " every ticket in the request. Product names you may meet: the web dashboard, the"
    " mobile apps for iOS and Android, the public REST API, the command-line tool, the"
    " data export service and the single sign-on connector; a ticket about any of them"
    " that reports wrong behaviour is a 'bug' unless it concerns access ('account') or"
    " money ('billing'). Messages forwarded by a colleague are judged by the original"
    " customer's words. Security reports,"
    " such as a suspected leak of passwords or of personal data, are always 'account'"
    " and 'high', whatever their tone."
)


class Triage(BaseModel):
    category: Literal["billing", "bug", "account", "other"]
    urgency: Literal["low", "medium", "high"]
    sentiment: Literal["negative", "neutral", "positive"]


def tickets(n: int) -> list[str]:
    problems = ["my invoice is wrong", "the app crashes on start", "I cannot log in"]
    return [f"Ticket {i}: {problems[i % 3]} since this morning, please help" for i in range(n)]


def simulator() -> AbstractContextManager[str]:
    """``coalesce simulate`` in its own process (the demo's helper), with this
    benchmark's latency profile and output length."""
    latency = {
        "default": {
            "ttft": TTFT,
            "prompt_token_seconds": PREFILL,
            "tokens_per_second": TOKENS_PER_SECOND,
        },
        "jitter": JITTER,
    }
    return simulated_provider(latency=latency, output_tokens=OUTPUT_TOKENS)


async def run(url: str, arrivals: list[float], **options: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as http:
        await http.post("/_sim/reset")
    texts = tickets(len(arrivals))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim", timeout=30.0) as client:
        measured = await run_workload(
            client, MODEL, texts, arrivals, instructions=INSTRUCTIONS, output_type=Triage, **options
        )
    latencies, mean_group, reasons = measured.latencies, measured.mean_group, dict(measured.reasons)
    async with httpx.AsyncClient(base_url=url) as http:
        totals = (await http.get("/_sim/stats")).json()["totals"]
    price = price_for(MODEL)
    assert price is not None
    ordered = sorted(latencies)
    return {
        "latencies": ordered,
        "p50": statistics.median(ordered),
        "p95": ordered[int(0.95 * (len(ordered) - 1))],
        "p99": ordered[int(0.99 * (len(ordered) - 1))],
        "within": sum(t <= BUDGET for t in ordered) / len(ordered),
        "requests": totals["requests"],
        "prompt_tokens": totals["prompt_tokens"],
        "completion_tokens": totals["completion_tokens"],
        "cost": cost(totals["prompt_tokens"], totals["completion_tokens"], price),
        "mean_group": mean_group,
        "reasons": reasons,
    }


async def packed_usage(url: str, size: int) -> tuple[int, int]:
    """Prompt and completion tokens the provider reports for one packed request of
    ``size`` tickets, in the format coalesce sends (``coalesce.prompt`` asks a group of
    one as a plain call, so this is asked directly)."""
    schema = TypeAdapter(Triage).json_schema()
    request = pack_request(INSTRUCTIONS, tickets(size), schema)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-sim") as client:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=request.messages(),  # type: ignore[arg-type]
            response_format=openai_response_format(request.reply_schema),  # type: ignore[arg-type]
        )
    assert reply.usage is not None
    return reply.usage.prompt_tokens, reply.usage.completion_tokens


def best_size(
    rate: float, one: tuple[int, int], twenty: tuple[int, int], plain: dict[str, Any]
) -> tuple[int, float]:
    """The best group size for the budget, and its prompt tokens against plain calls.

    Tokens per request are linear in the group size k: ``shared + k * per_item``, for
    the prompt and for the reply alike. Both lines go through what the provider
    reported for packed requests of 1 and of 20 tickets; the request's duration is the
    simulated model's own (TTFT, prefill, decode speed)."""

    def line(at_one: int, at_twenty: int) -> tuple[float, float]:
        per_item = (at_twenty - at_one) / 19
        return at_one - per_item, per_item

    shared_in, item_in = line(one[0], twenty[0])
    shared_out, item_out = line(one[1], twenty[1])
    size = best_group_size(
        arrival_rate=rate,
        budget=BUDGET,
        max_wait=MAX_WAIT,
        shared_tokens=round(shared_in),
        item_input_tokens=round(item_in),
        item_output_tokens=round(item_out),
        per_item_overhead_tokens=0,  # in the fitted lines already
        per_item_output_overhead_tokens=0,
        predict=lambda i, o: TTFT + PREFILL * i + (shared_out + o) / TOKENS_PER_SECOND,
        # The simulated server does not enforce the reply schema (as most compatible
        # servers): coalesce holds answers until the reply ends (docs/trust.md).
        streaming=False,
    )
    plain_per_item = plain["prompt_tokens"] / plain["requests"]
    return size, (shared_in + size * item_in) / (size * plain_per_item)


async def main(calls: int, rate: float, seed: int, plot_path: str = "") -> None:
    rng = random.Random(seed)
    arrivals, at = [], 0.0
    for _ in range(calls):
        at += rng.expovariate(rate)
        arrivals.append(at)
    runs = {}
    with simulator() as url:
        runs["one call per item"] = await run(url, arrivals, plain=True)
        runs["coalesce, groups of one"] = await run(url, arrivals, max_items=1, max_wait=0.0)
        runs["fixed groups of 20"] = await run(url, arrivals, max_items=20, max_wait=MAX_WAIT)
        runs[f"coalesce, budget {BUDGET:g} s"] = await run(
            url,
            arrivals,
            max_items=64,
            max_wait=MAX_WAIT,
            latency_budget=BUDGET,
        )
        packed = {size: await packed_usage(url, size) for size in (1, 20)}
    base = runs["one call per item"]
    print(
        f"{calls} calls, Poisson arrivals at {rate:g}/s (seed {seed}); simulated provider over"
        f" HTTP (TTFT {TTFT} s, prefill {PREFILL:g} s/token, {TOKENS_PER_SECOND:g} tokens/s,"
        f" jitter {JITTER:g}); shared instruction"
        f" {count_tokens(INSTRUCTIONS, MODEL)} tokens; max_wait {MAX_WAIT} s\n"
    )
    print(
        "| mode | p50 | p95 | p99 | within 2 s | requests | mean group | prompt tokens"
        " | vs one per item | cost (USD) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in runs.items():
        print(
            f"| {name} | {r['p50']:.2f} s | {r['p95']:.2f} s | {r['p99']:.2f} s"
            f" | {r['within']:.1%} | {r['requests']} | {r['mean_group']:.1f}"
            f" | {r['prompt_tokens']:,} | {r['prompt_tokens'] / base['prompt_tokens']:.2f}x"
            f" | {r['cost']:.4f} |"
        )
    planned = runs[f"coalesce, budget {BUDGET:g} s"]
    best, best_ratio = best_size(rate, packed[1], packed[20], base)
    goal = 1 - 0.9 * (1 - best_ratio)  # 90% of the best size's savings
    print(
        f"\nBest group size for this budget (from the simulated model's parameters and the"
        f" tokens it reported for packed requests of 1 and of 20): {best}, prompt tokens"
        f" {best_ratio:.2f}x one per item; 90% of its savings is {goal:.2f}x"
    )
    print(
        f"Planner's mean group size: {planned['mean_group']:.1f}; dispatch reasons {planned['reasons']}"
    )
    ok_budget = planned["within"] >= 0.99
    ratio = planned["prompt_tokens"] / base["prompt_tokens"]
    print(
        f"Target >= 99% within {BUDGET:g} s: {'HOLDS' if ok_budget else 'FAILS'} ({planned['within']:.1%})"
    )
    print(
        f"Target prompt tokens <= 0.27x one-per-item: {'HOLDS' if ratio <= 0.27 else 'FAILS'} ({ratio:.3f}x)"
    )
    if plot_path:
        plot(runs, plot_path)
    print(
        f"Target 90% of the best size's savings (<= {goal:.2f}x):"
        f" {'HOLDS' if ratio <= goal else 'FAILS'} ({ratio:.3f}x)"
    )


def plot(runs: dict[str, dict[str, Any]], path: str) -> None:
    """Latency CDF and prompt tokens per item of each mode, to a PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot)")
        return
    figure, (cdf, tokens) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in runs.items():
        xs = r["latencies"]
        cdf.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    cdf.axvline(BUDGET, color="grey", linestyle="--", label=f"budget {BUDGET:g} s")
    cdf.set(xlabel="latency (s)", ylabel="share of calls", title="Latency CDF")
    cdf.legend(loc="lower right", fontsize=8)
    names = list(runs)
    per_item = [runs[n]["prompt_tokens"] / len(runs[n]["latencies"]) for n in names]
    tokens.bar(range(len(names)), per_item, color=[f"C{i}" for i in range(len(names))])
    tokens.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=8)
    tokens.set(ylabel="prompt tokens per item", title="Prompt tokens per item")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"plot written to {path}")


if __name__ == "__main__":
    os.environ["COALESCE_STORE"] = ":memory:"  # learn afresh, keep nothing in the user's directory
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", default="", help="write a PNG here (needs matplotlib)")
    parser.add_argument("--ttft", type=float, default=TTFT)
    parser.add_argument("--tokens-per-second", type=float, default=TOKENS_PER_SECOND)
    parser.add_argument("--prefill", type=float, default=PREFILL, help="seconds per prompt token")
    parser.add_argument("--jitter", type=float, default=JITTER, help="relative spread, [0, 1)")
    args = parser.parse_args()
    TTFT, TOKENS_PER_SECOND, PREFILL = args.ttft, args.tokens_per_second, args.prefill
    JITTER = args.jitter
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)  # offline token counts
    anyio.run(main, args.calls, args.rate, args.seed, args.plot)
