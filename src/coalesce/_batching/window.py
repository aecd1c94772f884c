"""A batcher's bookkeeping: the windows waiting to become batches.

Each partition key has at most one open :class:`Window`; a window closed while
``max_concurrency`` batches run waits, in order, in the ready queue. Items a policy
holds (:class:`~coalesce._batching.policy.Hold`) wait in a window of their own per
partition, which is never dispatched: when it is due, its items are offered to the
policy again. :class:`Windows` holds all three, and the event that wakes callers
waiting for room (``max_pending``). The batcher's caller side fills the windows, its
dispatcher empties them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

import anyio

from .policy import DispatchReason

__all__ = ["SOLO", "Window", "Windows", "due_at"]

#: The key of a one-item window that never joins the open windows.
SOLO: Hashable = object()


class Window:
    """The items of one partition waiting to become a batch.

    Attributes:
        key: The partition key.
        opened_at: When its first item arrived.
        due_at: When the timer dispatches it (a policy may bring it forward).
        due_reason: Why it is dispatched then.
        items: The items, in arrival order.
        waiters: Each item's caller, by position.
        arrivals: When each item arrived, by position.
        size: The items' total weight (``size=``).
        resolved: Callers already answered by an early-resolving batch function.
    """

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
        self.due_at = due_at
        self.due_reason = DispatchReason.WINDOW
        self.items: list[Any] = []
        self.waiters: list[Any] = []
        self.arrivals: list[float] = []
        self.size = 0.0
        self.resolved = 0

    def add(self, item: Any, waiter: Any, now: float) -> None:
        """Take ``item``, whose caller waits on ``waiter``."""
        self.items.append(item)
        self.waiters.append(waiter)
        self.arrivals.append(now)

    def remove(self, waiter: Any) -> bool:
        """Take out the item of ``waiter``'s caller; False if it is not here."""
        for index, candidate in enumerate(self.waiters):
            if candidate is waiter:
                del self.items[index], self.waiters[index], self.arrivals[index]
                return True
        return False


def due_at(window: Window) -> float:
    """When ``window`` is due (a sort key)."""
    return window.due_at


class Windows:
    """The open windows by partition key, the closed ones waiting for a batch slot,
    and the callers waiting for room.

    Attributes:
        open: The open window of each partition key, in the order they opened.
        ready: Closed windows waiting, in order, for a running batch to finish.
        held: The items a policy holds, by partition key (see the module doc).
        room: Set when items leave the queue, if a caller waits for room.
    """

    __slots__ = ("held", "open", "ready", "room")

    def __init__(self) -> None:
        self.open: dict[Hashable, Window] = {}
        self.ready: deque[Window] = deque()
        self.held: dict[Hashable, Window] = {}
        self.room: anyio.Event | None = None

    @property
    def pending(self) -> int:
        """Items accepted and not yet handed to the batch function."""
        waiting = sum(len(window.items) for window in self.open.values())
        if self.ready:
            waiting += sum(len(window.items) for window in self.ready)
        if self.held:
            waiting += sum(len(window.items) for window in self.held.values())
        return waiting

    def is_held(self, window: Window) -> bool:
        """Whether ``window`` holds items for a policy (it is released, not dispatched)."""
        return self.held.get(window.key) is window

    def hold(self, key: Hashable, item: Any, waiter: Any, arrival: float, until: float) -> Window:
        """Hold ``item`` of partition ``key`` until ``until``; its held window, due at the
        earliest of its items' holds."""
        held = self.held.get(key)
        if held is None:
            held = self.held[key] = Window(key, arrival, until)
        held.add(item, waiter, arrival)
        held.due_at = min(held.due_at, until)
        return held

    def unhold(self, held: Window) -> None:
        """Take ``held`` out of the held windows (its items are being released)."""
        if self.is_held(held):
            del self.held[held.key]

    def held_due(self, now: float) -> float:
        """Make every held window due by ``now``; returns ``now``."""
        for window in self.held.values():
            window.due_at = min(window.due_at, now)
        return now

    def close(self, window: Window) -> None:
        """Take ``window`` out of the open ones (a solo window never was in)."""
        if self.open.get(window.key) is window:
            del self.open[window.key]

    def withdraw(self, waiter: Any) -> bool:
        """Take out the item of a cancelled caller, if it was not dispatched yet.

        A window left empty goes too. Returns whether the item was found.
        """
        for window in (*self.open.values(), *self.held.values(), *self.ready):
            if window.remove(waiter):
                if not window.items and self.open.get(window.key) is window:
                    del self.open[window.key]
                elif not window.items and self.is_held(window):
                    del self.held[window.key]
                elif not window.items:
                    self.ready.remove(window)
                self.wake_room()
                return True
        return False

    def next_due(self, *, by_due_time: bool) -> Window:
        """The open (or held) window due first.

        Without a policy (``by_due_time=False``) windows share one ``max_wait`` and sit
        in the order they opened, so the first one is due first (nothing is held).
        """
        if by_due_time:
            return min((*self.open.values(), *self.held.values()), key=due_at)
        return next(iter(self.open.values()))

    def waiting(self) -> bool:
        """Whether a window is open or items are held: the timer has work."""
        return bool(self.open or self.held)

    def wake_room(self) -> None:
        """Wake the callers waiting for room (they check again)."""
        if self.room is not None:
            self.room.set()
            self.room = None

    async def wait_for_room(self) -> None:
        """Wait until items leave the queue (or a caller gives up its place)."""
        if self.room is None:
            self.room = anyio.Event()
        await self.room.wait()
