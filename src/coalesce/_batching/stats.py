"""Statistics snapshots and the small recorders behind them."""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

from .quantile import interpolated

__all__ = ["BatcherStatistics", "WaitRecorder"]


class WaitRecorder:
    """Waits from arrival to dispatch, over roughly the most recent ``size`` items.

    Recording costs O(1) per batch (the batch's arrival times are kept as they are);
    the per-item waits are computed only when statistics are asked for.
    """

    __slots__ = ("_batches", "_items", "_size")

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._batches: deque[tuple[float, list[float]]] = deque()
        self._items = 0

    def add(self, dispatched_at: float, arrivals: list[float]) -> None:
        self._batches.append((dispatched_at, arrivals))
        self._items += len(arrivals)
        while self._items - len(self._batches[0][1]) >= self._size:
            self._items -= len(self._batches.popleft()[1])

    def quantiles(self, *qs: float) -> tuple[float, ...]:
        waits = sorted(at - arrival for at, arrivals in self._batches for arrival in arrivals)
        return tuple(interpolated(waits[-self._size :], q) for q in qs)


class BatcherStatistics(NamedTuple):
    """An immutable snapshot of a :class:`~coalesce.Batcher`'s counters.

    Wait times are in seconds, measured from a call's arrival to the dispatch of
    its batch, over the most recent 4096 dispatched items (NaN before any).
    """

    #: Calls accepted so far.
    items_submitted: int
    #: Calls that received a result.
    items_completed: int
    #: Calls that received an exception (their own, or their batch's).
    items_failed: int
    #: Calls cancelled by their caller, before or after dispatch.
    items_cancelled: int
    #: Batches handed to the batch function.
    batches: int
    #: Batches by :class:`~coalesce.DispatchReason` value (``"full"``, ``"size"``,
    #: ``"window"``, ``"close"``, and for budget planning ``"deadline"``, ``"solo"``,
    #: ``"tokens"``, ``"probe"``); every reason is present, zero or not. The same name as
    #: :attr:`coalesce.PromptStatistics.dispatch_reasons`.
    dispatch_reasons: Mapping[str, int]
    #: Mean items per dispatched batch (NaN before any).
    mean_batch_size: float
    #: Largest batch dispatched so far.
    max_batch_size: int
    #: Items accepted and not yet dispatched.
    queue_depth: int
    #: Batches running now.
    batches_in_flight: int
    #: Median wait from arrival to dispatch.
    wait_p50: float
    #: 95th percentile wait from arrival to dispatch.
    wait_p95: float
    #: 99th percentile wait from arrival to dispatch.
    wait_p99: float

    @property
    def batches_by_reason(self) -> Mapping[str, int]:
        """Deprecated: the old name of :attr:`dispatch_reasons`."""
        warnings.warn(
            "BatcherStatistics.batches_by_reason is deprecated; use dispatch_reasons",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.dispatch_reasons
