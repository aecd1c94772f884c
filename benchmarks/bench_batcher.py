"""Overhead and window precision of the micro-batcher, against a floor and other libraries.

Run: ``python benchmarks/bench_batcher.py [--quick]`` (about 45 s; ``--quick`` about 10 s).

1. Throughput: N concurrent single-item calls (``asyncio.gather``) through a trivial batch
   function (max 64 items per batch, 5 ms window), for a bare-future floor, coalesce,
   aiodataloader, batched and async-batcher. The systems are interleaved within each
   round, every run gets a fresh event loop, and each caller's result is checked.
2. Window precision: lone calls, one awaited after the other, with ``max_wait=5 ms``;
   how late the batch function is entered after the oldest item's ``max_wait`` expired,
   on asyncio and on trio. Real time is the point here, so ``time.perf_counter()`` reads
   both the arrival and the dispatch.

The tables go to stdout (Markdown, paste-able); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiodataloader
import anyio
import batched  # type: ignore[import-untyped]
from async_batcher.batcher import AsyncBatcher  # type: ignore[import-untyped]

import coalesce

N = 10_000
MAX_ITEMS = 64
MAX_WAIT = 0.005
OFFSET = 1_000_000  # the batch function's "work": each result differs from its item
RUN_TIMEOUT = 60.0  # a system that hangs fails instead of stalling the benchmark
OVERSHOOT_TARGET = 0.002
DASH = "\N{EN DASH}"  # for min-max ranges

Call = Callable[[int], Awaitable[int]]
Cleanup = Callable[[], Awaitable[None]]


async def trivial(items: list[int]) -> list[int]:
    """The batch function every system runs: next to nothing per item."""
    return [x + OFFSET for x in items]


# -- the systems under test (each built inside the running loop of its run) ---------------


class FloorBatcher:
    """The floor: one bare future per caller, resolved in bulk by one task per batch.

    No validation, statistics, cancellation handling or partitions: the least any
    future-based batcher has to do (a future per call, a timer per window, a task per
    batch).
    """

    def __init__(self, fn: Callable[[list[int]], Awaitable[list[int]]]) -> None:
        self._fn = fn
        self._loop = asyncio.get_running_loop()
        self._items: list[int] = []
        self._futures: list[asyncio.Future[int]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, item: int) -> asyncio.Future[int]:
        future = self._loop.create_future()
        self._items.append(item)
        self._futures.append(future)
        if len(self._items) == 1:
            self._timer = self._loop.call_later(MAX_WAIT, self._flush)
        if len(self._items) >= MAX_ITEMS:
            self._flush()
        return future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        task = self._loop.create_task(self._run(items, futures))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, items: list[int], futures: list[asyncio.Future[int]]) -> None:
        for future, result in zip(futures, await self._fn(items), strict=True):
            future.set_result(result)


async def _nothing() -> None:
    pass


async def make_floor() -> tuple[Call, Cleanup]:
    return FloorBatcher(trivial), _nothing


async def make_coalesce() -> tuple[Call, Cleanup]:
    f = coalesce.batch(max_items=MAX_ITEMS, max_wait=MAX_WAIT)(trivial)
    return f, f.aclose


async def make_aiodataloader() -> tuple[Call, Cleanup]:
    # No time window: it dispatches what has queued up by the next loop iteration.
    loader: aiodataloader.DataLoader[int, int] = aiodataloader.DataLoader(
        trivial, max_batch_size=MAX_ITEMS, cache=False
    )
    return loader.load, _nothing


async def make_batched() -> tuple[Call, Cleanup]:
    processor: Any = batched.aio.dynamically(batch_size=MAX_ITEMS, timeout_ms=MAX_WAIT * 1e3)(
        trivial
    )
    # Its background task runs forever; asyncio.run() cancels it when the run ends.
    return processor, _nothing


class _AsyncBatcherTrivial(AsyncBatcher[int, int]):  # type: ignore[misc]
    async def process_batch(self, batch: list[int]) -> list[int]:
        return await trivial(batch)


async def make_async_batcher() -> tuple[Call, Cleanup]:
    batcher = _AsyncBatcherTrivial(max_batch_size=MAX_ITEMS, max_queue_time=MAX_WAIT)

    async def stop() -> None:
        await batcher.stop(force=True)  # unforced, it waits up to 1 s for its queue poll

    return batcher.process, stop


SYSTEMS: dict[str, Callable[[], Awaitable[tuple[Call, Cleanup]]]] = {
    "bare futures resolved in bulk (floor)": make_floor,
    f"coalesce {coalesce.__version__}": make_coalesce,
    "aiodataloader 0.4.3": make_aiodataloader,
    "batched 0.1.5": make_batched,
    "async-batcher 0.2.2": make_async_batcher,
}
FLOOR, COALESCE, DATALOADER = list(SYSTEMS)[:3]


# -- part 1: throughput ---------------------------------------------------------------------


class CheckFailed(Exception):
    """A caller did not get f(its own item)."""


async def _one_run(make: Callable[[], Awaitable[tuple[Call, Cleanup]]]) -> float:
    call, cleanup = await make()
    start = time.perf_counter()
    results = await asyncio.gather(*(call(i) for i in range(N)))
    elapsed = time.perf_counter() - start
    await cleanup()
    wrong = sum(r != i + OFFSET for i, r in enumerate(results))
    if len(results) != N or wrong:
        raise CheckFailed(f"{wrong} of {N} callers got another item's result")
    return N / elapsed


def timed_run(make: Callable[[], Awaitable[tuple[Call, Cleanup]]]) -> float:
    """items/s of one run in a fresh event loop; raises if any result is wrong."""
    gc.collect()

    async def bounded() -> float:
        return await asyncio.wait_for(_one_run(make), RUN_TIMEOUT)

    return asyncio.run(bounded())


@dataclass
class Throughput:
    rates: list[float] = field(default_factory=list)
    error: str | None = None


def measure_throughput(rounds: int) -> dict[str, Throughput]:
    """Interleave the systems, rotating their order each round; round 0 is warm-up."""
    names = list(SYSTEMS)
    out = {name: Throughput() for name in names}
    for round_ in range(rounds + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            if out[name].error is not None:
                continue
            try:
                rate = timed_run(SYSTEMS[name])
            except Exception as exc:  # a broken system is reported, not fatal
                out[name].error = f"{type(exc).__name__}: {exc}"
                continue
            if round_:
                out[name].rates.append(rate)
        print(
            f"  round {round_}/{rounds}{' (warm-up)' if not round_ else ''} done", file=sys.stderr
        )
    return out


# -- part 2: window precision ---------------------------------------------------------------


async def lone_calls(count: int, warmup: int = 20) -> list[float]:
    """Overshoot (dispatch - (arrival + max_wait)), in seconds, of ``count`` lone calls."""
    entered: list[float] = []

    @coalesce.batch(max_items=MAX_ITEMS, max_wait=MAX_WAIT)
    async def fn(items: list[int]) -> list[int]:
        entered.append(time.perf_counter())
        return [x + OFFSET for x in items]

    overshoots: list[float] = []
    for i in range(warmup + count):
        arrival = time.perf_counter()
        result = await fn(i)
        if result != i + OFFSET or len(entered) != i + 1:
            raise CheckFailed(f"lone call {i}: result {result}, {len(entered)} batches")
        if i >= warmup:
            overshoots.append(entered[-1] - (arrival + MAX_WAIT))
    await fn.aclose()
    return overshoots


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- report ---------------------------------------------------------------------------------


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}"


def throughput_table(results: dict[str, Throughput], rounds: int) -> list[str]:
    floor = results[FLOOR]
    floor_median = statistics.median(floor.rates) if floor.rates else float("nan")
    lines = [
        f"N={N:,} concurrent single-item calls (asyncio.gather), no-op batch function,"
        f" max {MAX_ITEMS} per batch, {MAX_WAIT * 1e3:g} ms window; median of {rounds}"
        " interleaved rounds, fresh event loop each",
        "",
        f"| system | items/s (median) | vs floor | min{DASH}max items/s |",
        "|---|---:|---:|---:|",
    ]
    for name, result in results.items():
        if result.error is not None:
            lines.append(f"| {name} | failed: {result.error} | | |")
            continue
        median = statistics.median(result.rates)
        spread = f"{_fmt_rate(min(result.rates))}{DASH}{_fmt_rate(max(result.rates))}"
        lines.append(f"| {name} | {_fmt_rate(median)} | {median / floor_median:.2f} | {spread} |")
    return lines


def window_table(overshoots: dict[str, list[float]], count: int) -> list[str]:
    lines = [
        f"Window precision: {count:,} lone calls (each awaited before the next),"
        f" max_wait={MAX_WAIT * 1e3:g} ms; overshoot = batch function entered"
        " - (arrival + max_wait), time.perf_counter()",
        "",
        "| system | backend | p50 overshoot | p99 overshoot | max overshoot |",
        "|---|---|---:|---:|---:|",
    ]
    for backend, values in overshoots.items():
        p50, p99 = quantile(values, 0.5), quantile(values, 0.99)
        lines.append(
            f"| {COALESCE} | {backend} | {p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms"
            f" | {max(values) * 1e3:.3f} ms |"
        )
    lines.append(
        f"| {DATALOADER} | asyncio | n/a: no max_wait, it dispatches on the next loop"
        " iteration | | |"
    )
    return lines


def verdicts(results: dict[str, Throughput], overshoots: dict[str, list[float]]) -> list[str]:
    ours, theirs = results[COALESCE], results[DATALOADER]
    if ours.error or theirs.error:
        speed = f"UNDECIDED (coalesce: {ours.error or 'ok'}; aiodataloader: {theirs.error or 'ok'})"
    else:
        a, b = statistics.median(ours.rates), statistics.median(theirs.rates)
        # Rounds are interleaved in the same order, so round k of each is a fair pair.
        wins = sum(x >= y for x, y in zip(ours.rates, theirs.rates, strict=True))
        speed = (
            f"{'HOLDS' if a >= b else 'FAILS'}: coalesce {_fmt_rate(a)} vs aiodataloader"
            f" {_fmt_rate(b)} items/s median ({a / b:.2f}x; coalesce ahead in"
            f" {wins}/{len(ours.rates)} rounds)"
        )
    lines = [f"- Target: coalesce items/s >= aiodataloader's, same run — {speed}"]
    for backend, values in overshoots.items():
        p99 = quantile(values, 0.99)
        held = "HOLDS" if p99 <= OVERSHOOT_TARGET else "FAILS"
        lines.append(
            f"- Target: p99 overshoot <= {OVERSHOOT_TARGET * 1e3:g} ms on {backend} — {held}"
            f" (p99 {p99 * 1e3:.3f} ms)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and lone calls")
    args = parser.parse_args()
    rounds, lone = (3, 300) if args.quick else (15, 1000)

    started = time.perf_counter()
    print(f"throughput: {rounds} rounds + 1 warm-up", file=sys.stderr)
    results = measure_throughput(rounds)
    overshoots: dict[str, list[float]] = {}
    for backend in ("asyncio", "trio"):
        print(f"window precision on {backend}: {lone} lone calls", file=sys.stderr)
        gc.collect()
        overshoots[backend] = anyio.run(lone_calls, lone, backend=backend)

    print(
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs,"
        f" {platform.system()} {platform.machine()}; total {time.perf_counter() - started:.0f} s"
    )
    print()
    print("\n".join(throughput_table(results, rounds)))
    print()
    print("\n".join(window_table(overshoots, lone)))
    print()
    print("\n".join(verdicts(results, overshoots)))


if __name__ == "__main__":
    main()
