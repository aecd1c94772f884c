"""How an answer goes out: whole, piece by piece on the simulated model's clock, or half
of it before the connection drops; a hang until the client leaves; and how the request
is logged.

Starlette sends each one. The request is logged once (:class:`Ending`): ``200`` when its
answer is complete, ``499`` when the client left, or the connection was dropped, first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ._flavour import Flavour, StreamEvent
from ._http import SimulatedDisconnect, json_response
from ._latency import Delays, pace

__all__ = ["Ending", "hang", "streamed", "whole"]


class Ending:
    """Logs a request once, with the status its answer ended with.

    Args:
        record: Logs the request with a status.
    """

    def __init__(self, record: Callable[[int], None]) -> None:
        self._record: Callable[[int], None] | None = record

    def done(self) -> None:
        """The answer is complete (logged before its last byte, so that a client that
        read the whole answer always finds its request in the ledger)."""
        self._end(200)

    def gone(self) -> None:
        """The answer ends incomplete; nothing if it was complete."""
        self._end(499)

    def _end(self, status: int) -> None:
        record, self._record = self._record, None
        if record is not None:
            record(status)


async def hang(seconds: float, request: Request) -> bool:
    """Sleep ``seconds`` (``math.inf``: until the client leaves); return ``True`` early if
    the client disconnects first."""
    gone = False
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                await anyio.lowlevel.checkpoint()
            gone = True
            group.cancel_scope.cancel()

        group.start_soon(watch)
        await anyio.sleep(seconds)
        group.cancel_scope.cancel()
    return gone


def whole(
    value: dict[str, Any], headers: dict[str, str], ending: Ending, *, drop: bool
) -> Response:
    """The whole answer at once, or half of it before the connection drops (``drop``: the
    ``disconnect`` fault); ``ending`` logs its request."""
    if not drop:
        ending.done()
        return json_response(value, 200, headers)
    body = json.dumps(value, ensure_ascii=False).encode()
    length = {"content-type": "application/json", "content-length": str(len(body))}
    return _Streamed(_Dropped(body[: len(body) // 2]), {**headers, **length}, ending)


def streamed(
    flavour: Flavour,
    events: list[StreamEvent],
    delays: Delays,
    headers: dict[str, str],
    ending: Ending,
    *,
    drop: bool,
) -> Response:
    """The answer as server-sent events, each when the simulated model emits it: after
    ``delays``' time to the first token, its decoding time shared among the events;
    ``drop`` and ``ending`` as :func:`whole`'s."""
    pieces = _Pieces(flavour, events, delays, ending, drop=drop)
    stream = {"content-type": "text/event-stream", "cache-control": "no-cache"}
    return _Streamed(pieces, {**headers, **stream}, ending)


class _Streamed(StreamingResponse):
    """An answer sent piece by piece, whose request is logged as it ends: complete (its
    pieces tell :meth:`Ending.done`), or not (the client left, the connection dropped)."""

    def __init__(self, pieces: AsyncIterator[bytes], headers: dict[str, str], ending: Ending):
        super().__init__(pieces, headers=headers)
        self._ending = ending

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ending.gone()


class _Dropped:
    """The first half of a reply, then the connection drops (the ``disconnect`` fault).

    Like :class:`_Pieces`, an iterator object rather than an async generator.
    """

    def __init__(self, head: bytes) -> None:
        self._head: bytes | None = head

    def __aiter__(self) -> _Dropped:
        return self

    async def __anext__(self) -> bytes:
        head, self._head = self._head, None
        if head is None:
            raise SimulatedDisconnect("simulated fault: the connection dropped mid-response")
        return head


class _Pieces:
    """A streamed answer's server-sent events, each when the simulated model emits it.

    An iterator object rather than an async generator: the client may leave at any
    point, and a generator left unfinished would warn when collected.
    """

    def __init__(
        self,
        flavour: Flavour,
        events: list[StreamEvent],
        delays: Delays,
        ending: Ending,
        *,
        drop: bool,
    ) -> None:
        pauses = pace(delays.decode, [weight for _, _, weight in events])
        self._events = iter(
            [(flavour.sse(event, data), weight, pause)
             for (event, data, weight), pause in zip(events, pauses, strict=True)]
        )  # fmt: skip
        self._end: bytes | None = flavour.done
        self._first_token = delays.first_token
        self._due: float | None = None
        content = sum(1 for _, _, weight in events if weight)
        self._drop_at = content // 2 if drop else None  # content events sent before the drop
        self._sent = 0
        self._ending = ending

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        if self._due is None:
            # Each piece is due at a fixed offset from the start, so a busy event loop
            # delays a piece but not every piece after it (a real server's decoding does
            # not slow down because its client is busy).
            self._due = anyio.current_time() + self._first_token
            await anyio.sleep_until(self._due)
        for chunk, weight, pause in self._events:
            if weight:
                if self._sent == self._drop_at:
                    raise SimulatedDisconnect("simulated fault: the connection dropped mid-stream")
                self._due += pause
                await anyio.sleep_until(self._due)
                self._sent += 1
            return chunk
        end, self._end = self._end, None
        if end is None:
            raise StopAsyncIteration
        self._ending.done()
        return end
