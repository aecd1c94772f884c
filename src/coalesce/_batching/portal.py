"""The process's background event loop, for synchronous callers and short-lived loops.

Synchronous code (a Flask or Django view, a FastAPI ``def`` endpoint, a script's
threads) has no event loop to await on, and the loops that threads start for a
moment (``asyncio.run`` in a worker thread) end as soon as their own call is done.
Their calls are served instead by one asyncio loop per process, run by anyio's
:class:`~anyio.from_thread.BlockingPortal` in a daemon thread: started on first use,
stopped at interpreter exit (its remaining tasks cancelled), started afresh in a
forked child. A batcher bound to that loop never loses it, so the calls of every
thread coalesce there; a batcher called from more than one loop moves there.

:func:`call_blocking` is the synchronous entry point: it runs an async function there
and blocks until it returns (:func:`start_blocking`: without blocking, a future).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from .runtime import AsyncioRuntime, Runtime, carried_context, running_owner, set_context

__all__ = [
    "background_runtime",
    "call_blocking",
    "in_background_thread",
    "is_background",
    "start_blocking",
    "stop_background",
]

T = TypeVar("T")

#: Seconds the interpreter waits at exit for the loop's thread to finish cancelling.
_EXIT_WAIT = 5.0


class _Background:
    """The running background loop: its portal, loop, thread and runtime."""

    def __init__(self, portal: BlockingPortal, loop: asyncio.AbstractEventLoop) -> None:
        self.portal = portal
        self.loop = loop
        self.thread = threading.current_thread()
        self.runtime: Runtime = AsyncioRuntime(loop, _no_cancel)


_lock = threading.Lock()
_current: _Background | None = None


def _no_cancel(waiter: Any) -> None:  # pragma: no cover - the runtime spawns, never waits
    pass


async def _serve(ready: Future[_Background]) -> None:
    async with BlockingPortal() as portal:
        ready.set_result(_Background(portal, asyncio.get_running_loop()))
        await portal.sleep_until_stopped()


def _run(ready: Future[_Background]) -> None:
    try:
        anyio.run(_serve, ready)
    except BaseException as exc:  # pragma: no cover - the loop failed to start
        if not ready.done():
            ready.set_exception(exc)


def _background() -> _Background:
    """The background loop, started on first use (and again in a forked child)."""
    global _current
    current = _current
    if current is not None:
        return current
    with _lock:
        if _current is None:
            ready: Future[_Background] = Future()
            thread = threading.Thread(
                target=_run, args=(ready,), name="coalesce-background-loop", daemon=True
            )
            thread.start()
            _current = ready.result()
        return _current


def background_runtime() -> Runtime:
    """The runtime of the background loop (started if need be), to forward calls to."""
    return _background().runtime


def is_background(owner: object) -> bool:
    """Whether ``owner`` (a loop, as :func:`~coalesce._batching.runtime.running_owner`
    names it) is the background loop."""
    current = _current
    return current is not None and current.loop is owner


def in_background_thread() -> bool:
    """Whether this thread runs the background loop."""
    current = _current
    return current is not None and current.thread is threading.current_thread()


def stop_background() -> None:
    """Stop the background loop, cancelling what still runs there; the next
    synchronous call starts a new one. Called at interpreter exit."""
    global _current
    with _lock:
        current, _current = _current, None
    if current is None or current.thread is threading.current_thread():
        return
    with contextlib.suppress(RuntimeError):  # already stopped
        current.portal.call(current.portal.stop, True)
    current.thread.join(_EXIT_WAIT)


def _forget_in_child() -> None:
    """A forked child has the parent's memory but not the loop's thread."""
    global _current, _lock
    _current = None
    _lock = threading.Lock()


atexit.register(stop_background)
os.register_at_fork(after_in_child=_forget_in_child)


async def _in_context(
    context: list[tuple[contextvars.ContextVar[Any], Any]],
    fn: Callable[..., Awaitable[T]],
    args: Any,
    kwargs: Any,
) -> T:
    set_context(context)  # the caller's latency_budget() block
    return await fn(*args, **kwargs)


def start_blocking(fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> Future[T]:
    """Start ``await fn(*args, **kwargs)`` on the background loop, from synchronous code;
    the future holds its outcome (cancelling it cancels the call).

    The caller's :func:`~coalesce.latency_budget` block holds there (the context
    variables of :data:`~coalesce._batching.runtime.CARRIED`).

    Raises:
        RuntimeError: An event loop runs in this thread: blocking on the future would
            stop it (and every call waiting on it); ``await`` the async form instead.
    """
    if running_owner() is not None:
        name = getattr(fn, "__qualname__", "the call")
        raise RuntimeError(
            f"{name}: a blocking call inside a running event loop would stop that loop"
            " (and every call waiting on it); in async code (an async def, a notebook"
            " cell) await the async form instead: await f(...), await f.map(items)"
        )
    portal = _background().portal
    return portal.start_task_soon(_in_context, carried_context(), fn, args, kwargs)


def call_blocking(fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` on the background loop; block until it returns
    (see :func:`start_blocking`). Interrupted (Ctrl-C), the call is cancelled there.

    Raises:
        RuntimeError: An event loop runs in this thread (see :func:`start_blocking`).
        Exception: Whatever ``fn`` raised.
    """
    future = start_blocking(fn, *args, **kwargs)
    try:
        result: T = future.result()
    except BaseException:
        future.cancel()
        raise
    return result
