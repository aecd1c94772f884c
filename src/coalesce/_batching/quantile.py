"""Quantiles over a sliding window: the one place coalesce computes them.

Two readings of the same sorted window, each for its purpose: :meth:`WindowQuantile.quantile`
is the nearest rank (an observed value, erring high: what a latency or size margin
wants), :meth:`WindowQuantile.quantiles` interpolates linearly between ranks (what the
statistics report, as numpy's default does). :func:`interpolated` is the latter over
any sorted list.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable

from .._exceptions import ConfigurationError

__all__ = ["WindowQuantile", "interpolated"]


class WindowQuantile:
    """Quantiles over the most recent ``window`` observations.

    Insertion and eviction cost ``O(window)`` (a sorted list); a query is ``O(1)``. With
    the small windows used here (hundreds) that beats sketching in both speed and
    accuracy, and it tracks drift by forgetting old values outright.

    Args:
        window: How many recent values to keep; at least 1.

    Raises:
        ConfigurationError: If ``window`` is smaller than 1.
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ConfigurationError(f"window must be >= 1, got {window!r}")
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self.window = window

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, value: float) -> None:
        """Record ``value``, forgetting the oldest one when the window is full."""
        if len(self._recent) == self.window:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(value)
        bisect.insort(self._sorted, value)

    def extend(self, values: Iterable[float]) -> None:
        """Record each of ``values``."""
        for value in values:
            self.add(value)

    def quantiles(self, *qs: float) -> tuple[float, ...]:
        """The ``qs`` quantiles by linear interpolation (``nan`` if empty)."""
        return tuple(interpolated(self._sorted, q) for q in qs)

    def quantile(self, q: float) -> float:
        """Return the nearest-rank ``q`` quantile (an observed value; ``nan`` if empty).

        Nearest rank (the smallest value with at least ``q`` of the window at or below
        it) errs on the high side, which is what a latency or size margin wants.

        Args:
            q: The quantile, in ``[0, 1]``.
        """
        n = len(self._sorted)
        if n == 0:
            return math.nan
        rank = min(n, max(1, math.ceil(q * n)))
        return self._sorted[rank - 1]


def interpolated(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of already sorted values (linear interpolation); NaN if empty."""
    if not sorted_values:
        return math.nan
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction
