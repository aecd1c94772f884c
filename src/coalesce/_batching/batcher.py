"""The micro-batcher: one call per item in, one batch call per group out.

Callers arrive one item at a time. Each item joins the open *window* of its
partition; a window becomes a batch when it is full, too heavy, or its oldest item
has waited ``max_wait`` (decisions in :mod:`coalesce._batching.policy`). Three parts:

* :class:`Batcher` (here), the caller's side: an item joins its window, a cancelled
  caller's item leaves it, a caller waits for room under ``max_pending``;
* :mod:`~coalesce._batching.window`, the windows waiting to become batches;
* :mod:`~coalesce._batching.dispatcher`, the batch's side: windows run as batches in
  background tasks, results go back by position, a timer closes each window when due.

A batcher serves the first event loop that calls it while no other loop does (the
fast path). Once another loop calls it, or its loop ends, its work moves to the
process's background loop (:mod:`~coalesce._batching.portal`), which lasts as long as
the process, and stays there: :func:`route` decides, :func:`_hand_over` moves what
waited on the loop it leaves (in that loop's thread), and the runtime's
:func:`~coalesce._batching.runtime.forward` carries each call made elsewhere, so the
calls of every loop share its windows and no loop's end cancels another's.

Its options are checked in :mod:`~coalesce._batching.options`. Two seams, no
subclassing: a :class:`~coalesce._batching.policy.DispatchPolicy` decides, besides the
batcher's own limits, when a window goes (the latency-budget planner is one), and a
batch function built with ``resolve_early=True`` may hand each caller its result
before the whole batch returns (the streaming split does).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import math
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from threading import get_ident
from typing import Any, Generic, TypeVar

import anyio

from .._exceptions import BatcherClosedError, QueueFull
from .._options import BATCH_MAX_ITEMS, BATCH_MAX_WAIT, refuses_unknown
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
from .portal import background_runtime, is_background
from .runtime import LoopEnded, Runtime, current_runtime, forward, running_owner
from .stats import BatcherStatistics
from .window import Window, Windows

# ``Resolve`` is the type of the callback an early-resolving batch function receives.
__all__ = ["Batcher", "Resolve", "Route", "route"]

T = TypeVar("T")
R = TypeVar("R")

#: Reasons a window goes at once even while released items are being placed.
_AT_ONCE = (None, DispatchReason.FULL, DispatchReason.SIZE, DispatchReason.TOKENS)
#: Seconds between looks at a loop that is handing a batcher's work over (it says when
#: it has; the look finds one that ended instead).
_HAND_OVER_POLL = 0.05
#: Binding a batcher to a loop happens once at a time, whichever thread asks.
_binding = threading.RLock()


#: What a policy answers to send an item alone, at once.
_ALONE = frozenset({DispatchReason.SOLO, DispatchReason.PROBE, DispatchReason.SCREENED})


class Route(enum.Enum):
    """Where a call made on the running loop is served (see :func:`route`)."""

    HERE = "here"  # on the running loop (the batcher's, or it binds to it now)
    BACKGROUND = "background"  # forwarded to the process's background loop
    WAIT = "wait"  # on the background loop, until the batcher's loop hands its work over


def route(
    *,
    serving_here: bool,
    bound: bool,
    home_running: bool,
    home_background: bool,
    shared: bool,
    on_background: bool,
) -> Route:
    """Where a call made on the running loop is served (pure).

    A batcher serves the first loop that calls it, alone, while no other loop does. Once
    another loop calls it, or its loop ends, it is *shared*: its work moves to the
    process's background loop, which lasts as long as the process, and stays there.

    Args:
        serving_here: The batcher serves the running loop, and is not leaving it.
        bound: The batcher serves a loop.
        home_running: That loop still runs.
        home_background: That loop is the background loop.
        shared: Calls came from more than one loop (or its first loop ended).
        on_background: The running loop is the background loop.
    """
    if serving_here or not (bound or shared):
        return Route.HERE
    if not on_background:
        return Route.BACKGROUND
    if bound and home_running and not home_background:
        return Route.WAIT  # what its loop runs finishes there first, then it moves
    return Route.HERE


class _Move:
    """A batcher's move to the background loop (see :func:`route`)."""

    __slots__ = ("handed", "handing", "moved", "shared")

    def __init__(self) -> None:
        self.shared = False  # called from more than one loop: its work moves away
        self.handing: Runtime | None = None  # the loop asked to hand its work over
        self.handed: anyio.Event | None = None  # set (on the background loop) once it has
        # Items moved from the loop it left, by their callers' waiters (see _hand_over).
        self.moved: weakref.WeakKeyDictionary[Any, anyio.CancelScope] = weakref.WeakKeyDictionary()

    def withdraw(self, waiter: Any) -> bool:
        """Withdraw the moved item of ``waiter``'s caller; False if it did not move."""
        scope = self.moved.pop(waiter, None)
        if scope is None:
            return False
        # Outside its loop (asyncio.run cancelling what is left), the task that carries
        # it is cancelled as well.
        with contextlib.suppress(RuntimeError):
            scope.cancel()
        return True


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

    @refuses_unknown("coalesce.Batcher")
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
        options = check_options(fn, locals())
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
        # Accepted = dispatched + withdrawn + queued: nothing is counted per item.
        self._withdrawn = 0
        self._cancelled = 0
        # The loop whose calls are served right there (None while unbound or leaving).
        self._serving: object | None = None
        self._move = _Move()
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
        rt = _bound_here(self)
        if rt is None:  # served on another loop
            return _on_its_loop(self, self, item)
        if rt.awaitable_waiters and self._loop is not None:
            return self(item)  # now bound to this loop: take the path above
        return self._call_slowly(item)  # trio, or a loop of its own kind (uvloop)

    async def _call_slowly(self, item: T) -> R:
        self._runtime()
        if self._max_pending is not None and self._queue.pending >= self._max_pending:
            await _wait_for_room(self)
        waiter = self._place(item, self._clock())
        return await self._rt.wait(waiter)  # type: ignore[union-attr,no-any-return]

    def submit_nowait(self, item: T) -> Awaitable[R]:
        """Submit one item now, without waiting for room; await the result later.

        The item joins its window immediately (from another loop than the batcher's:
        when the result is awaited). Await the returned object to get its result.

        Raises:
            QueueFull: If ``max_pending`` items are already waiting.
            BatcherClosedError: If the batcher was closed.
        """
        rt = _bound_here(self)
        if rt is None:
            return _on_its_loop(self, self, item)
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
            # Nothing is held once closed, or while leaving its loop (not serving).
            held = not self._closed and self._serving is not None
            if held and isinstance(answer, Hold) and answer.until > now:
                self._dispatcher.hold(key, item, waiter, arrival, answer.until)
                return waiter
            if answer in _ALONE:
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
        if self._move.moved and self._move.withdraw(waiter):
            return  # it moved: it leaves the background loop, and is counted there
        self._cancelled += 1
        if self._queue.withdraw(waiter):
            self._withdrawn += 1

    def run_on_its_loop(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Awaitable[Any]:
        """What to await for ``fn(*args)`` where :func:`route` says: here, or on the
        background loop and awaited here (cancelling the caller cancels it there). The
        surfaces run a whole call so, making its job on the loop that answers it."""
        if self._serving is running_owner():
            return fn(*args)  # the usual case: its own awaitable, no coroutine more
        return _on_its_loop(self, fn, *args)

    def _runtime(self) -> Runtime:
        rt = self._rt
        if rt is not None and rt.owner is running_owner():
            return rt
        with _binding:
            return _bind(self)

    # -- lifecycle and introspection ------------------------------------------

    async def aclose(self) -> None:
        """Dispatch every pending item, wait for all running batches, refuse new calls.

        Nothing is dropped: every item accepted before ``aclose()`` gets its result.
        Calling it again is harmless.
        """
        self._closed = True
        if self._rt is None:
            return
        if _bound_here(self) is None:
            await _on_its_loop(self, self.aclose)
            return
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


def _bind(batcher: Batcher[Any, Any]) -> Runtime:
    """Bind ``batcher`` to the running loop (what was left on a loop that ended is
    abandoned)."""
    dispatcher = batcher._dispatcher
    if _route_of(batcher) is not Route.HERE:  # another thread's loop bound it just now
        raise _Rerouted(f"{batcher._name} was just bound to another event loop; call again")
    if not _idle(batcher):
        _abandon(batcher)
    batcher._rt = dispatcher.rt = rt = current_runtime(batcher._on_cancel)
    batcher._clock = rt.clock
    batcher._new_waiter = rt.new_waiter
    loop = getattr(rt, "loop", None)
    # Not a stock asyncio loop: the hot path always takes the full check.
    batcher._loop = loop if isinstance(getattr(loop, "_thread_id", None), int) else None
    batcher._queue.room = dispatcher.drained = None
    batcher._serving = rt.owner
    return rt


async def _wait_for_room(batcher: Batcher[Any, Any]) -> None:
    assert batcher._max_pending is not None
    batcher._runtime()
    while batcher._queue.pending >= batcher._max_pending:
        if batcher._closed:
            raise BatcherClosedError(f"{batcher._name} is closed; no new calls are accepted")
        await batcher._queue.wait_for_room()


class _Rerouted(RuntimeError):
    """Binding lost a race: another thread's loop bound the batcher first."""


def _bound_here(batcher: Batcher[Any, Any]) -> Runtime | None:
    """The runtime of the running loop, ``batcher`` bound to it if need be; ``None`` if
    a call made now is served on another loop (:func:`route`)."""
    if _route_of(batcher) is not Route.HERE:
        return None
    try:
        return batcher._runtime()
    except _Rerouted:
        return None


def _idle(batcher: Batcher[Any, Any]) -> bool:
    """Whether ``batcher`` holds no item and runs no batch or timer."""
    dispatcher = batcher._dispatcher
    queue = batcher._queue
    return not (queue.open or queue.pending or dispatcher.in_flight or dispatcher.timer_on)


def _busy(batcher: Batcher[Any, Any]) -> bool:
    """Whether ``batcher`` holds an item or runs a batch (its timer aside)."""
    return bool(batcher._queue.pending or batcher._dispatcher.in_flight)


def _abandon(batcher: Batcher[Any, Any]) -> None:
    """The loop ``batcher`` served ended with items and batches left: their callers
    ended with it, and that loop will never run them. Counted as withdrawn."""
    queue, dispatcher = batcher._queue, batcher._dispatcher
    batcher._withdrawn += queue.pending
    queue.open.clear()
    queue.ready.clear()
    queue.held.clear()
    dispatcher.in_flight = 0
    dispatcher.timer_on = False
    dispatcher.timer_scope = None


def _route_of(batcher: Batcher[Any, Any]) -> Route:
    """Where a call made now on the running loop is served (see :func:`route`); a
    batcher bound to a loop that is not the running one is shared from now on."""
    owner = running_owner()
    if batcher._serving is owner or owner is None:
        return Route.HERE  # served here, or no loop runs (binding says so)
    rt = batcher._rt
    if rt is not None and not batcher._move.shared:
        _share(batcher)
    home_background = rt is not None and is_background(rt.owner)
    return route(
        serving_here=False,
        bound=rt is not None,
        home_running=rt is not None and rt.running(),
        home_background=home_background,
        shared=batcher._move.shared,
        on_background=is_background(owner),
    )


def _share(batcher: Batcher[Any, Any]) -> None:
    """Another loop calls ``batcher`` (or its loop ended): its work moves to the
    background loop. Its loop's own calls stop taking the hot path now."""
    with _binding:
        batcher._move.shared = True
        rt = batcher._rt
        if rt is not None and not is_background(rt.owner):
            batcher._loop = batcher._serving = None


def _ask_hand_over(batcher: Batcher[Any, Any]) -> None:
    """Have the loop ``batcher`` serves hand its work over, in that loop's thread (the
    only one that changes its windows): at once if it runs here; from another thread,
    once to send what waits there, then again whenever it looks idle."""
    rt = batcher._rt
    if rt is None:
        return
    if rt.owner is running_owner():
        _hand_over(batcher, rt)
    elif batcher._move.handing is not rt or not _busy(batcher):
        batcher._move.handing = rt
        with contextlib.suppress(RuntimeError):  # it ended: the next route says so
            rt.call_soon_threadsafe(rt.spawn, _hand_over_task, batcher, rt)


async def _hand_over_task(batcher: Batcher[Any, Any], rt: Runtime) -> None:
    _hand_over(batcher, rt)  # in a task: what it dispatches may read the loop's clock


def _hand_over(batcher: Batcher[Any, Any], rt: Runtime) -> None:
    """In the thread of ``rt``'s loop: what waits there moves to the background loop
    (or, on a loop with another clock, is sent now, reason ``move``), and once no batch
    runs there, ``batcher`` is unbound, so that the background loop binds it."""
    with _binding:
        if batcher._rt is not rt:
            return
        batcher._loop = batcher._serving = None
    dispatcher, queue = batcher._dispatcher, batcher._queue
    if rt.clock is background_runtime().clock:  # a job's deadline means the same there
        _move_waiting(batcher, rt)
    else:
        for held in list(queue.held.values()):
            dispatcher.release(held)  # not held again: the batcher is not serving
        for window in list(queue.open.values()):
            dispatcher.dispatch(window, DispatchReason.MOVE)
    if dispatcher.timer_scope is not None:
        dispatcher.timer_scope.deadline = -math.inf  # nothing left to time: it ends
    queue.wake_room()
    with _binding:
        if batcher._rt is rt and not _busy(batcher):
            batcher._rt = dispatcher.rt = None  # its timer, if it still runs, stops
            dispatcher.timer_on, dispatcher.timer_scope = False, None
            background_runtime().call_soon_threadsafe(_wake_handed, batcher)


def _move_waiting(batcher: Batcher[Any, Any], rt: Runtime) -> None:
    """Submit every item not yet dispatched (open windows, held items) again, on the
    background loop; each caller keeps waiting here for what it is answered there."""
    queue = batcher._queue
    windows = [*queue.open.values(), *queue.held.values()]
    queue.open.clear()
    queue.held.clear()
    for window in windows:
        for item, waiter in zip(window.items, window.waiters, strict=True):
            scope = batcher._move.moved[waiter] = anyio.CancelScope()
            rt.spawn(_moved, batcher, rt, item, waiter, scope)


async def _moved(
    batcher: Batcher[Any, Any], rt: Runtime, item: Any, waiter: Any, scope: anyio.CancelScope
) -> None:
    """One item moved to the background loop: its result handed to its caller here.
    Its caller cancelled (:meth:`Batcher._on_cancel` cancels ``scope``) withdraws it."""
    try:
        with scope:
            value = await forward(background_runtime(), batcher, item)
            rt.resolve(waiter, value)
    except Exception as exc:
        rt.fail(waiter, exc)
    # Cancelled as its loop ends, it stays listed: its caller, cancelled too, is not
    # counted twice (the weak table forgets a caller that never was).
    batcher._move.moved.pop(waiter, None)


async def _handed_over(batcher: Batcher[Any, Any]) -> None:
    """On the background loop: wait until ``batcher``'s loop has handed its work over
    (:func:`_hand_over` wakes every call waiting so), at most a poll's time."""
    move = batcher._move
    if move.handed is None:
        move.handed = anyio.Event()
    with anyio.move_on_after(_HAND_OVER_POLL):
        await move.handed.wait()


def _wake_handed(batcher: Batcher[Any, Any]) -> None:
    """In the background loop's thread: wake the calls waiting for the hand-over."""
    handed, batcher._move.handed = batcher._move.handed, None
    if handed is not None:
        handed.set()


async def _on_its_loop(
    batcher: Batcher[Any, Any], fn: Callable[..., Awaitable[Any]], *args: Any
) -> Any:
    """``await fn(*args)`` where :func:`route` says, again if that loop ends first."""
    while True:
        where = _route_of(batcher)
        if where is Route.HERE:
            return await fn(*args)
        if where is Route.WAIT:
            _ask_hand_over(batcher)
            await _handed_over(batcher)
            continue
        try:
            return await forward(background_runtime(), fn, *args)
        except LoopEnded:
            continue  # it stopped under the call: served again where the next route says
