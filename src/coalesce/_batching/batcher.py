"""The micro-batcher: one call per item in, one batch call per group out.

Callers arrive one item at a time. Each item joins the open *window* of its
partition; a window becomes a batch when it is full, too heavy, or its oldest item
has waited ``max_wait`` (decisions in :mod:`coalesce._batching.policy`). A batch runs in a
background task of the event loop, never in a caller's task, so a caller that is
cancelled never disturbs the others, and the batch function's results are handed
back by position, each to its own caller.

Two seams, no subclassing: a :class:`~coalesce._batching.policy.DispatchPolicy` decides, besides
the batcher's own limits, when a window goes (the latency-budget planner is one), and
a batch function built with ``resolve_early=True`` may hand each caller its result
before the whole batch returns (the streaming split does).
"""

from __future__ import annotations

import functools
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from threading import get_ident
from typing import Any, Generic, TypeVar

import anyio

from .._exceptions import (
    BatcherClosedError,
    BatchError,
    ConfigurationError,
    QueueFull,
    ResultCountError,
)
from .._validate import check_callable, check_int, check_seconds
from .policy import (
    DispatchPolicy,
    DispatchReason,
    Due,
    Limits,
    after_add,
    before_add,
    validate_size,
)
from .runtime import Runtime, current_runtime, running_owner
from .stats import BatcherStatistics, WaitRecorder

__all__ = ["Batcher", "is_async_callable", "result_problem"]

T = TypeVar("T")
R = TypeVar("R")

BatchFunction = Callable[[list[T]], Awaitable[Sequence[R]]]
#: Hands the caller at an index its result (or exception) before the batch returns.
Resolve = Callable[[int, Any], None]
EarlyBatchFunction = Callable[[list[T], Resolve], Awaitable[Sequence[R] | None]]
OnDispatch = Callable[[DispatchReason, Sequence[T]], None]

#: Defaults: a 10 ms window (a small, bounded wait) and at most 64 items per batch.
DEFAULT_MAX_WAIT = 0.01
DEFAULT_MAX_ITEMS = 64


class _Window:
    """The items of one partition waiting to become a batch."""

    __slots__ = (
        "arrivals",
        "due_at",
        "due_reason",
        "items",
        "key",
        "opened_at",
        "resolved",
        "size",
        "waiters",
    )

    def __init__(self, key: Hashable, opened_at: float, due_at: float) -> None:
        self.key = key
        self.opened_at = opened_at
        # When the timer dispatches it, and why (a planner may bring it forward).
        self.due_at = due_at
        self.due_reason = DispatchReason.WINDOW
        self.items: list[Any] = []
        self.waiters: list[Any] = []
        self.arrivals: list[float] = []
        self.size = 0.0
        self.resolved = 0  # callers answered early (``resolve_early``)

    def remove(self, waiter: Any) -> bool:
        for index, candidate in enumerate(self.waiters):
            if candidate is waiter:
                del self.items[index], self.waiters[index], self.arrivals[index]
                return True
        return False


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
        max_wait: float = DEFAULT_MAX_WAIT,
        max_items: int = DEFAULT_MAX_ITEMS,
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
        _check_function(fn, size, max_size)
        self._fn: Any = fn
        self._name = name or getattr(fn, "__qualname__", None) or repr(fn)
        self._limits = Limits(
            max_items=check_int("max_items", max_items) or 1,
            max_wait=check_seconds("max_wait", max_wait) or 0.0,
            max_size=check_seconds(
                "max_size", max_size, positive=True, optional=True, unit="size units"
            ),
        )
        self._max_items = self._limits.max_items
        self._max_concurrency = check_int("max_concurrency", max_concurrency, optional=True)
        self._max_pending = check_int("max_pending", max_pending, optional=True)
        self._partition = check_callable("partition", partition)
        self._size = check_callable("size", size)
        self._policy = policy
        self._on_dispatch = check_callable("on_dispatch", on_dispatch)
        self._resolve_early = bool(resolve_early)
        self._init_state(lean=size is None and max_pending is None and policy is None)
        functools.update_wrapper(self, fn, updated=())

    def _init_state(self, *, lean: bool) -> None:
        self._rt: Runtime | None = None
        self._loop: Any = None  # the bound asyncio loop, for the hot path's check
        self._clock: Callable[[], float] = _no_clock
        self._new_waiter: Callable[[], Any] = _no_clock
        self._lean = lean
        self._windows: dict[Hashable, _Window] = {}
        self._ready: deque[_Window] = deque()
        self._in_flight = 0
        self._timer_on = False
        self._timer_scope: anyio.CancelScope | None = None
        self._closed = False
        self._room: anyio.Event | None = None
        self._drained: anyio.Event | None = None

        # Accepted items = dispatched + withdrawn + still queued: nothing is counted
        # per item on the hot path, the totals are derived from the windows.
        self._withdrawn = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._by_reason = dict.fromkeys(DispatchReason, 0)
        self._started = 0
        self._items_dispatched = 0
        self._max_batch = 0
        self._waits = WaitRecorder()

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
                    # Joining an open window, no size or room limits: _enqueue() inlined.
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
                if self._max_pending is None or self._pending < self._max_pending:
                    return self._enqueue(item)  # type: ignore[no-any-return]
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
        if self._max_pending is not None and self._pending >= self._max_pending:
            await self._wait_for_room()
        waiter = self._enqueue(item)
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
        if self._max_pending is not None and self._pending >= self._max_pending:
            raise QueueFull(
                f"{self._name}: {self._pending} items are already waiting (max_pending="
                f"{self._max_pending}); await the call instead to wait for room, or raise"
                " max_pending"
            )
        waiter = self._enqueue(item)
        if rt.awaitable_waiters:
            return waiter  # type: ignore[no-any-return]
        return rt.wait(waiter)

    def _enqueue(self, item: T) -> Any:
        rt = self._rt
        assert rt is not None  # every caller binds the runtime first
        if self._closed:
            raise BatcherClosedError(f"{self._name} is closed; no new calls are accepted")
        key = self._partition(item) if self._partition is not None else None
        window = self._windows.get(key)
        now = rt.clock()
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
            reason = self._policy.before_add(members, item, now)
            if reason is DispatchReason.SOLO:
                return self._dispatch_solo(item, now)
            if reason is not None and window is not None:
                self._dispatch(window, reason)
                window = None
        if window is None:
            window = _Window(key, now, now + self._limits.max_wait)
            self._windows[key] = window
            if not self._timer_on:
                self._timer_on = True
                rt.spawn(self._timer)
        waiter = rt.new_waiter()
        window.items.append(item)
        window.waiters.append(waiter)
        window.arrivals.append(now)
        window.size += weight
        if self._size is not None:
            reason = after_add(len(window.items), window.size, self._limits)
        elif len(window.items) >= self._max_items:
            reason = DispatchReason.FULL
        else:
            reason = None
        if reason is None and self._policy is not None:
            due = self._policy.after_add(window.items, now)
            reason = None if due is None else self._apply(due, window, now)
        if reason is not None:
            self._dispatch(window, reason)
        return waiter

    def _apply(self, due: Due, window: _Window, now: float) -> DispatchReason | None:
        """Take the policy's due time: the reason to dispatch now, or wake the timer by then."""
        window.due_at, window.due_reason = due.at, due.reason
        if due.at <= now:
            return due.reason
        self._reschedule(due.at)
        return None

    def _dispatch_solo(self, item: T, now: float) -> Any:
        rt = self._rt
        assert rt is not None
        window = _Window(_SOLO, now, now)
        waiter = rt.new_waiter()
        window.items.append(item)
        window.waiters.append(waiter)
        window.arrivals.append(now)
        self._dispatch(window, DispatchReason.SOLO)
        return waiter

    def _reschedule(self, due: float) -> None:
        """Wake the timer by ``due`` if it sleeps past it."""
        scope = self._timer_scope
        if scope is not None and due < scope.deadline:
            scope.deadline = due

    def _on_cancel(self, waiter: Any) -> None:
        """A caller was cancelled: take its item out if it was not dispatched yet."""
        self._cancelled += 1
        for window in (*self._windows.values(), *self._ready):
            if window.remove(waiter):
                self._withdrawn += 1
                if not window.items and self._windows.get(window.key) is window:
                    del self._windows[window.key]
                elif not window.items:
                    self._ready.remove(window)
                self._wake_room()
                return

    async def _wait_for_room(self) -> None:
        assert self._max_pending is not None
        self._runtime()
        while self._pending >= self._max_pending:
            if self._closed:
                raise BatcherClosedError(f"{self._name} is closed; no new calls are accepted")
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()

    def _wake_room(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    @property
    def _pending(self) -> int:
        """Items accepted and not yet handed to the batch function."""
        waiting = sum(len(window.items) for window in self._windows.values())
        if self._ready:
            waiting += sum(len(window.items) for window in self._ready)
        return waiting

    def _runtime(self) -> Runtime:
        rt = self._rt
        if rt is not None and rt.owner is running_owner():
            return rt
        if self._windows or self._pending or self._in_flight or self._timer_on:
            raise RuntimeError(
                f"{self._name} is serving calls in another event loop; a batcher serves one"
                " event loop at a time (create one batcher per loop or thread)"
            )
        self._rt = rt = current_runtime(self._on_cancel)
        self._clock = rt.clock
        self._new_waiter = rt.new_waiter
        self._loop = getattr(rt, "loop", None)
        if not isinstance(getattr(self._loop, "_thread_id", None), int):
            self._loop = None  # not a stock asyncio loop: always take the full check
        self._room = self._drained = None
        return rt

    # -- the batch's side ----------------------------------------------------

    def _dispatch(self, window: _Window, reason: DispatchReason) -> None:
        """Close the window and run it now, or queue it behind ``max_concurrency``."""
        if self._windows.get(window.key) is window:
            del self._windows[window.key]
        self._by_reason[reason] += 1
        if self._max_concurrency is not None and self._in_flight >= self._max_concurrency:
            self._ready.append(window)
        else:
            self._start(window)
        if self._on_dispatch is not None:
            self._on_dispatch(reason, window.items)

    def _start(self, window: _Window) -> None:
        rt = self._rt
        assert rt is not None
        count = len(window.items)
        self._in_flight += 1
        self._started += 1
        self._items_dispatched += count
        self._max_batch = max(self._max_batch, count)
        self._waits.add(rt.clock(), window.arrivals)
        if self._room is not None:
            self._wake_room()
        rt.spawn(self._run, window)

    async def _run(self, window: _Window) -> None:
        rt = self._rt
        assert rt is not None
        try:
            try:
                results = await self._invoke(window)
            except rt.cancelled as exc:
                self._fail_all(window, BatchError(f"{self._name}: the batch was cancelled"), exc)
                raise
            except Exception as exc:
                self._fail_all(window, exc)
            except BaseException as exc:
                self._fail_all(window, BatchError(f"{self._name}: the batch was aborted"), exc)
                raise
            else:
                if results is None and self._resolve_early:
                    self._fail_unresolved(window)
                else:
                    self._deliver(window, results)
        finally:
            self._in_flight -= 1
            self._after_batch()

    async def _invoke(self, window: _Window) -> Any:
        """Call the batch function for one window."""
        if not self._resolve_early:
            return await self._fn(window.items)
        return await self._fn(window.items, functools.partial(self._deliver_one, window))

    def _deliver_one(self, window: _Window, index: int, result: Any) -> None:
        """Resolve one caller of a running batch now, before the batch returns.

        A later result for the same caller (in the returned list) is ignored.
        """
        rt = self._rt
        assert rt is not None
        waiter = window.waiters[index]
        if isinstance(result, BaseException):
            delivered = rt.fail(waiter, result)
            self._failed += delivered
        else:
            delivered = rt.resolve(waiter, result)
            self._completed += delivered
        window.resolved += delivered

    def _deliver(self, window: _Window, results: Any) -> None:
        rt = self._rt
        assert rt is not None
        if type(results) is not list:
            problem = result_problem(results)
            if problem is not None:
                self._fail_all(window, BatchError(f"{self._name} {problem}"))
                return
            results = list(results)
        if len(results) != len(window.waiters):
            self._fail_all(window, ResultCountError(len(window.waiters), len(results)))
            return
        completed, failed = rt.deliver(window.waiters, results)
        self._completed += completed
        self._failed += failed

    def _fail_unresolved(self, window: _Window) -> None:
        """The batch function returned ``None``: no caller may be left waiting."""
        if window.resolved == len(window.waiters):
            return  # the usual case: every caller was answered early
        rt = self._rt
        assert rt is not None
        for index, waiter in enumerate(window.waiters):
            error = BatchError(f"{self._name} returned without a result for item {index}")
            self._failed += rt.fail(waiter, error)

    def _fail_all(
        self, window: _Window, error: BaseException, cause: BaseException | None = None
    ) -> None:
        rt = self._rt
        assert rt is not None
        if cause is not None:
            error.__cause__ = cause
        self._failed += sum(rt.fail(waiter, error) for waiter in window.waiters)

    def _after_batch(self) -> None:
        while self._ready and (
            self._max_concurrency is None or self._in_flight < self._max_concurrency
        ):
            self._start(self._ready.popleft())
        if self._drained is not None and not self._in_flight and not self._ready:
            self._drained.set()

    async def _timer(self) -> None:
        """Dispatch each window when it is due (``max_wait``, or a planner's deadline).

        Without a planner, windows sit in the dict in the order they opened and share
        one ``max_wait``, so the first one is always due first.
        """
        rt = self._rt
        assert rt is not None
        try:
            while self._windows:
                window = self._next_due()
                if rt.clock() < window.due_at:
                    with anyio.CancelScope(deadline=window.due_at) as scope:
                        self._timer_scope = scope
                        await anyio.sleep_forever()
                    self._timer_scope = None
                    # Trust the sleep rather than re-reading the clock: a coarse clock
                    # may still read a hair before the deadline it woke for.
                    if not self._windows:
                        break
                    window = self._next_due()
                    if window.due_at > scope.deadline:
                        continue  # what was due went early (full, size or close)
                self._dispatch(window, window.due_reason)
        finally:
            self._timer_on = False
            self._timer_scope = None

    def _next_due(self) -> _Window:
        if self._policy is not None:
            return min(self._windows.values(), key=_due_at)
        return next(iter(self._windows.values()))

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
        for window in list(self._windows.values()):
            self._dispatch(window, DispatchReason.CLOSE)
        self._wake_room()
        if self._in_flight or self._ready:
            if self._drained is None:
                self._drained = anyio.Event()
            await self._drained.wait()

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
        started = self._started
        p50, p95, p99 = self._waits.quantiles(0.5, 0.95, 0.99)
        pending = self._pending
        return BatcherStatistics(
            items_submitted=self._items_dispatched + self._withdrawn + pending,
            items_completed=self._completed,
            items_failed=self._failed,
            items_cancelled=self._cancelled,
            batches=sum(self._by_reason.values()),
            batches_by_reason={str(k): v for k, v in self._by_reason.items()},
            mean_batch_size=self._items_dispatched / started if started else float("nan"),
            max_batch_size=self._max_batch,
            queue_depth=pending,
            batches_in_flight=self._in_flight,
            wait_p50=p50,
            wait_p95=p95,
            wait_p99=p99,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        next_flush = ""
        if self._windows and self._rt is not None:
            delay = self._next_due().due_at - self._rt.clock()
            next_flush = f", next flush in {max(delay, 0.0) * 1e3:.1f} ms"
        return (
            f"<Batcher {self._name} {state}: {self._pending} pending in"
            f" {len(self._windows)} windows, {self._in_flight} batches in flight{next_flush}>"
        )


_SOLO = object()  # the key of a one-item window that never joins the open windows


def _check_function(fn: Any, size: Any, max_size: Any) -> None:
    if not callable(fn):
        raise ConfigurationError(f"the batch function must be callable, got {fn!r}")
    if not is_async_callable(fn):
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise ConfigurationError(
            f"the batch function {name} is not async: define it with async def (a batch"
            " runs in the event loop, and a blocking function would stall every caller)"
        )
    if (size is None) != (max_size is None):
        raise ConfigurationError(
            "size and max_size go together: give both (an item's weight and the most"
            f" per batch) or neither; got size={size!r}, max_size={max_size!r}"
        )


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` may return an awaitable: not a plain ``def`` function.

    An ``async def`` function (partials and bound methods included), an object with an
    ``async def __call__``, and anything that is not a Python function (it cannot be
    inspected, and may well return an awaitable) pass; a plain ``def`` function, or an
    async generator function, does not. A sync wrapper of an ``async def`` function (one
    that sets ``__wrapped__``, as ``functools.wraps`` does) passes too.
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    call: Any = target if inspect.isroutine(target) else getattr(type(target), "__call__", None)  # noqa: B004
    if call is None or inspect.iscoroutinefunction(call):
        return True
    if inspect.iscoroutinefunction(inspect.unwrap(call)):
        return True
    return not (inspect.isfunction(call) or inspect.ismethod(call))


def result_problem(results: Any) -> str | None:
    """What is wrong with a batch function's result, or ``None`` if it is a sequence.

    A list, a tuple or any other sequence (a numpy array too) is ordered like the items;
    a string, bytes, a mapping, a set or an iterator is not a list of results, and taking
    it apart (``list(results)``) would hand callers characters or keys.
    """
    if isinstance(results, (str, bytes, bytearray, memoryview)):
        why = "a single value, not one result per item"
    elif isinstance(results, Mapping):
        why = "keyed, not ordered like the items: return e.g. [results[item] for item in items]"
    elif isinstance(results, AbstractSet):
        why = "unordered, so its results cannot be matched to the items"
    elif isinstance(results, Sequence) or (
        hasattr(results, "__len__") and hasattr(results, "__getitem__")
    ):
        return None
    else:
        why = "not a sequence"
    return (
        f"must return a list of results, one per item in the order of the items; it returned"
        f" {type(results).__name__} ({why})"
    )


def _due_at(window: _Window) -> float:
    return window.due_at


def _no_clock() -> Any:  # pragma: no cover - replaced when a loop is bound
    raise RuntimeError("not bound to an event loop")
