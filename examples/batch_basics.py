"""The batcher in thirty lines: many concurrent single-item calls, few batch calls.

Run it with ``python examples/batch_basics.py``.
"""

from __future__ import annotations

import anyio

import coalesce

PRICES = {"apple": 3, "pear": 4, "plum": 2}


@coalesce.batch(max_wait=0.01, max_items=16)
async def lookup(names: list[str]) -> list[int | Exception]:
    """One round trip for the whole group (a database, an API, a model)."""
    await anyio.sleep(0.05)  # the cost we pay once per batch instead of once per item
    return [PRICES[name] if name in PRICES else KeyError(name) for name in names]


async def main() -> None:
    names = ["apple", "pear", "plum", "kiwi"] * 10
    answers: dict[int, object] = {}

    async def one(index: int, name: str) -> None:
        try:
            answers[index] = await lookup(name)
        except KeyError as exc:  # only the caller of the unknown item gets this
            answers[index] = f"unknown: {exc}"

    async with anyio.create_task_group() as tg:
        for index, name in enumerate(names):
            tg.start_soon(one, index, name)

    stats = lookup.statistics()
    print(f"{len(names)} calls -> {stats.batches} batch calls {dict(stats.dispatch_reasons)}")
    print(f"first answers: {[answers[i] for i in range(4)]}")
    print(f"wait p50 {stats.wait_p50 * 1e3:.1f} ms, p99 {stats.wait_p99 * 1e3:.1f} ms")


if __name__ == "__main__":
    anyio.run(main)
