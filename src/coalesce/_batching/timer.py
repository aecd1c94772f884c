"""The timer that closes a batcher's windows when they are due, and how late it wakes.

A window is due at the last moment its members can wait (a planner's deadline, or
``max_wait``). A timer set for that moment wakes when the event loop next gets to it,
which on a busy loop is some milliseconds later; a group sent at its planner's deadline
that much late is late for every member. So the timer learns how late it wakes
(:class:`TimerLag`, a high quantile of its recent lateness) and wakes that much early.
On an idle loop, and on virtual time, the lateness is nil and nothing changes.

A window due at ``max_wait`` is woken for no earlier than half its wait: a lead as
long as the wait (a saturated loop, a collector's pause) would close every window as
it opens, with the calls of one loop turn in it, and a timer that never sleeps for its
own time never learns that the lead has shrunk.
"""

from __future__ import annotations

from typing import Protocol

import anyio

from .policy import DispatchReason
from .quantile import WindowQuantile
from .runtime import Runtime
from .window import Window, Windows

__all__ = ["Timed", "TimerLag", "run_timer"]


class TimerLag:
    """How late the timer wakes: the ``quantile`` of its last ``window`` wake-ups, once
    there are ``min_samples`` of them, at most ``ceiling`` seconds.

    Only wake-ups for the moment the timer itself chose are measured: a wake-up time
    moved earlier by a new window may already be past when it is set.
    """

    def __init__(
        self,
        window: int = 200,
        quantile: float = 0.99,
        min_samples: int = 20,
        ceiling: float = 0.1,
    ) -> None:
        self._late = WindowQuantile(window)
        self.quantile = quantile
        self.min_samples = min_samples
        self.ceiling = ceiling
        self.lead = 0.0

    def observe(self, late: float) -> None:
        """Record that a wake-up came ``late`` seconds after its time."""
        self._late.add(max(late, 0.0))
        if len(self._late) >= self.min_samples:
            self.lead = min(self._late.quantile(self.quantile), self.ceiling)

    def wake_at(self, window: Window) -> float:
        """When to wake for ``window``: :attr:`lead` before it is due, a window due at
        ``max_wait`` not before half its wait (see the module doc)."""
        lead = self.lead
        if window.due_reason is DispatchReason.WINDOW:
            lead = min(lead, max(window.due_at - window.opened_at, 0.0) / 2)
        return window.due_at - lead


class Timed(Protocol):
    """What the timer drives: a batcher's dispatcher."""

    rt: Runtime | None
    windows: Windows
    lag: TimerLag
    timer_on: bool
    timer_scope: anyio.CancelScope | None

    def next_due(self) -> Window: ...
    def release(self, held: Window) -> None: ...
    def dispatch(self, window: Window, reason: DispatchReason) -> None: ...


async def run_timer(dispatcher: Timed) -> None:
    """Dispatch each window when it is due (``max_wait``, or a planner's deadline), and
    release held items when their hold is; each wake-up ``dispatcher.lag.lead`` early."""
    rt, windows, lag = dispatcher.rt, dispatcher.windows, dispatcher.lag
    assert rt is not None
    try:
        while windows.waiting():
            window = dispatcher.next_due()
            wake = lag.wake_at(window)
            if rt.clock() < wake:
                with anyio.CancelScope(deadline=wake) as scope:
                    dispatcher.timer_scope = scope
                    await anyio.sleep_forever()
                if dispatcher.rt is not rt:
                    return  # the batcher left this loop meanwhile: its windows are not ours
                dispatcher.timer_scope = None
                if scope.deadline == wake:  # woken for the time it chose
                    lag.observe(rt.clock() - wake)
                # Trust the sleep rather than re-reading the clock: a coarse clock
                # may still read a hair before the deadline it woke for.
                if not windows.waiting():
                    break
                window = dispatcher.next_due()
                if lag.wake_at(window) > scope.deadline:
                    continue  # what was due went early (full, size or close)
            if windows.is_held(window):
                dispatcher.release(window)
            else:
                dispatcher.dispatch(window, window.due_reason)
    finally:
        if dispatcher.rt is rt:
            dispatcher.timer_on = False
            dispatcher.timer_scope = None
