"""The in-process transport: the provider as an ASGI app, streamed like a socket.

``httpx2.ASGITransport`` runs the app to the end before it returns, so a streamed
reply reaches the client all at once. :class:`SimulatedTransport` runs the app in a
background task of the event loop instead, returns the response as soon as the app
sends ``http.response.start``, and hands the client each ``http.response.body``
chunk when the app sends it, on the loop's clock (virtual or not). A small buffer
between the two gives the app a socket's back-pressure.

The app's task cannot live in a task group of the caller: the response outlives
``handle_async_request``. It is a loop-level task (``loop.create_task`` on asyncio, a
trio *system task*), and it is cancelled when the client closes the response early.

This is the one module of the package that imports ``httpx2`` (the HTTP library of
the openai 3.x and current anthropic SDKs): it is imported only when a client is made
in process, so importing the package never imports ``httpx2``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio
import httpx2
from starlette.types import ASGIApp, Message, Scope

from ._http import SimulatedDisconnect

__all__ = ["SimulatedTransport", "asgi_scope", "in_process_client"]

#: ASGI messages the app may send ahead of the client's reading.
_BUFFER = 4


def asgi_scope(request: httpx2.Request) -> Scope:
    """Build the ASGI HTTP scope of a request, as ``httpx2.ASGITransport`` does."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "headers": [(k.lower(), v) for (k, v) in request.headers.raw],
        "scheme": request.url.scheme,
        "path": request.url.path,
        "raw_path": request.url.raw_path.split(b"?")[0],
        "query_string": request.url.query,
        "server": (request.url.host, request.url.port),
        "client": ("127.0.0.1", 123),
        "root_path": "",
    }


class _Exchange:
    """One request's run of the app, and the channel its messages come back on."""

    def __init__(self, app: ASGIApp, scope: Scope, request: httpx2.Request) -> None:
        if not isinstance(request.stream, httpx2.AsyncByteStream):
            raise TypeError("SimulatedTransport needs an async request (use httpx2.AsyncClient)")
        self._app = app
        self._scope = scope
        self._body = request.stream.__aiter__()
        self._body_read = False
        self._outbox, self.inbox = anyio.create_memory_object_stream[Message](_BUFFER)
        self._gone = anyio.Event()  # the response is complete or the client left
        self._done = anyio.Event()
        self._cancel = anyio.CancelScope()
        self.started = False
        self.complete = False
        self.error: Exception | None = None

    async def run(self) -> None:
        """Run the app; its exception is kept for the client, never raised here."""
        try:
            with self._cancel:
                await self._app(self._scope, self._receive, self._send)
        except Exception as exc:
            self.error = exc
        finally:
            self._done.set()
            self._outbox.close()

    async def _receive(self) -> Message:
        # Like a server: the body, then nothing until the client goes away.
        if self._body_read or self._gone.is_set():
            await self._gone.wait()
            return {"type": "http.disconnect"}
        try:
            chunk = await self._body.__anext__()
        except StopAsyncIteration:
            self._body_read = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("the ASGI app started its response twice")
            self.started = True
        elif kind == "http.response.body":
            if not self.started or self.complete:
                raise RuntimeError("the ASGI app sent a body outside a response")
            self.complete = not message.get("more_body", False)
        await self._outbox.send(message)
        if self.complete:
            self._gone.set()

    async def aclose(self) -> None:
        """Hang up: the app sees ``http.disconnect``, is cancelled, and has ended on return."""
        self.inbox.close()
        if self._done.is_set():
            return
        self._gone.set()
        self._cancel.cancel()
        # The app is cancelled, so this wait is short; shielded so that a cancelled
        # caller (which is often why the response is closed) still leaves no task.
        with anyio.CancelScope(shield=True):
            await self._done.wait()


class _ResponseStream(httpx2.AsyncByteStream):
    """The body chunks of one response, as the app sends them."""

    def __init__(self, exchange: _Exchange, request: httpx2.Request) -> None:
        self._exchange = exchange
        self._request = request
        self._head = request.method == "HEAD"

    def __aiter__(self) -> AsyncIterator[bytes]:
        # An iterator object rather than an async generator: the client may stop
        # reading at any point, and a generator left unfinished would warn when
        # collected.
        return self

    async def __anext__(self) -> bytes:
        while True:
            try:
                message = await self._exchange.inbox.receive()
            except anyio.EndOfStream:
                self._check_ending()
                raise StopAsyncIteration from None
            body: bytes = message.get("body", b"")
            if body and not self._head:
                return body

    def _check_ending(self) -> None:
        """Raise if the app ended without completing its response.

        Raises:
            httpx2.RemoteProtocolError: The app failed or returned mid-response, as a
                server dropping the connection would look to the client.
        """
        error = self._exchange.error
        if error is not None:
            raise httpx2.RemoteProtocolError(str(error), request=self._request) from error
        if error is None and not self._exchange.complete:
            message = "the ASGI app returned before completing its response"
            raise httpx2.RemoteProtocolError(message, request=self._request)

    async def aclose(self) -> None:
        """Stop reading; an unfinished app is told the client left and is cancelled."""
        await self._exchange.aclose()


class SimulatedTransport(httpx2.AsyncBaseTransport):
    """Calls an ASGI app in process and streams its responses.

    Unlike ``httpx2.ASGITransport``, the response is returned as soon as the app
    starts it and its body arrives chunk by chunk, when the app sends it. A
    simulated dropped connection surfaces as ``httpx2.RemoteProtocolError``, as it
    would over a real socket, so the SDKs report it as their own connection error;
    any other exception of the app reaches the client.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # asyncio keeps only weak references to tasks: keep them until done.
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send one request to the app and return once its response starts.

        Raises:
            httpx2.RemoteProtocolError: The connection dropped (the ``disconnect``
                fault) or the app returned without a response. Once the response has
                started, the same error comes from reading its body instead.
            Exception: The app's own exception before its response started.
        """
        exchange = _Exchange(self.app, asgi_scope(request), request)
        self._spawn(exchange.run)
        try:
            start = await exchange.inbox.receive()
        except anyio.EndOfStream:
            await exchange.aclose()
            return self._failed_response(exchange, request)
        except BaseException:
            await exchange.aclose()
            raise
        stream = _ResponseStream(exchange, request)
        return httpx2.Response(start["status"], headers=start.get("headers", []), stream=stream)

    def _failed_response(self, exchange: _Exchange, request: httpx2.Request) -> httpx2.Response:
        """The answer to an app that ended before starting its response."""
        error = exchange.error
        if isinstance(error, SimulatedDisconnect):
            raise httpx2.RemoteProtocolError(str(error), request=request) from error
        if error is None:
            message = "the ASGI app returned without starting a response"
            raise httpx2.RemoteProtocolError(message, request=request)
        raise error

    def _spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fn()`` as a task of the running loop, outside any caller's task group."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            import trio

            trio.lowlevel.spawn_system_task(fn, context=contextvars.copy_context())
            return
        task = loop.create_task(fn())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def in_process_client(app: ASGIApp, base_url: str) -> httpx2.AsyncClient:
    """Return an ``httpx2`` client whose requests go to ``app`` in process, resolving
    relative URLs against ``base_url``."""
    return httpx2.AsyncClient(transport=SimulatedTransport(app), base_url=base_url)
