"""A batcher's batch side: closed windows run as batches, and the timer that closes them.

A batch runs in a background task of the event loop, never in a caller's task, so a
caller that is cancelled never disturbs the others; its results are handed back by
position, each to its own caller. At most ``max_concurrency`` batches run at once;
the windows closed meanwhile wait, in order, in the ready queue (where a policy that
gives items deadlines has each caller freed at its own). Items a policy holds are
released (handed back to the batcher's ``release``) when their hold is due or when a
batch ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import anyio

from .._exceptions import BatchError, ResultCountError
from .expiry import ReadyDeadlines
from .options import BatcherOptions
from .policy import DispatchReason, Due
from .runtime import Runtime
from .stats import BatcherStatistics, WaitRecorder
from .timer import TimerLag, run_timer
from .window import SOLO, Window, Windows

__all__ = ["Dispatcher", "result_problem"]


class Dispatcher:
    """Runs one batcher's windows as batches, and counts what they did.

    Args:
        options: The batcher's options.
        windows: The batcher's windows (shared with its caller side).

    Attributes:
        rt: The runtime of the event loop served now (set by the batcher).
        in_flight: Batches running.
        timer_on: Whether the timer task runs.
        timer_scope: The timer's sleep, whose deadline is moved earlier when a window
            falls due sooner.
        lag: How late the timer wakes, so that it wakes that much early.
        completed: Callers handed a result.
        failed: Callers handed an exception.
        by_reason: Windows dispatched, by reason.
        started: Batches started.
        items_dispatched: Items handed to the batch function.
        max_batch: The largest batch so far.
        waits: How long each dispatched item waited.
        place: Puts an item where it goes now (the batcher's, set by it): a held item
            is placed again when released.
        releasing: Held items are being placed again (see :meth:`release`).
    """

    def __init__(self, options: BatcherOptions[Any], windows: Windows) -> None:
        self.options = options
        self.windows = windows
        # Read on every dispatch: kept at hand rather than behind ``options``.
        self.open = windows.open
        self.ready = windows.ready
        self.max_concurrency = options.max_concurrency
        self.rt: Runtime | None = None
        self.in_flight = 0
        self.timer_on = False
        self.timer_scope: anyio.CancelScope | None = None
        self.lag = TimerLag()
        self.deadlines = ReadyDeadlines(options.policy, windows)
        self.drained: anyio.Event | None = None
        self.completed = 0
        self.failed = 0
        self.by_reason = dict.fromkeys(DispatchReason, 0)
        self.started = 0
        self.items_dispatched = 0
        self.max_batch = 0
        self.waits = WaitRecorder()
        self.place: Callable[[Any, float, Any, float], Any] | None = None
        self.releasing = False

    # -- dispatching -----------------------------------------------------------

    def dispatch(self, window: Window, reason: DispatchReason) -> None:
        """Close the window and run it now, or queue it behind ``max_concurrency``."""
        if self.open.get(window.key) is window:
            del self.open[window.key]
        self.by_reason[reason] += 1
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            self.ready.append(window)
            assert self.rt is not None
            self.deadlines.watch(window, self.rt)
        else:
            self._start(window)
        on_dispatch = self.options.on_dispatch
        if on_dispatch is not None:
            on_dispatch(reason, window.items)

    def dispatch_solo(self, item: Any, waiter: Any, arrival: float, reason: DispatchReason) -> None:
        """Run ``item``, arrived at ``arrival``, alone at once, in a window of its own (a
        policy said ``SOLO``, ``PROBE`` or ``SCREENED``)."""
        window = Window(SOLO, arrival, arrival)
        window.add(item, waiter, arrival)
        self.dispatch(window, reason)

    def _start(self, window: Window) -> None:
        rt = self.rt
        assert rt is not None
        count = len(window.items)
        self.in_flight += 1
        self.started += 1
        self.items_dispatched += count
        self.max_batch = max(self.max_batch, count)
        self.waits.add(rt.clock(), window.arrivals)
        if self.windows.room is not None:
            self.windows.wake_room()
        rt.spawn(self._run, window)

    async def _run(self, window: Window) -> None:
        rt = self.rt
        assert rt is not None
        name = self.options.name
        try:
            try:
                results = await self._invoke(window)
            except rt.cancelled as exc:
                self._fail_all(window, BatchError(f"{name}: the batch was cancelled"), exc)
                raise
            except Exception as exc:
                self._fail_all(window, exc)
            except BaseException as exc:
                self._fail_all(window, BatchError(f"{name}: the batch was aborted"), exc)
                raise
            else:
                if results is None and self.options.resolve_early:
                    self._fail_unresolved(window)
                else:
                    self._deliver(window, results)
        finally:
            self.in_flight -= 1
            self._after_batch()
            self.wake_held()

    async def _invoke(self, window: Window) -> Any:
        """Call the batch function for one window."""
        fn = self.options.fn
        if not self.options.resolve_early:
            return await fn(window.items)
        return await fn(window.items, functools.partial(self._deliver_one, window))

    def _after_batch(self) -> None:
        while self.ready and (
            self.max_concurrency is None or self.in_flight < self.max_concurrency
        ):
            self._start(self.ready.popleft())
        if not self.ready:
            self.deadlines.stop()  # nothing left to watch
        if self.drained is not None and not self.in_flight and not self.ready:
            self.drained.set()

    async def drain(self) -> None:
        """Wait until no batch runs and none waits to."""
        if self.in_flight or self.ready:
            if self.drained is None:
                self.drained = anyio.Event()
            await self.drained.wait()

    # -- handing results back ------------------------------------------------

    def _deliver_one(self, window: Window, index: int, result: Any) -> None:
        """Resolve one caller of a running batch now, before the batch returns.

        A later result for the same caller (in the returned list) is ignored.
        """
        rt = self.rt
        assert rt is not None
        waiter = window.waiters[index]
        if isinstance(result, BaseException):
            delivered = rt.fail(waiter, result)
            self.failed += delivered
        else:
            delivered = rt.resolve(waiter, result)
            self.completed += delivered
        window.resolved += delivered

    def _deliver(self, window: Window, results: Any) -> None:
        rt = self.rt
        assert rt is not None
        if type(results) is not list:
            problem = result_problem(results)
            if problem is not None:
                self._fail_all(window, BatchError(f"{self.options.name} {problem}"))
                return
            results = list(results)
        if len(results) != len(window.waiters):
            self._fail_all(window, ResultCountError(len(window.waiters), len(results)))
            return
        completed, failed = rt.deliver(window.waiters, results)
        self.completed += completed
        self.failed += failed

    def _fail_unresolved(self, window: Window) -> None:
        """The batch function returned ``None``: no caller may be left waiting."""
        if window.resolved == len(window.waiters):
            return  # the usual case: every caller was answered early
        rt = self.rt
        assert rt is not None
        for index, waiter in enumerate(window.waiters):
            error = BatchError(f"{self.options.name} returned without a result for item {index}")
            self.failed += rt.fail(waiter, error)

    def _fail_all(
        self, window: Window, error: BaseException, cause: BaseException | None = None
    ) -> None:
        rt = self.rt
        assert rt is not None
        if cause is not None:
            error.__cause__ = cause
        self.failed += sum(rt.fail(waiter, error) for waiter in window.waiters)

    def statistics(self, *, pending: int, withdrawn: int, cancelled: int) -> BatcherStatistics:
        """The batcher's snapshot: these counts, and the caller side's.

        Args:
            pending: Items accepted and not yet dispatched.
            withdrawn: Items taken out by their cancelled callers before dispatch.
            cancelled: Callers cancelled, before or after dispatch.
        """
        started = self.started
        p50, p95, p99 = self.waits.quantiles(0.5, 0.95, 0.99)
        return BatcherStatistics(
            items_submitted=self.items_dispatched + withdrawn + pending,
            items_completed=self.completed,
            items_failed=self.failed + self.deadlines.freed,
            items_cancelled=cancelled,
            batches=sum(self.by_reason.values()),
            dispatch_reasons={str(k): v for k, v in self.by_reason.items()},
            mean_batch_size=self.items_dispatched / started if started else float("nan"),
            max_batch_size=self.max_batch,
            queue_depth=pending,
            batches_in_flight=self.in_flight,
            wait_p50=p50,
            wait_p95=p95,
            wait_p99=p99,
        )

    # -- the timer -------------------------------------------------------------

    def start_timer(self) -> None:
        """Start the timer task (a window just opened and none runs)."""
        rt = self.rt
        assert rt is not None
        self.timer_on = True
        rt.spawn(run_timer, self)

    def set_due(self, window: Window, due: Due, now: float) -> DispatchReason | None:
        """Take a policy's due time for ``window``: the reason to dispatch it now, or
        ``None`` after waking the timer by then."""
        window.due_at, window.due_reason = due.at, due.reason
        if due.at <= now:
            return due.reason
        scope, wake = self.timer_scope, self.lag.wake_at(window)
        if scope is not None and wake < scope.deadline:
            scope.deadline = wake
        return None

    def hold(self, key: Any, item: Any, waiter: Any, arrival: float, until: float) -> None:
        """Hold ``item`` until ``until`` or the end of a batch (a policy said :class:`Hold`)."""
        held = self.windows.hold(key, item, waiter, arrival, until)
        self._wake_by(held.due_at)

    def wake_held(self) -> None:
        """A batch ended: what the policy knows may have changed, so the held items are
        due now (the timer releases them)."""
        if self.windows.held and self.rt is not None:
            self._wake_by(self.windows.held_due(self.rt.clock()))

    def _wake_by(self, at: float) -> None:
        if not self.timer_on:
            self.start_timer()
        elif self.timer_scope is not None and at - self.lag.lead < self.timer_scope.deadline:
            self.timer_scope.deadline = at - self.lag.lead

    def release(self, held: Window) -> None:
        """Place the items of ``held`` again, in the order they arrived; released
        together, they group together: a window they made due goes once all are placed."""
        rt, place = self.rt, self.place
        assert rt is not None
        assert place is not None
        self.windows.unhold(held)
        now = rt.clock()
        self.releasing = True
        for item, waiter, arrival in zip(held.items, held.waiters, held.arrivals, strict=True):
            try:
                place(item, now, waiter, arrival)
            except Exception as exc:  # its caller gets what placing its item raised
                rt.fail(waiter, exc)
        self.releasing = False
        for window in [window for window in self.open.values() if window.due_at <= now]:
            self.dispatch(window, window.due_reason)

    def next_due(self) -> Window:
        """The open (or held) window due first."""
        return self.windows.next_due(by_due_time=self.options.policy is not None)


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
