"""Blocking forms, for synchronous code: ``f.sync(...)``, ``f.sync.map(items)``, and
async iterators read from a synchronous ``for`` loop.

Every call runs on the process's background event loop
(:mod:`~coalesce._batching.portal`), so the calls of every thread coalesce there; a
function whose work lived on another loop moves there with its first blocking call.
"""

from __future__ import annotations

import enum
import queue
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator
from typing import Any, Generic, ParamSpec, TypeVar

import anyio

from .._batching.portal import call_blocking, start_blocking
from .bulk import MapCall, OnProgress
from .progress import ProgressOption

__all__ = ["Blocking", "iterate_blocking"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _Kind(enum.Enum):
    ITEM = "item"
    ERROR = "error"
    END = "end"


def iterate_blocking(
    iterable: AsyncIterable[T], *, close: Callable[[], Awaitable[object]] | None = None
) -> Iterator[T]:
    """Iterate ``iterable`` on the background loop, from synchronous code.

    Each item is handed over as soon as it is ready; leaving the ``for`` loop early
    (``break``, an exception, closing the iterator) cancels the iteration there, and
    then ``await close()`` runs if given (an SDK stream's, which releases its response).

    Raises:
        RuntimeError: An event loop runs in this thread (it would be blocked).
        Exception: Whatever the iteration raised.
    """
    ready: queue.SimpleQueue[tuple[_Kind, Any]] = queue.SimpleQueue()

    async def feed() -> None:
        try:
            async for item in iterable:
                ready.put((_Kind.ITEM, item))
        except Exception as exc:
            ready.put((_Kind.ERROR, exc))
        else:
            ready.put((_Kind.END, None))
        finally:
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()

    future = start_blocking(feed)
    # Cancelled or failed outside ``feed`` (the loop stopped): the reader must not wait.
    future.add_done_callback(lambda _: ready.put((_Kind.END, None)))
    return _read(ready, future)


def _read(ready: queue.SimpleQueue[tuple[_Kind, Any]], future: Any) -> Iterator[Any]:
    try:
        while True:
            kind, value = ready.get()
            if kind is _Kind.ITEM:
                yield value
            elif kind is _Kind.ERROR:
                raise value
            else:
                return
    finally:
        future.cancel()


class Blocking(Generic[P, R]):
    """``f.sync``: the blocking form of an async function ``f``, for synchronous code
    (a Flask or Django view, a FastAPI ``def`` endpoint, a script's threads).

    ``f.sync(*args, **kwargs)`` blocks until that call's result; calls from every
    thread coalesce together on the background loop. Inside a running event loop (an
    ``async def``, a notebook cell) it refuses, since blocking would stop that loop:
    ``await f(...)`` there.

    Args:
        fn: The async function.
        mapper: ``mapper(items, **options)``: its :class:`~coalesce._sync.bulk.MapCall`.
        close: Its ``aclose``.
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]],
        mapper: Callable[..., MapCall[Any]],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._fn = fn
        self._mapper = mapper
        self._close = close

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """One call; blocks until its own result.

        Raises:
            RuntimeError: Called where an event loop runs in this thread.
            Exception: Whatever the call raised.
        """
        return call_blocking(self._fn, *args, **kwargs)

    def map(
        self,
        items: Iterable[Any],
        *,
        concurrency: int | None = None,
        return_exceptions: bool = True,
        on_progress: OnProgress | None = None,
        progress: ProgressOption = False,
    ) -> list[R | Exception]:
        """Call once per item and block until every result, in input order (see
        ``f.map``: each item is the call's argument, or a tuple / dict of arguments;
        a failed call's exception stands in its place unless ``return_exceptions=False``).
        """
        the_map = self._mapper(
            items,
            concurrency=concurrency,
            return_exceptions=return_exceptions,
            on_progress=on_progress,
            progress=progress,
        )
        return call_blocking(the_map.results)

    def imap(
        self,
        items: Iterable[Any],
        *,
        ordered: bool = True,
        concurrency: int | None = None,
        return_exceptions: bool = True,
        on_progress: OnProgress | None = None,
        progress: ProgressOption = False,
    ) -> Iterator[tuple[int, R | Exception]]:
        """Like :meth:`map`, but yields ``(index, result)`` pairs as they are ready: in
        input order, or as each call finishes with ``ordered=False``. Leaving the loop
        early cancels the calls left."""
        the_map = self._mapper(
            items,
            ordered=ordered,
            concurrency=concurrency,
            return_exceptions=return_exceptions,
            on_progress=on_progress,
            progress=progress,
        )
        return iterate_blocking(the_map)

    def close(self) -> None:
        """Send every pending call now, wait for all of them, refuse new calls."""
        call_blocking(self._close)

    def __repr__(self) -> str:
        return f"<blocking form of {self._fn!r}>"
