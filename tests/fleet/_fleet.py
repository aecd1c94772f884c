"""Gateways joined as one fleet, for the tests: each served in a thread (``_serving``),
all in front of one simulator, all given one NATS server's URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
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
    with anyio.fail_after(30):
        while not condition():
            await anyio.sleep(0.01)


@asynccontextmanager
async def fleet(sim_url: str, nats_url: str, size: int = 2, **options: Any) -> AsyncIterator[list[Running]]:
    """``size`` gateways in one fleet, each connected to NATS and its lease bucket."""
    async with AsyncExitStack() as stack:
        members = [
            await stack.enter_async_context(serving(gateway_config(sim_url, fleet=nats_url, **options)))
            for _ in range(size)
        ]
        for running in members:
            await until(lambda r=running: member_of(r).connected, "joined")
        yield members
