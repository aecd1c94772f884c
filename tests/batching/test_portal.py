"""The process's background event loop: synchronous calls, their context, stopping."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import anyio
import anyio.lowlevel
import pytest

from coalesce._batching import portal
from coalesce._batching.runtime import CARRIED

_TEAM: contextvars.ContextVar[str] = contextvars.ContextVar("team", default="none")


async def where(value: int) -> tuple[int, str, bool]:
    await anyio.lowlevel.checkpoint()
    return value, threading.current_thread().name, portal.in_background_thread()


def test_a_blocking_call_runs_on_the_background_loop() -> None:
    value, thread, inside = portal.call_blocking(where, 42)
    assert (value, thread, inside) == (42, "coalesce-background-loop", True)
    assert not portal.in_background_thread()
    assert portal.background_runtime().running()


def test_an_exception_reaches_the_caller() -> None:
    async def fails() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        portal.call_blocking(fails)


def test_the_carried_context_variables_cross() -> None:
    async def read() -> str:
        return _TEAM.get()

    CARRIED.append(_TEAM)
    try:
        _TEAM.set("blue")
        assert portal.call_blocking(read) == "blue"
    finally:
        CARRIED.remove(_TEAM)


def test_a_blocking_call_inside_a_running_loop_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match="would stop that loop"):
            portal.call_blocking(where, 1)

    asyncio.run(main())
    anyio.run(main, backend="trio")


def test_a_future_cancelled_cancels_its_call() -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    future = portal.start_blocking(forever)
    started.wait()
    future.cancel()
    assert cancelled.wait(10)


def test_a_stopped_loop_is_started_afresh() -> None:
    first = portal.background_runtime()
    portal.stop_background()
    assert not first.running()
    assert portal.call_blocking(where, 7)[0] == 7
    assert portal.background_runtime() is not first
    portal.stop_background()  # stopping twice is harmless
    portal.stop_background()
