"""Deadlines in the ready queue: a caller whose window waits for a ``max_concurrency``
slot is freed at its own deadline, unsent, where the batcher's policy gives items
deadlines (``expires_at(item)`` and ``expired(item, now)``, see
:class:`~coalesce._batching.policy.DispatchPolicy`).

One background task per batcher sleeps until the earliest deadline in the queue while
windows wait there; it ends when the queue empties.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio

from .runtime import Runtime
from .window import Window, Windows

__all__ = ["ReadyDeadlines"]


class ReadyDeadlines:
    """Frees, at their deadlines, the callers of windows waiting in the ready queue.

    Args:
        policy: The batcher's policy; without ``expires_at`` nothing is watched.
        windows: The batcher's windows (their ready queue, and room for callers).

    Attributes:
        freed: Callers freed so far.
    """

    def __init__(self, policy: Any, windows: Windows) -> None:
        self._expires_at: Callable[[Any], float] | None = getattr(policy, "expires_at", None)
        self._expired: Callable[[Any, float], BaseException] | None = getattr(
            policy, "expired", None
        )
        self._windows = windows
        self.freed = 0
        self._scope: anyio.CancelScope | None = None

    def watch(self, window: Window, rt: Runtime) -> None:
        """``window`` joined the ready queue: wake at its earliest deadline too."""
        if self._expires_at is None or self._expired is None:
            return
        earliest = min(map(self._expires_at, window.items), default=math.inf)
        if self._scope is not None:
            self._scope.deadline = min(self._scope.deadline, earliest)
        elif math.isfinite(earliest):
            self._scope = anyio.CancelScope(deadline=earliest)
            rt.spawn(self._run, rt)

    def stop(self) -> None:
        """The ready queue is empty: the watcher wakes and ends."""
        if self._scope is not None:
            self._scope.cancel()

    async def _run(self, rt: Runtime) -> None:
        try:
            while self._scope is not None:
                with self._scope:
                    await anyio.sleep_forever()
                earliest = self.free(rt.clock(), rt)
                ready = self._windows.ready
                self._scope = anyio.CancelScope(deadline=earliest) if ready else None
        finally:
            self._scope = None

    def free(self, now: float, rt: Runtime) -> float:
        """Fail each queued item whose deadline is at or before ``now`` with the
        policy's ``expired`` error, dropping windows left empty; returns the earliest
        deadline left (``math.inf`` for none)."""
        expires_at, expired = self._expires_at, self._expired
        assert expires_at is not None
        assert expired is not None
        ready = self._windows.ready
        earliest, freed = math.inf, 0
        for window in list(ready):
            for item, waiter in list(zip(window.items, window.waiters, strict=True)):
                at = expires_at(item)
                if at <= now:
                    window.remove(waiter)
                    freed += rt.fail(waiter, expired(item, now))
                else:
                    earliest = min(earliest, at)
            if not window.items:
                ready.remove(window)
        if freed:
            self.freed += freed
            self._windows.wake_room()
        return earliest
