"""The simulation clock: anyio's time, and the wall-clock stamps shown to clients."""

from __future__ import annotations

import time

import anyio

__all__ = ["Clock"]


class Clock:
    """Simulation time from anyio, and the wall-clock timestamps shown to clients."""

    def __init__(self) -> None:
        self._anchor: tuple[float, float] | None = None

    def now(self) -> float:
        """Return ``anyio.current_time()`` (virtual in tests)."""
        return anyio.current_time()

    def unix(self, moment: float) -> float:
        """Return the Unix time of a simulation ``moment`` (a value of :meth:`now`)."""
        if self._anchor is None:
            # Timestamps are shown to clients as Unix times: here reading the wall
            # clock once is the point. Every later stamp moves with anyio's clock.
            self._anchor = (time.time(), moment)
        wall, base = self._anchor
        return wall + (moment - base)
