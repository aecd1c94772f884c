"""``coalesce demo``: what coalescing buys and what it costs, in one command.

500 support tickets arrive as a Poisson stream and are tagged (category, sentiment,
urgency) through ``coalesce.prompt`` with the official openai SDK, four ways side by
side: one call per item (with and without the provider's prompt cache), fixed groups
of 20, and coalesced at a latency budget. By default the provider is the simulated one,
started in its own process and reached over real HTTP, so no API key is needed;
``--live`` sends the same run to the real provider.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import anyio
from pydantic import BaseModel

T = TypeVar("T")

__all__ = ["main"]

TTFT = 0.35
PREFILL = 0.00005
TOKENS_PER_SECOND = 80.0
INSTRUCTIONS = (
    "You are the triage assistant of a software company's support desk. For each"
    " ticket, decide the category (billing: invoices, payments, refunds, plans; bug:"
    " crashes, errors, broken pages, slowness; account: sign-in, passwords, 2FA,"
    " permissions; other: anything else), the customer's sentiment (their tone, not"
    " the severity) and the urgency (high when they cannot work or money or data is at"
    " stake, medium when a workaround exists, low for questions and requests). Judge"
    " each ticket on its own words only and answer only with the requested fields."
)
PROBLEMS = [
    "I was charged twice for my subscription this month",
    "the export button crashes the whole app",
    "I can't log in since I enabled two-factor authentication",
    "could you add a dark mode?",
    "the dashboard takes a minute to load",
    "please update the VAT number on my invoices",
]


class Ticket(BaseModel):
    """The demo's output type: one tagged support ticket."""

    category: Literal["billing", "bug", "account", "other"]
    sentiment: Literal["negative", "neutral", "positive"]
    urgency: Literal["low", "medium", "high"]


@dataclass(frozen=True)
class Result:
    """One mode's measurements."""

    name: str
    latencies: list[float]
    budget: float
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost: float
    mean_group: float

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def within_budget(self) -> float:
        return sum(t <= self.budget for t in self.latencies) / len(self.latencies)


def tickets(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Ticket #{1000 + i}: {rng.choice(PROBLEMS)}." for i in range(n)]


def poisson(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    at, out = 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate)
        out.append(at)
    return out


@contextlib.contextmanager
def simulated_provider(**settings: Any) -> Iterator[str]:
    """``coalesce simulate`` in its own process, so that it does not share the client's
    CPU time; yields its base URL. ``settings`` add to its configuration file."""
    import httpx

    config = {
        "latency": {
            "default": {
                "ttft": TTFT,
                "prompt_token_seconds": PREFILL,
                "tokens_per_second": TOKENS_PER_SECOND,
            }
        },
        **settings,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(config, file)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "coalesce", "simulate", "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--config", file.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=1.0)
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the simulated provider did not start")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        os.unlink(file.name)


async def at_arrivals(
    arrivals: Sequence[float], items: Sequence[T], call: Callable[[T], Coroutine[Any, Any, None]]
) -> None:
    """Start ``call(item)`` for each item at its arrival time (seconds from now, real
    time), and wait for all of them."""
    origin = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for item, at in zip(items, arrivals, strict=True):
            delay = at - (time.perf_counter() - origin)
            if delay > 0:
                await anyio.sleep(delay)
            tg.start_soon(call, item)


@dataclass(frozen=True)
class Run:
    """What one mode's run measured, before pricing."""

    latencies: list[float]
    requests: int
    prompt_tokens: int
    completion_tokens: int
    mean_group: float = 1.0
    reasons: Mapping[str, int] = field(default_factory=dict)  # groups by flush reason
    cached_tokens: int = 0  # prompt tokens read from the provider's cache
    smallest_paying_group: int | None = None  # coalesce's, for coalesced runs


async def run(
    client: Any,
    model: str,
    texts: Sequence[str],
    arrivals: Sequence[float],
    *,
    advance: Callable[[], None] = lambda: None,
    instructions: str = INSTRUCTIONS,
    output_type: Any = Ticket,
    plain: bool = False,
    cache_key: str | None = None,
    **options: Any,
) -> Run:
    """Send each text at its arrival time and time each call.

    With ``plain``, each text is its own request, without coalesce: what the application
    does today (the SDK's ``parse`` with the output model; with ``cache_key``, sent as
    ``prompt_cache_key`` so that the provider caches the shared prefix where it can).
    Otherwise every text goes through one ``coalesce.prompt`` function made with
    ``options``.
    """
    if plain:
        ask, sent = _plain_ask(client, model, instructions, output_type, cache_key)
        latencies = await _timed(arrivals, texts, ask, advance)
        requests, prompt, completion, cached = sent
        return Run(latencies, requests, prompt, completion, cached_tokens=cached)
    answer = _prompt_function(client, model, instructions, output_type, options)
    latencies = await _timed(arrivals, texts, answer, advance)
    await answer.aclose()
    stats, batches = answer.statistics(), answer.batcher_statistics()
    return Run(
        latencies,
        requests=stats.requests,
        prompt_tokens=stats.input_tokens,
        completion_tokens=stats.output_tokens,
        mean_group=batches.mean_batch_size,
        reasons={reason: n for reason, n in batches.dispatch_reasons.items() if n},
        cached_tokens=stats.cached_input_tokens,
        smallest_paying_group=stats.smallest_paying_group,
    )


async def _timed(
    arrivals: Sequence[float],
    texts: Sequence[str],
    call: Callable[[str], Awaitable[object]],
    advance: Callable[[], None],
) -> list[float]:
    """Each call's latency, in the order the calls finished; ``inf`` for a call that
    failed (a coalesce error: freed at its deadline, say), which counts as late."""
    from ._exceptions import CoalesceError

    latencies: list[float] = []

    async def one(text: str) -> None:
        start = time.perf_counter()
        try:
            await call(text)
        except CoalesceError:
            latencies.append(math.inf)
        else:
            latencies.append(time.perf_counter() - start)
        advance()

    await at_arrivals(arrivals, texts, one)
    return latencies


def _prompt_function(
    client: Any, model: str, instructions: str, output_type: Any, options: Mapping[str, Any]
) -> Any:
    import coalesce

    async def tag(ticket: str) -> Any:
        """(instructions= above)"""

    tag.__annotations__["return"] = output_type
    return coalesce.prompt(client=client, model=model, instructions=instructions, **options)(tag)


def _plain_ask(
    client: Any, model: str, instructions: str, output_type: Any, cache_key: str | None
) -> tuple[Callable[[str], Awaitable[None]], list[int]]:
    """One SDK request per text, and its running ``[requests, prompt, completion,
    cached]`` usage."""
    usage = [0, 0, 0, 0]
    cache = {} if cache_key is None else {"prompt_cache_key": cache_key}

    async def ask(text: str) -> None:
        reply = await client.chat.completions.parse(
            model=model,
            messages=[
                {"role": "system", "content": instructions},
                {"role": "user", "content": text},
            ],
            response_format=output_type,
            **cache,
        )
        usage[0] += 1
        if reply.usage is not None:
            details = reply.usage.prompt_tokens_details
            usage[1] += reply.usage.prompt_tokens
            usage[2] += reply.usage.completion_tokens
            usage[3] += (details.cached_tokens or 0) if details is not None else 0

    return ask, usage


PLAIN = "one call per item"
CACHED = "one call per item, prompt cache"


def modes(budget: float, max_wait: float) -> list[tuple[str, dict[str, Any]]]:
    """The demo's rows: their names and the options of :func:`run`."""
    return [
        (PLAIN, {"plain": True}),
        (CACHED, {"plain": True, "cache_key": "coalesce-demo"}),
        ("fixed groups of 20", {"max_items": 20, "max_wait": max_wait}),
        (
            f"coalesced, budget {budget:g} s",
            {"max_items": 64, "max_wait": max_wait, "latency_budget": budget},
        ),
    ]


def best_plain(results: Sequence[Result]) -> Result:
    """The cheapest way of sending one call per item: the baseline of ``saved``."""
    plain = [r for r in results if r.name.startswith(PLAIN)] or list(results[:1])
    return min(plain, key=lambda r: r.cost if not math.isnan(r.cost) else math.inf)


def render(results: Sequence[Result]) -> str:
    """The comparison table, in Markdown; ``saved`` is against the cheapest plain row."""
    base = best_plain(results)
    lines = [
        "| mode | p50 | p95 | p99 | within budget | requests | items/request | prompt tokens"
        " | cost (USD) | saved |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        saved = 1 - r.cost / base.cost if base.cost else float("nan")
        lines.append(
            f"| {r.name} | {r.quantile(0.5):.2f} s | {r.quantile(0.95):.2f} s"
            f" | {r.quantile(0.99):.2f} s | {r.within_budget:.1%} | {r.requests}"
            f" | {r.mean_group:.1f} | {r.prompt_tokens:,} | {r.cost:.4f} | {saved:.0%} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[Result], path: str) -> bool:
    """Latency CDF and cost per item, to a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (cdf, cost) = plt.subplots(1, 2, figsize=(11, 4.8))
    for r in results:
        xs = sorted(r.latencies)
        cdf.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=r.name)
    cdf.axvline(results[0].budget, color="grey", linestyle="--", label="latency budget")
    cdf.set(xlabel="latency (s)", ylabel="share of calls", title="Latency CDF")
    # Below the axes, where it hides no curve.
    cdf.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    per_item = [1e6 * r.cost / len(r.latencies) for r in results]
    # Horizontal bars: each mode's name on a line of its own, however long.
    rows = range(len(results))[::-1]
    cost.barh(rows, per_item, color=[f"C{i}" for i in range(len(results))])
    cost.set_yticks(rows, [r.name for r in results], fontsize=8)
    cost.set(xlabel="USD per million items", title="Cost per item")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


async def _demo(args: argparse.Namespace, url: str | None) -> list[Result]:
    import openai

    from ._pricing import cost, price_for

    texts = tickets(args.items, args.seed)
    arrivals = poisson(args.items, args.rate, args.seed)
    price = price_for(args.model)
    results = []
    rows = modes(args.budget, args.max_wait)
    with _progress(len(rows) * args.items) as advance:
        for name, options in rows:
            if url is None:
                client = openai.AsyncOpenAI()
            else:
                client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-simulated")
            async with client:
                measured = await run(
                    client, args.model, texts, arrivals, advance=advance, **options
                )
            usage = (measured.requests, measured.prompt_tokens, measured.completion_tokens)
            cached = measured.cached_tokens
            total = (
                cost(usage[1], usage[2], price, cached_input_tokens=cached)
                if price
                else float("nan")
            )
            latencies, group = measured.latencies, measured.mean_group
            results.append(Result(name, latencies, args.budget, *usage, total, group))
    return results


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[], None]]:
    try:
        from rich.progress import Progress
    except ImportError:  # a plain counter without rich
        done = [0]

        def tick() -> None:
            done[0] += 1
            if done[0] % 100 == 0 or done[0] == total:
                print(f"  {done[0]}/{total} calls", file=sys.stderr)

        yield tick
        return
    with Progress(transient=True) as progress:
        task = progress.add_task("tagging tickets", total=total)
        yield lambda: progress.advance(task)


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: a positive, finite number of ``kind``."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text!r}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``coalesce demo``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="coalesce demo", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=_positive(int), default=500, help="tickets to tag (500)")
    parser.add_argument("--rate", type=_positive(float), default=100.0, help="arrivals/s (100)")
    parser.add_argument("--budget", type=_positive(float), default=2.0, help="budget, s (2.0)")
    parser.add_argument("--max-wait", type=_positive(float), default=0.5, help="wait, s (0.5)")
    parser.add_argument("--model", default="gpt-4o-mini")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--plot", default="coalesce-demo.png", help="PNG to write ('' for none)")
    parser.add_argument("--live", action="store_true", help="use the real provider (needs a key)")
    args = parser.parse_args(argv)
    if args.live:
        if not os.environ.get("OPENAI_API_KEY"):
            parser.error("--live needs OPENAI_API_KEY in the environment")
        print(f"Live run against the OpenAI API with {args.model}: this costs money.")
        results = anyio.run(_demo, args, None)
    else:
        with simulated_provider() as url:
            results = anyio.run(_demo, args, url)
    _report(args, results)
    return 0


def _report(args: argparse.Namespace, results: Sequence[Result]) -> None:
    where = "the OpenAI API" if args.live else "the simulated provider over HTTP"
    print(
        f"\n{args.items} support tickets tagged (category, sentiment, urgency), Poisson"
        f" arrivals at {args.rate:g}/s, {where}, model {args.model}, latency budget"
        f" {args.budget:g} s\n"
    )
    print(render(results))
    best, base = results[-1], best_plain(results)
    fixed = next(r for r in results if r.name.startswith("fixed"))
    print(
        f"\nCoalescing at a {args.budget:g} s budget: {best.within_budget:.1%} of calls within"
        f" budget (one call per item: {base.within_budget:.1%}; fixed groups of 20:"
        f" {fixed.within_budget:.1%}), {base.requests / max(best.requests, 1):.1f}x fewer"
        f" requests, {1 - best.cost / base.cost:.0%} cheaper than one call per item"
        f" ({base.name!r}, the cheaper plain way)."
    )
    if args.plot:
        if plot(results, args.plot):
            print(f"Plot: {args.plot}")
        else:
            print("(install matplotlib for a plot)")
    print("What the columns mean: docs/demo.md in the coalesce documentation.")
