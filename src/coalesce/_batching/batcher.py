"""The micro-batcher: one call per item in, one batch call per group out.

Callers arrive one item at a time. Each item joins the open *window* of its
partition; a window becomes a batch when it is full, too heavy, or its oldest item
has waited ``max_wait`` (decisions in :mod:`coalesce._batching.policy`). Three parts:

* :class:`Batcher` (here), the caller's side: an item joins its window, a cancelled
  caller's item leaves it, a caller waits for room under ``max_pending``;
* :mod:`~coalesce._batching.window`, the windows waiting to become batches;
* :mod:`~coalesce._batching.dispatcher`, the batch's side: windows run as batches in
  background tasks, results go back by position, a timer closes each window when due.

Its options are checked in :mod:`~coalesce._batching.options`. Two seams, no
subclassing: a :class:`~coalesce._batching.policy.DispatchPolicy` decides, besides the
batcher's own limits, when a window goes (the latency-budget planner is one), and a
batch function built with ``resolve_early=True`` may hand each caller its result
before the whole batch returns (the streaming split does).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from threading import get_ident
from typing import Any, Generic, TypeVar

from .._defaults import BATCH_MAX_ITEMS, BATCH_MAX_WAIT
from .._exceptions import BatcherClosedError, QueueFull
from .dispatcher import Dispatcher
from .options import (
    BatchFunction,
    EarlyBatchFunction,
    OnDispatch,
    Resolve,
    check_options,
)
from .policy import (
    DispatchPolicy,
    DispatchReason,
    Hold,
    after_add,
    before_add,
    validate_size,
)
from .runtime import Runtime, current_runtime, running_owner
from .stats import BatcherStatistics
from .window import Window, Windows

# ``Resolve`` is the type of the callback an early-resolving batch function receives.
__all__ = ["Batcher", "Resolve"]

T = TypeVar("T")
R = TypeVar("R")

#: Reasons a window goes at once even while released items are being placed.
_AT_ONCE = (None, DispatchReason.FULL, DispatchReason.SIZE, DispatchReason.TOKENS)


class Batcher(Generic[T, R]):
    """Group concurrent single-item calls into calls of a batch function.

    ``fn`` takes a list of items and returns a list of results of the same length,
    in the same order. ``await batcher(item)`` returns that item's result. A result
    that is not such a sequence (a string, a dict, a set, a generator) fails every
    caller of its batch with :class:`~coalesce.BatchError`, never handing them pieces.

    Args:
        fn: ``async def fn(items: list[T]) -> list[R]``.
        max_wait: Longest an item waits for company, in seconds (default 0.01).
            The oldest item of a window is dispatched no later than this.
        max_items: Most items per batch (default 64).
        max_concurrency: Most batches running at once (default: no limit).
            Batches beyond it wait, in order, for a running one to finish.
        max_pending: Most items accepted but not yet handed to ``fn`` (default: no
            limit). When reached, ``await batcher(item)`` waits for room and
            :meth:`submit_nowait` raises :class:`~coalesce.QueueFull`.
        partition: ``partition(item) -> key``; items with different keys never
            share a batch, and each key has its own window.
        size: ``size(item) -> weight`` (for example tokens), with ``max_size``.
        max_size: Most total weight per batch. An item heavier than this is
            dispatched alone, never dropped.
        name: Used in messages and ``repr`` (default: the function's name).
        policy: Consulted before and after each item joins a window, besides the
            limits above (see :class:`~coalesce._batching.policy.DispatchPolicy`).
        on_dispatch: Called with the reason and the items of each window dispatched.
        resolve_early: ``fn`` is called as ``fn(items, resolve)`` and may resolve a
            caller at once with ``resolve(index, result_or_exception)``; what it returns
            (a list as above, or ``None``) resolves the callers still waiting, and a
            caller left without a result gets a :class:`~coalesce.BatchError`.

    Raises:
        ConfigurationError: If an option is out of range, or ``fn`` is a plain (not
            ``async def``) function.
    """

    def __init__(
        self,
        fn: BatchFunction[T, R] | EarlyBatchFunction[T, R],
        *,
        max_wait: float = BATCH_MAX_WAIT,
        max_items: int = BATCH_MAX_ITEMS,
        max_concurrency: int | None = None,
        max_pending: int | None = None,
        partition: Callable[[T], Hashable] | None = None,
        size: Callable[[T], float] | None = None,
        max_size: float | None = None,
        name: str | None = None,
        policy: DispatchPolicy[T] | None = None,
        on_dispatch: OnDispatch[T] | None = None,
        resolve_early: bool = False,
    ) -> None:
        options = check_options(
            fn,
            max_wait=max_wait,
            max_items=max_items,
            max_concurrency=max_concurrency,
            max_pending=max_pending,
            partition=partition,
            size=size,
            max_size=max_size,
            name=name,
            policy=policy,
            on_dispatch=on_dispatch,
            resolve_early=resolve_early,
        )
        self._options = options
        self._name = options.name
        self._limits = options.limits
        # Read on every call: kept at hand rather than behind ``options``.
        self._max_items = options.limits.max_items
        self._max_pending = options.max_pending
        self._partition = options.partition
        self._size = options.size
        self._policy = options.policy
        self._lean = options.lean
        self._queue = Windows()
        self._windows = self._queue.open
        self._dispatcher = dispatcher = Dispatcher(options, self._queue)
        self._dispatch = dispatcher.dispatch
        dispatcher.place = self._place
        self._rt: Runtime | None = None
        self._loop: Any = None  # the bound asyncio loop, for the hot path's check
        self._clock: Callable[[], float] = _no_clock
        self._new_waiter: Callable[[], Any] = _no_clock
        self._closed = False
        # Accepted items = dispatched + withdrawn + still queued: nothing is counted
        # per item on the hot path, the totals are derived from the windows.
        self._withdrawn = 0
        self._cancelled = 0
        functools.update_wrapper(self, fn, updated=())

    # -- the caller's side ---------------------------------------------------

    def __call__(self, item: T) -> Coroutine[Any, Any, R]:
        """Submit one item; await the returned coroutine for its own result.

        On asyncio the call joins its window at once and returns a future that also
        behaves as a coroutine, so ``asyncio.gather`` spends no task per call while
        ``asyncio.create_task`` and anyio's ``start_soon`` still accept it.

        Raises:
            BatcherClosedError: If the batcher was closed.
            ResultCountError: If the batch function returned the wrong number of results.
            Exception: Whatever the batch function raised for this item's batch, or
                the exception instance it returned in this item's place.
        """
        loop = self._loop
        # The hot path's "still the same loop?" check: a loop runs in one thread at a
        # time, so the bound loop running in this thread is the running loop. (It
        # avoids asyncio.get_running_loop(), which makes a getpid() system call.)
        if loop is not None and loop._thread_id == get_ident():
            try:
                if self._lean and not self._closed:
                    # Joining an open window, no size or room limits: _join() inlined.
                    key = self._partition(item) if self._partition is not None else None
                    window = self._windows.get(key)
                    if window is not None:
                        waiter = self._new_waiter()
                        window.items.append(item)
                        window.waiters.append(waiter)
                        window.arrivals.append(self._clock())
                        if len(window.items) >= self._max_items:
                            self._dispatch(window, DispatchReason.FULL)
                        return waiter  # type: ignore[no-any-return]
                if self._max_pending is None or self._queue.pending < self._max_pending:
                    return self._place(item, self._clock())  # type: ignore[no-any-return]
            except Exception as exc:
                failed = self._new_waiter()
                failed.set_exception(exc)
                return failed  # type: ignore[no-any-return]
            return self._call_slowly(item)
        rt = self._runtime()
        if rt.awaitable_waiters:
            return self(item)  # now bound to this loop: take the path above
        return self._call_slowly(item)

    async def _call_slowly(self, item: T) -> R:
        self._runtime()
        if self._max_pending is not None and self._queue.pending >= self._max_pending:
            await self._wait_for_room()
        waiter = self._place(item, self._clock())
        return await self._rt.wait(waiter)  # type: ignore[union-attr,no-any-return]

    def submit_nowait(self, item: T) -> Awaitable[R]:
        """Submit one item now, without waiting for room; await the result later.

        The item joins its window immediately. Await the returned object to get its
        result.

        Raises:
            QueueFull: If ``max_pending`` items are already waiting.
            BatcherClosedError: If the batcher was closed.
        """
        rt = self._runtime()
        pending = self._queue.pending
        if self._max_pending is not None and pending >= self._max_pending:
            raise QueueFull(
                f"{self._name}: {pending} items are already waiting (max_pending="
                f"{self._max_pending}); await the call instead to wait for room, or raise"
                " max_pending"
            )
        waiter = self._place(item, self._clock())
        if rt.awaitable_waiters:
            return waiter  # type: ignore[no-any-return]
        return rt.wait(waiter)

    def _place(self, item: T, now: float, waiter: Any = None, arrival: float | None = None) -> Any:
        """Put ``item`` where it goes now: its window, a batch of its own, or the held
        items; ``waiter`` and ``arrival`` are given when it was held until now."""
        if waiter is None:  # a new call, not a released one
            if self._closed:
                raise BatcherClosedError(f"{self._name} is closed; no new calls are accepted")
            waiter = self._new_waiter()
        arrival = now if arrival is None else arrival
        key = self._partition(item) if self._partition is not None else None
        window = self._windows.get(key)
        weight = 0.0
        if self._size is not None:
            weight = validate_size(self._size(item))
            if window is not None:
                reason = before_add(len(window.items), window.size, weight, self._limits)
                if reason is not None:
                    self._dispatch(window, reason)
                    window = None
        if self._policy is not None:
            members = window.items if window is not None else []
            answer = self._policy.before_add(members, item, now)
            if isinstance(answer, Hold) and answer.until > now and not self._closed:
                self._dispatcher.hold(key, item, waiter, arrival, answer.until)
                return waiter
            if answer is DispatchReason.SOLO or answer is DispatchReason.PROBE:
                self._dispatcher.dispatch_solo(item, waiter, arrival, answer)
                return waiter
            if isinstance(answer, DispatchReason) and window is not None:
                self._dispatch(window, answer)
                window = None
        if window is None:
            window = self._windows[key] = Window(key, now, now + self._limits.max_wait)
            if not self._dispatcher.timer_on:
                self._dispatcher.start_timer()
        window.size += weight
        self._join(window, item, now, waiter, arrival)
        return waiter

    def _join(self, window: Window, item: T, now: float, waiter: Any, arrival: float) -> None:
        """Add ``item`` to ``window``; dispatch the window if it must go now."""
        window.add(item, waiter, arrival)
        reason = DispatchReason.FULL if len(window.items) >= self._max_items else None
        if self._size is not None:
            reason = after_add(len(window.items), window.size, self._limits)
        if reason is None and self._policy is not None:
            due = self._policy.after_add(window.items, now)
            reason = None if due is None else self._dispatcher.set_due(window, due, now)
            if self._dispatcher.releasing and reason not in _AT_ONCE:
                reason = None  # due now: it goes once every released item is placed
        if reason is not None:
            self._dispatch(window, reason)

    def _on_cancel(self, waiter: Any) -> None:
        """A caller was cancelled: take its item out if it was not dispatched yet."""
        self._cancelled += 1
        if self._queue.withdraw(waiter):
            self._withdrawn += 1

    async def _wait_for_room(self) -> None:
        assert self._max_pending is not None
        self._runtime()
        while self._queue.pending >= self._max_pending:
            if self._closed:
                raise BatcherClosedError(f"{self._name} is closed; no new calls are accepted")
            await self._queue.wait_for_room()

    def _runtime(self) -> Runtime:
        rt = self._rt
        if rt is not None and rt.owner is running_owner():
            return rt
        dispatcher = self._dispatcher
        if self._windows or self._queue.pending or dispatcher.in_flight or dispatcher.timer_on:
            raise RuntimeError(
                f"{self._name} is serving calls in another event loop; a batcher serves one"
                " event loop at a time (create one batcher per loop or thread)"
            )
        self._rt = dispatcher.rt = rt = current_runtime(self._on_cancel)
        self._clock = rt.clock
        self._new_waiter = rt.new_waiter
        self._loop = getattr(rt, "loop", None)
        if not isinstance(getattr(self._loop, "_thread_id", None), int):
            self._loop = None  # not a stock asyncio loop: always take the full check
        self._queue.room = dispatcher.drained = None
        return rt

    # -- lifecycle and introspection ------------------------------------------

    async def aclose(self) -> None:
        """Dispatch every pending item, wait for all running batches, refuse new calls.

        Nothing is dropped: every item accepted before ``aclose()`` gets its result.
        Calling it again is harmless.
        """
        self._closed = True
        if self._rt is None:
            return
        self._runtime()
        for held in list(self._queue.held.values()):
            self._dispatcher.release(held)  # closed: nothing is held again
        for window in list(self._windows.values()):
            self._dispatch(window, DispatchReason.CLOSE)
        self._queue.wake_room()
        await self._dispatcher.drain()

    async def __aenter__(self) -> Batcher[T, R]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def statistics(self) -> BatcherStatistics:
        """An immutable snapshot of the counters (see :class:`BatcherStatistics`)."""
        return self._dispatcher.statistics(
            pending=self._queue.pending, withdrawn=self._withdrawn, cancelled=self._cancelled
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        next_flush = ""
        if self._queue.waiting() and self._rt is not None:
            delay = self._dispatcher.next_due().due_at - self._rt.clock()
            next_flush = f", next flush in {max(delay, 0.0) * 1e3:.1f} ms"
        return (
            f"<Batcher {self._name} {state}: {self._queue.pending} pending in"
            f" {len(self._windows)} windows, {self._dispatcher.in_flight} batches in flight"
            f"{next_flush}>"
        )


def _no_clock() -> Any:  # pragma: no cover - replaced when a loop is bound
    raise RuntimeError("not bound to an event loop")
