"""The few things coalesce needs from the running event loop, asyncio or trio.

A batcher parks every caller on a *waiter* and wakes it when its result is known.
anyio has no primitive that is cheap enough to spend one per call (an
``anyio.Event`` costs several times a bare future), so this module gives each
backend its cheapest native one: an ``asyncio.Future`` on asyncio, and a parked
task that is rescheduled directly on trio. Background work (a batch being run, the
window timer) is spawned as a loop-level task: ``loop.create_task`` on asyncio, a
trio *system task* on trio, so that a batch never runs inside, and is never
cancelled with, one of its callers.

Time is read from the running loop's clock, the same clock ``anyio.current_time()``
reads, so virtual clocks (trio's ``MockClock``, ``looptime``) drive every window.
"""

from __future__ import annotations

import asyncio
import collections.abc
import functools
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

R = TypeVar("R")

__all__ = ["AsyncioCall", "AsyncioRuntime", "Runtime", "TrioRuntime", "current_runtime"]


class Runtime:
    """Waiters, spawning and the clock of one running event loop."""

    #: Identity of the loop this runtime belongs to (the loop, or trio's token).
    owner: object
    #: The loop's monotonic clock, in seconds.
    clock: Callable[[], float]
    #: The backend's cancellation exception class.
    cancelled: type[BaseException]
    #: Whether a waiter is itself awaitable by the caller (asyncio's futures are).
    awaitable_waiters: bool = False

    def new_waiter(self) -> Any:
        """A fresh waiter, to be resolved exactly once by :meth:`resolve`/:meth:`fail`."""
        raise NotImplementedError

    def resolve(self, waiter: Any, value: Any) -> bool:
        """Hand ``value`` to the waiter; False if its caller already left."""
        raise NotImplementedError

    def fail(self, waiter: Any, error: BaseException) -> bool:
        """Hand ``error`` to the waiter; False if its caller already left."""
        raise NotImplementedError

    async def wait(self, waiter: Any) -> Any:
        """Park until the waiter is resolved; a cancelled caller's waiter is withdrawn."""
        raise NotImplementedError

    def deliver(self, waiters: list[Any], results: list[Any]) -> tuple[int, int]:
        """Resolve each waiter with its result (an exception instance fails it).

        Returns:
            How many waiters received a value and how many an exception; callers that
            already left are not counted.
        """
        completed = failed = 0
        for waiter, result in zip(waiters, results, strict=False):
            if isinstance(result, BaseException):
                failed += self.fail(waiter, result)
            else:
                completed += self.resolve(waiter, result)
        return completed, failed

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``fn(*args)`` as a background task of the loop."""
        raise NotImplementedError


class AsyncioCall(asyncio.Future[Any]):
    """One caller's pending result on asyncio: a future that also acts as a coroutine.

    Being a future lets ``asyncio.gather`` wait on it without creating a task per
    call (a task costs several times the whole batching overhead). Implementing the
    coroutine protocol lets ``asyncio.create_task()`` and anyio's ``start_soon()``
    accept it like the coroutine an ``async def`` would return. Cancelling it (which
    is what cancelling the task awaiting it does) withdraws its item from its batch
    if the batch has not been dispatched yet.
    """

    __slots__ = ()

    # Set per runtime on a subclass (see AsyncioRuntime), so creating a call is one
    # C-level constructor call with no Python frame.
    _on_cancel: Callable[[Any], None]

    def cancel(self, msg: Any | None = None) -> bool:
        if self.done():
            return False
        self._on_cancel(self)
        return super().cancel(msg)

    # A future's iterator keeps no state of its own (it asks the future each time),
    # so a fresh one per step drives the wait exactly like ``await``.

    def send(self, value: Any) -> Any:
        """Coroutine protocol: advance the wait (used when a task drives it)."""
        return self.__await__().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Coroutine protocol: raise inside the wait."""
        if val is None and tb is None:
            return self.__await__().throw(typ)
        return self.__await__().throw(typ, val, tb)  # pragma: no cover - legacy signature

    def close(self) -> None:
        """Coroutine protocol: stop waiting without cancelling the item."""


collections.abc.Coroutine.register(AsyncioCall)


class AsyncioRuntime(Runtime):
    """asyncio: one :class:`AsyncioCall` per caller, background work in loop tasks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_cancel: Callable[[Any], None]) -> None:
        self.owner = loop
        # A stock loop's time() is a Python method returning time.monotonic(); calling
        # the latter directly reads the very same clock without a Python frame per
        # item. A loop with its own clock (looptime, uvloop) keeps its own.
        stock = type(loop).time is asyncio.BaseEventLoop.time
        self.clock = time.monotonic if stock else loop.time
        self.cancelled = asyncio.CancelledError
        self.awaitable_waiters = True
        self.loop = self._loop = loop
        call_class = type(
            "AsyncioCall", (AsyncioCall,), {"__slots__": (), "_on_cancel": staticmethod(on_cancel)}
        )
        self.new_waiter = functools.partial(call_class, loop=loop)  # type: ignore[method-assign]
        # The loop keeps only weak references to tasks; keep them alive until done.
        self._tasks: set[asyncio.Task[None]] = set()

    def resolve(self, waiter: AsyncioCall, value: Any) -> bool:
        if waiter.done():
            return False
        waiter.set_result(value)
        return True

    def fail(self, waiter: AsyncioCall, error: BaseException) -> bool:
        if waiter.done():
            return False
        waiter.set_exception(error)
        return True

    async def wait(self, waiter: AsyncioCall) -> Any:
        return await waiter

    def deliver(self, waiters: list[Any], results: list[Any]) -> tuple[int, int]:
        # The hot loop of every batch: no method call per item.
        completed = failed = 0
        for waiter, result in zip(waiters, results, strict=False):
            if waiter.done():
                continue
            if isinstance(result, BaseException):
                waiter.set_exception(result)
                failed += 1
            else:
                waiter.set_result(result)
                completed += 1
        return completed, failed

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        task = self._loop.create_task(fn(*args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _TrioWaiter(Generic[R]):
    __slots__ = ("gone", "outcome", "task")

    def __init__(self) -> None:
        self.task: Any = None
        self.outcome: Any = None
        self.gone = False


class TrioRuntime(Runtime):
    """trio: callers park with ``wait_task_rescheduled``, background work in system tasks."""

    def __init__(self, trio_module: Any, on_cancel: Callable[[Any], None]) -> None:
        self._trio = trio_module
        self._on_cancel = on_cancel
        self._lowlevel = trio_module.lowlevel
        import outcome  # trio depends on it

        self._value = outcome.Value
        self._error = outcome.Error
        self.owner = trio_module.lowlevel.current_trio_token()
        self.clock = trio_module.current_time
        self.cancelled = trio_module.Cancelled

    def new_waiter(self) -> _TrioWaiter[Any]:
        return _TrioWaiter()

    def _deliver(self, waiter: _TrioWaiter[Any], result: Any) -> bool:
        if waiter.gone or waiter.outcome is not None:
            return False
        if waiter.task is not None:
            self._lowlevel.reschedule(waiter.task, result)
            waiter.task = None
            waiter.gone = True
        else:  # resolved before its caller started waiting
            waiter.outcome = result
        return True

    def resolve(self, waiter: _TrioWaiter[Any], value: Any) -> bool:
        return self._deliver(waiter, self._value(value))

    def fail(self, waiter: _TrioWaiter[Any], error: BaseException) -> bool:
        return self._deliver(waiter, self._error(error))

    async def wait(self, waiter: _TrioWaiter[Any]) -> Any:
        if waiter.outcome is not None:
            await self._lowlevel.checkpoint()
            waiter.gone = True
            return waiter.outcome.unwrap()
        waiter.task = self._lowlevel.current_task()

        def abort(_: Any) -> Any:
            waiter.task = None
            waiter.gone = True
            self._on_cancel(waiter)
            return self._lowlevel.Abort.SUCCEEDED

        return await self._lowlevel.wait_task_rescheduled(abort)

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        self._lowlevel.spawn_system_task(fn, *args)


def current_runtime(on_cancel: Callable[[Any], None]) -> Runtime:
    """The runtime of the running event loop.

    Args:
        on_cancel: Called with a waiter whose caller was cancelled before its result.

    Raises:
        RuntimeError: If no asyncio or trio event loop is running in this thread.
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        return AsyncioRuntime(loop, on_cancel)
    trio_module: Any = sys.modules.get("trio")
    if trio_module is not None:
        try:
            trio_module.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            return TrioRuntime(trio_module, on_cancel)
    raise RuntimeError(
        "coalesce needs a running asyncio or trio event loop; call it from async code"
        " (for example inside anyio.run(...) or asyncio.run(...))"
    )


def running_owner() -> object | None:
    """Identity of the running loop without building a runtime (fast path)."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop
    trio_module: Any = sys.modules.get("trio")
    if trio_module is not None:
        try:
            token: object = trio_module.lowlevel.current_trio_token()
        except RuntimeError:
            return None
        return token
    return None
