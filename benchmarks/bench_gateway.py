"""Issue 23's tables: ``coalesce serve`` in front of the simulated provider.

**Savings across processes.** 8 client processes each send calls as a Poisson stream
at 2 calls/s (600 calls in all, ``--calls``), with a 2 s latency budget, to the
simulated provider over HTTP (``bench_budget.py``'s provider and task: time to first
token 0.35 s, 80 tokens/s, a support ticket triaged after ~400 tokens of shared
instructions), three ways in one run:

* through the gateway: each process's plain ``openai.AsyncOpenAI`` points at one
  ``coalesce serve --budget 2`` (its own process), which coalesces all of them; twice,
  on an empty ``$COALESCE_STORE`` directory of the run's own: a fresh gateway (its
  group cap learned from 4 as it goes: what the learning costs), then a gateway
  restarted on what the first one learned (a gateway in service);
* through a fresh gateway started without ``--budget``, on an empty store of its own,
  each client sending ``x-coalesce-budget: 2`` on every call (the budget given per call
  only: it must size the wait as ``--budget 2`` does);
* each process wrapping its own client (``coalesce.wrap(client, latency_budget=2)``):
  each coalesces only its own 2 calls/s (from the same learned cap);
* plain calls (the baseline of every ratio).

It prints prompt tokens against plain calls, mean calls per upstream request, p50/p95
latency as each client measured it, the share of calls within the budget, and errors
(an exception, or an answer other than the simulator's known one).

**Overhead.** The gateway with coalescing off (``--max-items 1``: every call goes
upstream alone) against the same calls sent straight to the simulator, which answers
after a fixed 10 ms (``--overhead-ttft``) so that the difference is the gateway's:
Poisson calls at 200/s from 2 client processes (raw ``aiohttp``, one kept-alive
connection pool each), the added p50 and p99; then 500 calls/s with the gateway's
process pinned to one core (``sched_setaffinity``), the rate achieved and the errors.

Run: ``python benchmarks/bench_gateway.py [--quick] [--only savings|overhead]
[--calls 600] [--max-items N]``. ``--quick`` sends 200 calls in the first table and
runs each overhead load for 3 s instead of 10. Each arm takes ``calls / 16`` seconds of
traffic (37 s at 600 calls), plus process start-up; nothing is read from or left in the
user's own store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import anyio
import httpx
from bench_budget import INSTRUCTIONS, MODEL, Triage, simulator, tickets

import coalesce
from coalesce._demo import simulated_provider
from coalesce.testing import expected_output

BUDGET = 2.0
PROCESSES = 8
RATE = 2.0  # calls per second, per process
OVERHEAD_TTFT = 0.01
OVERHEAD_PROCESSES = 2
ARMS = (
    "through the gateway, its first calls",
    "through the gateway, restarted",
    "through the gateway, budget per call only, its first calls",
    "each process wraps its own client",
    "plain calls",
)
"""The rows of the first table. The targets: the fresh gateway's first calls at most
0.40x plain calls' prompt tokens, the restarted one too, and the budget given per call
only within 0.03x of the same budget given with ``--budget`` (both fresh)."""
PER_CALL = ARMS[2]


# -- the client processes ------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """What one client process sends.

    Attributes:
        mode: ``"sdk"`` (the openai SDK's ``parse``), ``"wrap"`` (the same through
            ``coalesce.wrap``) or ``"http"`` (raw ``aiohttp`` posts of the same body).
        url: The OpenAI base URL (``.../v1``) it sends to.
        texts: Its tickets, one per call.
        arrivals: When each call starts, in seconds after the shared start.
        options: ``coalesce.wrap``'s options besides the budget (``"wrap"`` only).
        headers: Sent with every call (``"sdk"`` only): ``x-coalesce-budget``, say.
        warm_url: Where the process makes one untimed call before its calls start, with
            a plain SDK client: a process's first call pays for the SDK's own set-up
            (its HTTP client, the pydantic schema of ``parse``), not the gateway's or
            coalesce's, so the simulator's URL, where no arm learns from it ("": none).
    """

    mode: str
    url: str
    texts: tuple[str, ...]
    arrivals: tuple[float, ...]
    options: tuple[tuple[str, Any], ...] = ()
    warm_url: str = ""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """One call as its client saw it: seconds to its answer, its error, if any, and when
    it ended (wall clock)."""

    seconds: float
    error: str | None = None
    ended: float = 0.0


def body(text: str) -> dict[str, Any]:
    """The chat completion the SDK's ``parse`` sends for ``text`` (for raw posts)."""
    from openai.lib._pydantic import to_strict_json_schema

    schema = {"name": "Triage", "schema": to_strict_json_schema(Triage), "strict": True}
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": text},
        ],
        "response_format": {"type": "json_schema", "json_schema": schema},
    }


def _right(text: str, answer: Any) -> bool:
    expected = expected_output(text, body(text)["response_format"]["json_schema"]["schema"])
    return bool(answer == expected)


def _sdk_call(work: Work) -> Any:
    """One call of ``work``'s client: the SDK's ``parse`` (wrapped or not)."""
    import openai

    client: Any = openai.AsyncOpenAI(
        base_url=work.url, api_key="sk-bench", timeout=30.0, default_headers=dict(work.headers)
    )
    if work.mode == "wrap":
        client = coalesce.wrap(client, latency_budget=BUDGET, **dict(work.options))

    async def call(text: str) -> Any:
        reply = await client.chat.completions.parse(
            model=MODEL,
            messages=[
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": text},
            ],
            response_format=Triage,
        )
        parsed = reply.choices[0].message.parsed
        return None if parsed is None else parsed.model_dump()

    return client.close, call


async def _warm_up(work: Work) -> None:
    """One untimed call to ``work.warm_url`` with a plain SDK client (see :class:`Work`)."""
    if not work.warm_url or work.mode == "http":
        return
    _close, call = _sdk_call(Work("sdk", work.warm_url, (), ()))
    await call("warm-up: the printer is out of toner")
    await _close()


def _http_call(work: Work) -> Any:
    """One call of ``work``'s client: a raw ``aiohttp`` post of the SDK's body, on one
    kept-alive connection pool. aiohttp, not httpx: at 250 calls/s a client process on
    httpx takes most of a core (its pool rescans every connection for each request),
    CPU the gateway it measures would not have."""
    import aiohttp

    session = aiohttp.ClientSession(
        headers={"authorization": "Bearer sk-bench", "content-type": "application/json"},
        timeout=aiohttp.ClientTimeout(total=30.0),
        connector=aiohttp.TCPConnector(limit=200),
    )
    url = f"{work.url}/chat/completions"
    bodies = {text: json.dumps(body(text)).encode() for text in work.texts}

    async def call(text: str) -> Any:
        async with session.post(url, data=bodies[text]) as response:
            await response.read()
            return response.status == 200

    return session.close, call


async def _send(work: Work, start_at: float) -> list[Outcome]:
    """Send ``work``'s calls at their arrival times from ``start_at`` (wall clock)."""
    close, call = _http_call(work) if work.mode == "http" else _sdk_call(work)
    outcomes: list[Outcome] = []

    async def one(text: str) -> None:
        began = time.perf_counter()
        try:
            answer = await call(text)
        except Exception as exc:
            seconds, error = time.perf_counter() - began, type(exc).__name__
        else:
            seconds = time.perf_counter() - began  # checked after the clock stopped
            right = answer is True if work.mode == "http" else _right(text, answer)
            error = None if right else "wrong"
        outcomes.append(Outcome(seconds, error, time.time()))

    await anyio.sleep(max(0.0, start_at - time.time()))
    origin = time.perf_counter()
    async with anyio.create_task_group() as group:
        for text, at in zip(work.texts, work.arrivals, strict=True):
            await anyio.sleep(max(0.0, at - (time.perf_counter() - origin)))
            group.start_soon(one, text)
    await close()
    return outcomes


def _process(work: Work, ready: Any, start: Any, results: Any) -> None:
    """A client process: imports done, it says so, waits for the start time, sends."""
    warnings.simplefilter("ignore")
    anyio.run(_warm_up, work)
    ready.put(os.getpid())
    start_at = start.get()
    results.put(anyio.run(_send, work, start_at))


def run_clients(works: Sequence[Work]) -> tuple[list[Outcome], float]:
    """Run each of ``works`` in a process of its own, all starting together; their
    outcomes, and the seconds from the start to the last call's end."""
    context = mp.get_context("spawn")
    ready, start, results = context.Queue(), context.Queue(), context.Queue()
    processes = [context.Process(target=_process, args=(w, ready, start, results)) for w in works]
    for process in processes:
        process.start()
    try:
        for _ in works:
            _get(ready, processes)
        start_at = time.time() + 0.5
        for _ in works:
            start.put(start_at)
        outcomes = [outcome for _ in works for outcome in _get(results, processes)]
        return outcomes, max(o.ended for o in outcomes) - start_at
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()


def _get(queue: Any, processes: Sequence[Any]) -> Any:
    """The next value on ``queue``, failing if a client process died before giving it."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=1.0)
        except queues.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a client process failed (its traceback is above)") from None


def poisson(count: int, rate: float, rng: random.Random) -> tuple[float, ...]:
    """``count`` arrival times of a Poisson stream at ``rate`` per second."""
    at, times = 0.0, []
    for _ in range(count):
        at += rng.expovariate(rate)
        times.append(at)
    return tuple(times)


def split(
    mode: str,
    url: str,
    calls: int,
    processes: int,
    rate: float,
    seed: int,
    warm_url: str = "",
    headers: tuple[tuple[str, str], ...] = (),
    **options: Any,
) -> list[Work]:
    """``calls`` different tickets over ``processes`` clients, each at ``rate``."""
    rng, texts = random.Random(seed), tickets(calls)
    return [
        Work(
            mode,
            url,
            tuple(texts[n::processes]),
            poisson(len(texts[n::processes]), rate, rng),
            tuple(options.items()),
            warm_url,
            headers,
        )
        for n in range(processes)
    ]


# -- the servers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """A gateway process: its OpenAI base URL and its process id."""

    url: str
    pid: int


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds (user and system) process ``pid`` has used, where ``/proc`` says."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def gateway(sim_url: str, *flags: str, core: int | None = None) -> Iterator[Served]:
    """``coalesce serve`` in front of the simulator, in its own process (pinned to
    ``core`` if given)."""
    command = [
        sys.executable, "-m", "coalesce", "serve", "--port", "0",
        "--openai-upstream", f"{sim_url}/v1", *flags,
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        try:
            if core is not None:
                os.sched_setaffinity(process.pid, {core})
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            if not line.startswith("coalesce gateway listening on "):
                log.seek(0)
                raise RuntimeError(f"the gateway did not start: {log.read().decode()}")
            yield Served(f"{line.split()[-1]}/v1", process.pid)
        finally:
            process.terminate()
            process.wait(30)
            if process.stdout is not None:
                process.stdout.close()


def reset(sim_url: str) -> None:
    httpx.post(f"{sim_url}/_sim/reset")


def totals(sim_url: str) -> dict[str, Any]:
    """What reached the simulator since its last reset."""
    result: dict[str, Any] = httpx.get(f"{sim_url}/_sim/stats", timeout=30.0).json()["totals"]
    return result


# -- the tables ----------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


def savings(
    calls: int, seed: int, max_wait: float | None, max_items: int | None
) -> dict[str, dict[str, Any]]:
    """The arms of the first table: the gateway and ``wrap`` with the same options."""
    options: dict[str, Any] = {}
    if max_wait is not None:
        options["max_wait"] = max_wait
    if max_items is not None:
        options["max_items"] = max_items
    flags = ["--log-level", "warning"]
    for name, value in options.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    runs: dict[str, dict[str, Any]] = {}
    with simulator() as sim_url, _fresh_store() as directory:
        for arm in ARMS:
            reset(sim_url)
            with contextlib.ExitStack() as stack:
                mode, url, headers = _arm(stack, arm, sim_url, flags, directory)
                print(f"  {arm} ...", file=sys.stderr, flush=True)
                works = split(
                    mode, url, calls, PROCESSES, RATE, seed, f"{sim_url}/v1", headers, **options
                )
                outcomes, _ = run_clients(works)
            runs[arm] = {"outcomes": outcomes, **totals(sim_url)}
    return runs


def _arm(
    stack: contextlib.ExitStack, arm: str, sim_url: str, flags: list[str], directory: str
) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """Where ``arm``'s clients send (its gateway started on ``stack``): their mode, the
    URL and the headers of every call."""
    if arm == ARMS[-1]:
        return "sdk", f"{sim_url}/v1", ()
    if arm == ARMS[-2]:
        return "wrap", f"{sim_url}/v1", ()
    if arm == PER_CALL:  # no --budget, a fresh store of its own: the header says it all
        store = os.path.join(directory, "per-call", "jobs.sqlite3")
        stack.enter_context(mock.patch.dict(os.environ, {"COALESCE_STORE": store}))
        served = stack.enter_context(gateway(sim_url, *flags))
        return "sdk", served.url, (("x-coalesce-budget", f"{BUDGET:g}"),)
    served = stack.enter_context(gateway(sim_url, "--budget", f"{BUDGET:g}", *flags))
    return "sdk", served.url, ()


@contextlib.contextmanager
def _fresh_store() -> Iterator[str]:
    """An empty ``$COALESCE_STORE`` directory for the run (its path), inherited by the
    gateway and the client processes: the group cap is learned from its start (4) in the
    first arm, and the later arms start where it stopped, as a restarted gateway, or
    another process of the same app, does (``docs/accuracy.md``, the learned group cap).
    """
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as directory:
        store = {"COALESCE_STORE": os.path.join(directory, "jobs.sqlite3")}
        with mock.patch.dict(os.environ, store):
            yield directory


def print_savings(runs: dict[str, dict[str, Any]], calls: int, options: str) -> None:
    plain = runs[ARMS[-1]]["prompt_tokens"]
    print(
        f"\n{calls} calls from {PROCESSES} processes at {RATE:g} calls/s each (Poisson),"
        f" budget {BUDGET:g} s, {options}; simulated provider over HTTP (bench_budget.py's"
        " profile)\n"
    )
    print(
        "| arm | requests | mean calls per request | prompt tokens | vs plain | p50 | p95"
        " | within budget | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arm, run in runs.items():
        outcomes: list[Outcome] = run["outcomes"]
        seconds = [o.seconds if o.error is None else math.inf for o in outcomes]
        errors = [o.error for o in outcomes if o.error is not None]
        shown = ", ".join(f"{n} {e}" for e, n in sorted(_count(errors).items())) or "0"
        print(
            f"| {arm} | {run['requests']} | {len(outcomes) / max(run['requests'], 1):.1f}"
            f" | {run['prompt_tokens']:,} | {run['prompt_tokens'] / plain:.2f}x"
            f" | {quantile(seconds, 0.5):.2f} s | {quantile(seconds, 0.95):.2f} s"
            f" | {sum(s <= BUDGET for s in seconds) / len(seconds):.1%} | {shown} |"
        )
    ratios = {arm: run["prompt_tokens"] / plain for arm, run in runs.items()}
    for arm in ARMS[:2]:
        print(f"\nTarget, {arm}, prompt tokens <= 0.40x plain: {_holds(ratios[arm] <= 0.40)}")
    gap = ratios[PER_CALL] - ratios[ARMS[0]]
    print(
        f"Target, the budget per call only within 0.03x of --budget (both fresh):"
        f" {_holds(abs(gap) <= 0.03)} ({gap:+.3f}x)"
    )
    for arm in ARMS[:3]:
        outcomes = runs[arm]["outcomes"]
        within = sum(o.error is None and o.seconds <= BUDGET for o in outcomes) / calls
        print(f"Target, {arm}, >= 99% within budget: {_holds(within >= 0.99)}")


def _count(values: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def _holds(ok: bool) -> str:
    return "HOLDS" if ok else "FAILS"


@dataclass(frozen=True)
class Run:
    """One run of the overhead table: its outcomes, the seconds from its start to its
    last answer, and the gateway's CPU milliseconds per call (``None``: direct)."""

    name: str
    rate: float
    outcomes: list[Outcome]
    wall: float
    cpu_ms: float | None = None


def overhead(seconds: float, seed: int) -> list[Run]:
    """The overhead table's runs."""
    latency = {"default": {"ttft": OVERHEAD_TTFT, "prompt_token_seconds": 0.0,
                           "tokens_per_second": 1_000_000.0}}  # fmt: skip
    flags = ("--max-items", "1", "--budget", str(BUDGET))
    found: list[Run] = []
    with simulated_provider(latency=latency, output_tokens=12) as sim_url:
        plan: list[tuple[str, float, int | None]] = [
            ("direct", 200.0, None),
            ("gateway", 200.0, None),
            ("direct", 500.0, None),
            ("gateway, one core", 500.0, 0),
        ]
        for name, rate, core in plan:
            with contextlib.ExitStack() as stack:
                served = None
                if name != "direct":
                    served = stack.enter_context(gateway(sim_url, *flags, core=core))
                url = served.url if served is not None else f"{sim_url}/v1"
                works = split(
                    "http", url, int(rate * seconds), OVERHEAD_PROCESSES,
                    rate / OVERHEAD_PROCESSES, seed,
                )  # fmt: skip
                warm = [
                    Work("http", url, w.texts[:20], tuple(0.01 * i for i in range(20)))
                    for w in works
                ]
                run_clients(warm)
                print(f"  {name} at {rate:g}/s ...", file=sys.stderr, flush=True)
                before = cpu_seconds(served.pid) if served is not None else None
                outcomes, wall = run_clients(works)
                after = cpu_seconds(served.pid) if served is not None else None
                cpu = None if before is None or after is None else after - before
                per_call = None if cpu is None else cpu / len(outcomes) * 1000
                found.append(Run(name, rate, outcomes, wall, per_call))
    return found


def print_overhead(runs: list[Run], seconds: float) -> None:
    print(
        f"\nOverhead with coalescing off (--max-items 1): Poisson calls from"
        f" {OVERHEAD_PROCESSES} client processes (raw aiohttp), {seconds:g} s of traffic per run;"
        f" the simulator answers after a fixed {OVERHEAD_TTFT * 1000:g} ms\n"
    )
    print("| run | offered rate | achieved rate | p50 | p99 | errors | gateway CPU per call |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    by: dict[tuple[str, float], list[float]] = {}
    for run in runs:
        ok = [o.seconds for o in run.outcomes if o.error is None]
        by[(run.name, run.rate)] = ok
        errors = len(run.outcomes) - len(ok)
        cpu = "" if run.cpu_ms is None else f"{run.cpu_ms:.2f} ms"
        print(
            f"| {run.name} | {run.rate:g}/s | {len(ok) / run.wall:.0f}/s"
            f" | {quantile(ok, 0.5) * 1000:.1f} ms | {quantile(ok, 0.99) * 1000:.1f} ms"
            f" | {errors} | {cpu} |"
        )
    direct, through = by[("direct", 200.0)], by[("gateway", 200.0)]
    p50 = (quantile(through, 0.5) - quantile(direct, 0.5)) * 1000
    p99 = (quantile(through, 0.99) - quantile(direct, 0.99)) * 1000
    print(f"\nAdded by the gateway at 200/s: p50 {p50:+.1f} ms, p99 {p99:+.1f} ms")
    print(f"Target added p50 <= 2 ms: {_holds(p50 <= 2)}; added p99 <= 10 ms: {_holds(p99 <= 10)}")
    last = runs[-1]
    errors = sum(o.error is not None for o in last.outcomes)
    achieved = (len(last.outcomes) - errors) / last.wall
    print(
        f"Target 500/s on one core with no error: {_holds(errors == 0 and achieved >= 0.95 * 500)}"
        f" ({achieved:.0f}/s achieved, {errors} errors)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 calls; 3 s overhead runs")
    parser.add_argument("--only", choices=("savings", "overhead"))
    parser.add_argument("--calls", type=int, help="calls in the first table (default 600)")
    parser.add_argument(
        "--max-wait", type=float, help="of the coalescing arms (default: a quarter of each budget)"
    )
    parser.add_argument(
        "--max-items", type=int, help="of both coalescing arms (default: learned from 4)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    calls = args.calls or (200 if args.quick else 600)
    seconds = 3.0 if args.quick else 10.0
    warnings.simplefilter("ignore", coalesce.CoalesceWarning)  # offline token counts
    if args.only != "overhead":
        runs = savings(calls, args.seed, args.max_wait, args.max_items)
        wait = "default" if args.max_wait is None else f"{args.max_wait:g} s"
        shown = f"max_wait {wait}, max_items {args.max_items or 'default'}"
        print_savings(runs, calls, shown)
    if args.only != "savings":
        print_overhead(overhead(seconds, args.seed), seconds)


if __name__ == "__main__":
    main()
