"""Gateways joined as one fleet, for the tests: each served in a thread (``_serving``),
all in front of one simulator, all given one NATS server's URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from _serving import Running, gateway_config, serving

from coalesce._fleet import Member


def member_of(running: Running) -> Member:
    member = running.state.member
    assert member is not None
    return member


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (without measuring) until ``condition()`` holds; a hang ends the test."""
    for _ in range(3000):  # polled: the state is another thread's (or process's)
        if condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"never {what}")


async def until_async(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """:func:`until` for a condition that must be awaited (an HTTP request)."""
    for _ in range(3000):
        if await condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"never {what}")


@asynccontextmanager
async def fleet(
    sim_url: str, nats_url: str, size: int = 2, **options: Any
) -> AsyncIterator[list[Running]]:
    """``size`` gateways in one fleet, each connected to NATS and its lease bucket."""
    async with AsyncExitStack() as stack:
        members = [
            await stack.enter_async_context(
                serving(gateway_config(sim_url, fleet=nats_url, **options))
            )
            for _ in range(size)
        ]
        for running in members:
            await until(lambda r=running: member_of(r).connected, "joined")
        yield members
