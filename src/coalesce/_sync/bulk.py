"""Many calls of one function at once: ``await f.map(items)``.

A list of 2,000 items gathered at once puts 2,000 calls in flight: the requests they
make race each other, and items queued behind the first requests spend their latency
budget waiting. :class:`MapCall` keeps at most ``concurrency`` calls in flight (by
default enough to fill a few groups ahead of the requests running), starting each
item's call only when a slot frees, in input order, so each call's budget counts from
its own start. Results come back in input order (``await``), or as pairs as they are
ready (``async for``); a failed item's exception stands in its place unless
``return_exceptions=False``. Progress goes to a callback and, optionally, a bar
(:mod:`~coalesce._sync.progress`).

The calls run as background tasks of the running loop (cancelled when the map ends,
early or not), so breaking out of an ``async for`` leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._batching.runtime import spawn_task
from .._exceptions import ConfigurationError
from .progress import Display, ProgressOption, check_progress, display

__all__ = ["REQUESTS_AHEAD", "MapCall", "OnProgress", "default_concurrency", "spread"]

R = TypeVar("R")

#: ``on_progress(done, total)``: called as each call finishes.
OnProgress = Callable[[int, int], object]

#: The most calls a map keeps in flight, read again as calls finish.
Limit = Callable[[], int]

#: Requests' worth of items a map keeps in flight when the function sets no
#: ``max_concurrency`` (with it: exactly enough to fill every request slot).
REQUESTS_AHEAD = 16


def default_concurrency(max_items: int, max_concurrency: int | None) -> int:
    """How many calls a map keeps in flight by default: enough to fill every request
    the function may run at once (``max_items`` times ``max_concurrency``), no more, so that
    no item waits in coalesce's own queue while its budget runs; without a
    ``max_concurrency``, :data:`REQUESTS_AHEAD` requests' worth."""
    return max_items * (max_concurrency if max_concurrency is not None else REQUESTS_AHEAD)


def spread(item: Any, *, single: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of one item's call: for a function of one parameter (``single``),
    the item itself; otherwise a tuple is the positional arguments, a dict the keyword
    arguments, and anything else the first argument."""
    if not single:
        if isinstance(item, tuple):
            return item, {}
        if isinstance(item, dict):
            return (), item
    return (item,), {}


class _Workers:
    """The calls of one map, as background tasks of the running loop, and what they
    report: ``(index, result, ok)`` per item, in the order they finish. ``limit()`` is
    read as calls finish, so the number in flight follows a limit that moves (the
    function's group cap, as it is learned)."""

    def __init__(self, call: Callable[[int], Awaitable[Any]], total: int, limit: Limit) -> None:
        self._call = call
        self._total = total
        self._limit = limit
        self._next = 0
        self._active = 0
        self._scopes: list[anyio.CancelScope] = []
        send: MemoryObjectSendStream[tuple[int, Any, bool]]
        receive: MemoryObjectReceiveStream[tuple[int, Any, bool]]
        send, receive = anyio.create_memory_object_stream(math.inf)
        self._send, self.receive = send, receive
        self._grow()

    def _grow(self) -> None:
        """Start workers up to the limit, no more than there are items left."""
        wanted = min(max(1, self._limit()), self._total - self._next)
        while self._active < wanted:
            self._active += 1
            spawn_task(self._work)

    async def _work(self) -> None:
        with anyio.CancelScope() as scope:
            self._scopes.append(scope)
            try:
                while self._next < self._total and self._active <= max(1, self._limit()):
                    index = self._next
                    self._next += 1
                    try:
                        outcome: tuple[int, Any, bool] = (index, await self._call(index), True)
                    except Exception as exc:
                        outcome = (index, exc, False)
                    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                        self._send.send_nowait(outcome)
                    self._grow()
            finally:
                self._active -= 1

    def cancel(self) -> None:
        """Stop: the calls in flight are cancelled (their items withdrawn), no more start."""
        self._next = self._total
        for scope in self._scopes:
            scope.cancel()
        self._send.close()
        self.receive.close()


class MapCall(Generic[R]):
    """What ``f.map(items)`` returns: await it for the results in input order, or
    iterate it (``async for index, result in ...``) for ``(index, result)`` pairs as
    they are ready (in input order with ``ordered=True``). Each await or iteration
    runs the calls afresh.

    Args:
        call: ``call(index)``: the call of the item at ``index``.
        total: How many items.
        concurrency: Most calls in flight at once: a number, or a function read again
            as calls finish (the default of ``f.map`` follows the group cap).
        ordered: Iteration yields in input order (else as each call finishes).
        return_exceptions: A failed call's exception stands in its place (else the
            first failure is raised and the calls left are cancelled).
        on_progress: Called with ``(done, total)`` as each call finishes.
        progress: ``True``: a bar on standard error if it is a terminal; ``"always"``:
            drawn anyway; ``False``: none.
        label: The bar's label.

    Raises:
        ConfigurationError: ``concurrency`` is not a positive integer, or ``progress``
            is not ``True``, ``False`` or ``"always"``.
    """

    def __init__(
        self,
        call: Callable[[int], Awaitable[R]],
        total: int,
        *,
        concurrency: int | Limit,
        ordered: bool = True,
        return_exceptions: bool = True,
        on_progress: OnProgress | None = None,
        progress: ProgressOption = False,
        label: str = "calls",
    ) -> None:
        if not callable(concurrency) and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ConfigurationError(f"concurrency must be a positive integer, got {concurrency!r}")
        try:
            self.progress = check_progress(progress)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.call = call
        self.total = total
        self.concurrency = concurrency
        self._limit: Limit = concurrency if callable(concurrency) else lambda: concurrency
        self.return_exceptions = return_exceptions
        self.label = label
        self._ordered = ordered
        self._on_progress = on_progress

    def __await__(self) -> Generator[Any, None, list[R]]:
        return self.results().__await__()

    def __aiter__(self) -> AsyncIterator[tuple[int, R]]:
        return _Pairs(self, self._ordered)

    async def results(self) -> list[R]:
        """Every call's result (or exception), in input order."""
        results: list[Any] = [None] * self.total
        pairs = _Pairs(self, ordered=False)
        try:
            async for index, result in pairs:
                results[index] = result
        finally:
            pairs.close()
        return results

    def limit(self) -> int:
        """The most calls in flight now."""
        return self._limit()

    def tell(self, shown: Display | None, done: int) -> None:
        """``done`` calls have finished: the bar and ``on_progress`` are told."""
        if shown is not None:
            shown.update(done, self.total)
        if self._on_progress is not None:
            self._on_progress(done, self.total)

    def __repr__(self) -> str:
        return (
            f"<coalesce map of {self.total} {self.label} calls, {self._limit()} in flight at most>"
        )


class _Pairs(Generic[R]):
    """One iteration of a :class:`MapCall`: its workers, started on the first step,
    and the results read so far. Closed (the calls left cancelled) when exhausted,
    failed, closed or garbage collected, so that ``break`` leaves nothing behind."""

    def __init__(self, the_map: MapCall[R], ordered: bool) -> None:
        self._map = the_map
        self._ordered = ordered
        self._workers: _Workers | None = None
        self._shown: Display | None = None
        self._ready: dict[int, Any] = {}
        self._expected = 0
        self._done = 0
        self._closed = False

    def __aiter__(self) -> _Pairs[R]:
        return self

    async def __anext__(self) -> tuple[int, R]:
        the_map = self._map
        if self._workers is None and not self._closed:
            self._workers = _Workers(the_map.call, the_map.total, the_map.limit)
            self._shown = display(the_map.progress, the_map.label, the_map.total)
        while not self._closed:
            if self._ordered and self._expected in self._ready:
                self._expected += 1
                return self._expected - 1, self._ready.pop(self._expected - 1)
            if self._done == the_map.total:
                break
            pair = await self._receive()
            if pair is not None:
                return pair
        self.close()
        raise StopAsyncIteration

    async def _receive(self) -> tuple[int, R] | None:
        """The next call to finish: its pair now, or ``None`` once kept for later."""
        assert self._workers is not None
        try:
            index, result, ok = await self._workers.receive.receive()
            self._done += 1
            self._map.tell(self._shown, self._done)
            if not ok and not self._map.return_exceptions:
                raise result
        except BaseException:
            self.close()
            raise
        if not self._ordered:
            return index, result
        self._ready[index] = result
        return None

    def close(self) -> None:
        """Stop: the calls in flight are cancelled and no more start."""
        if self._closed:
            return
        self._closed = True
        if self._workers is not None:
            self._workers.cancel()
        if self._shown is not None:
            self._shown.close()

    async def aclose(self) -> None:
        """The same as :meth:`close`."""
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
