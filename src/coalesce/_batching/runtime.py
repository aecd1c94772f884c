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

A batcher serves one loop at a time; a call made on another loop is *forwarded*
(:func:`forward`) to the background loop: it runs as a task there, and its caller
awaits the outcome on its own loop. Cancelling the caller cancels that task, which
withdraws its item. :func:`at_loop_end` runs clean-up as a loop ends (a provider's
connection pool for that loop).
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import functools
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

import anyio

R = TypeVar("R")

__all__ = [
    "CARRIED",
    "AsyncioCall",
    "AsyncioRuntime",
    "LoopEnded",
    "Runtime",
    "TrioRuntime",
    "at_loop_end",
    "carried_context",
    "current_runtime",
    "current_time",
    "forward",
    "running_owner",
    "set_context",
    "spawn_on",
    "spawn_task",
]


class LoopEnded(RuntimeError):
    """The loop a call was forwarded to ended (or cancelled it) before answering it."""


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

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` in the loop's thread soon; callable from any thread.

        Raises:
            RuntimeError: The loop has ended (asyncio's "Event loop is closed", trio's
                ``RunFinishedError``).
        """
        raise NotImplementedError

    def running(self) -> bool:
        """Whether the loop still runs, so that a call forwarded to it is served."""
        raise NotImplementedError

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
        self._pid = os.getpid()  # a forked child has the loop's memory, not its thread

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> None:
        # In a context of its own: the calling thread's (its loop's sniffio and anyio
        # variables) must not leak into the tasks the callback spawns.
        self._loop.call_soon_threadsafe(fn, *args, context=contextvars.Context())

    def running(self) -> bool:
        loop = self._loop
        return loop.is_running() and not loop.is_closed() and os.getpid() == self._pid

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
        self.owner = token = trio_module.lowlevel.current_trio_token()
        self.clock = trio_module.current_time
        self.cancelled = trio_module.Cancelled
        self.call_soon_threadsafe = token.run_sync_soon  # type: ignore[method-assign]

    def running(self) -> bool:
        try:
            self.call_soon_threadsafe(_nothing)  # refused once the run has finished
        except RuntimeError:
            return False
        return True

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


def current_time() -> float:
    """``anyio.current_time()``: the running loop's clock. On asyncio it is read as
    anyio reads it (``loop.time()``), without anyio's look-up of the running library
    first; it is read often enough for that to count.

    Raises:
        RuntimeError: If no asyncio or trio event loop is running in this thread.
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop.time()
    return anyio.current_time()


def spawn_task(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """Run ``fn(*args)`` as a background task of the running loop, in a copy of the
    current context: an asyncio task (kept alive until done), or a trio system task.

    Raises:
        RuntimeError: If no asyncio or trio event loop is running in this thread.
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        task = loop.create_task(fn(*args))
        _background_tasks.add(task)
        task.add_done_callback(_background_tasks.discard)
        return
    if running_owner() is None:
        raise RuntimeError("coalesce needs a running asyncio or trio event loop")
    trio_module: Any = sys.modules["trio"]
    trio_module.lowlevel.spawn_system_task(fn, *args, context=contextvars.copy_context())


_background_tasks: set[asyncio.Task[Any]] = set()


def spawn_on(owner: object, fn: Callable[[], Coroutine[Any, Any, Any]]) -> bool:
    """Run ``fn()`` as a background task of the loop ``owner`` names (an asyncio loop,
    or a trio token, as :func:`running_owner` gives them), from any thread.

    Returns:
        False if that loop has ended.
    """
    try:
        if isinstance(owner, asyncio.AbstractEventLoop):
            owner.call_soon_threadsafe(_spawn_asyncio, owner, fn, context=contextvars.Context())
        else:
            spawn = sys.modules["trio"].lowlevel.spawn_system_task
            owner.run_sync_soon(spawn, fn)  # type: ignore[attr-defined]
    except RuntimeError:
        return False
    return True


def _spawn_asyncio(
    loop: asyncio.AbstractEventLoop, fn: Callable[[], Coroutine[Any, Any, Any]]
) -> None:
    task = loop.create_task(fn())
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


def at_loop_end(fn: Callable[[], Awaitable[Any]]) -> object:
    """Arrange for ``await fn()`` as the running loop ends: on asyncio when the loop's
    async generators are shut down (``asyncio.run`` and ``anyio.run`` do it before
    closing the loop), on trio when its system tasks are cancelled.

    Returns:
        What to keep a reference to for as long as that should hold (asyncio keeps
        only a weak one).
    """
    loop = asyncio._get_running_loop()
    if loop is not None:
        ending = _at_end(fn)
        step: Any = ending.__anext__()  # the loop's first-iteration hook adopts it now
        with contextlib.suppress(StopIteration):
            step.send(None)
        return ending
    trio_module: Any = sys.modules["trio"]
    trio_module.lowlevel.spawn_system_task(_at_trio_end, fn)
    return fn


async def _at_end(fn: Callable[[], Awaitable[Any]]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await fn()


async def _at_trio_end(fn: Callable[[], Awaitable[Any]]) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await fn()


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


def _nothing() -> None:
    pass


def _loop_waker() -> Callable[[Callable[[], object]], object]:
    """The running loop's ``call_soon_threadsafe`` (trio: its token's ``run_sync_soon``)."""
    loop = asyncio._get_running_loop()
    if loop is not None:
        return loop.call_soon_threadsafe
    token: Any = running_owner()
    if token is None:
        raise RuntimeError("coalesce needs a running asyncio or trio event loop")
    return token.run_sync_soon  # type: ignore[no-any-return]


#: The context variables that follow a call to another loop (the latency budget's block,
#: registered by the surfaces). Only these: a loop's own variables (sniffio's, anyio's)
#: must not cross.
CARRIED: list[contextvars.ContextVar[Any]] = []


def carried_context() -> list[tuple[contextvars.ContextVar[Any], Any]]:
    """The values of :data:`CARRIED` set in the running context."""
    context = contextvars.copy_context()
    return [(variable, context[variable]) for variable in CARRIED if variable in context]


def set_context(values: list[tuple[contextvars.ContextVar[Any], Any]]) -> None:
    """Set ``values`` (from :func:`carried_context`) in the running context."""
    for variable, value in values:
        variable.set(value)


class _Forwarded:
    """A call forwarded to another loop: what both loops share (written by one at a time)."""

    __slots__ = ("context", "error", "scope", "stop", "value")

    def __init__(self) -> None:
        self.context = carried_context()
        self.value: Any = None
        self.error: BaseException | None = None
        self.scope: anyio.CancelScope | None = None
        self.stop = False  # its caller left

    def cancel(self) -> None:
        """In the target loop: its caller left, so the call is cancelled there."""
        self.stop = True
        if self.scope is not None:
            self.scope.cancel()


async def _serve(
    target: Runtime, call: _Forwarded, fn: Callable[..., Awaitable[Any]], args: Any, done: Any
) -> None:
    """The forwarded call, as a task of the target loop: the caller's :data:`CARRIED`
    context variables set, its outcome kept, its caller woken."""
    set_context(call.context)
    try:
        with anyio.CancelScope() as scope:
            call.scope = scope
            if call.stop:
                scope.cancel()
            call.value = await fn(*args)
    except Exception as exc:
        call.error = exc
    except BaseException as exc:  # the loop is cancelling its tasks: it is ending
        call.error = exc
        raise
    finally:
        with contextlib.suppress(RuntimeError):  # the caller's loop has ended
            done()


async def forward(target: Runtime, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``await fn(*args)`` as a task of ``target``'s loop, from the running loop (in
    another thread); its result or exception is the caller's. Cancelling the caller
    cancels that task (which withdraws a batcher's item not yet dispatched).

    Raises:
        LoopEnded: ``target``'s loop ended, or cancelled the task, before it finished.
    """
    wake = _loop_waker()
    finished = anyio.Event()
    call = _Forwarded()
    try:
        target.call_soon_threadsafe(
            target.spawn, _serve, target, call, fn, args, functools.partial(wake, finished.set)
        )
    except RuntimeError as exc:
        raise LoopEnded(str(exc)) from exc
    try:
        await finished.wait()
    except BaseException:
        call.stop = True
        with contextlib.suppress(RuntimeError):
            target.call_soon_threadsafe(call.cancel)
        raise
    if call.error is None:
        return call.value
    if isinstance(call.error, Exception):
        raise call.error
    raise LoopEnded("the event loop the call was forwarded to ended before answering it")
