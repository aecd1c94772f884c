"""Serving an ASGI app over real HTTP: uvicorn in a background thread."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from types import TracebackType

import anyio.to_thread
from starlette.types import ASGIApp

from ._http import SimulatedDisconnect

__all__ = ["ServerThread", "bound_socket", "stop_quietly"]

_STARTUP_TIMEOUT = 30.0


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host`` and ``port`` (0: any free one).

    Raises:
        OSError: The address cannot be bound.
    """
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets whose
    # protocol says TCP; without it a kept-alive client waits ~40 ms for each small
    # reply whose headers and body go in two writes (Nagle against delayed ACKs).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def stop_quietly() -> Iterator[None]:
    """Let Ctrl-C and SIGTERM end the server with status 0.

    uvicorn shuts down gracefully on these signals, then re-raises them with the
    handlers it found; ignoring them here makes that re-raise a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _QuietDisconnects(logging.Filter):
    """Keep the ``disconnect`` fault out of uvicorn's error log: it is on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], SimulatedDisconnect))


class ServerThread:
    """uvicorn serving an ASGI app on an already bound socket, in a daemon thread.

    Use it as a context manager, ``with`` in sync code or ``async with`` in async
    code (which starts and stops the server in a worker thread, so the event loop
    keeps running); either yields the base URL.

    Args:
        app: The ASGI app.
        host: The interface to bind.
        port: The port, 0 for any free one.

    Raises:
        OSError: The address cannot be bound.
    """

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        import uvicorn

        self.socket = bound_socket(host, port)
        bound_host, bound_port = self.socket.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.base_url = f"http://{shown}:{bound_port}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", loop="asyncio", http="h11",
            timeout_graceful_shutdown=1, access_log=False,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"coalesce-sim {self.base_url}", daemon=True
        )
        self._filter = _QuietDisconnects()

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        except BaseException as exc:  # reported to the thread that waits for startup
            self.error = exc
        finally:
            self.ready.set()

    def start(self) -> None:
        """Start the thread and block until the server accepts connections.

        Raises:
            RuntimeError: The server failed to start (it is stopped again).
        """
        logging.getLogger("uvicorn.error").addFilter(self._filter)
        self.thread.start()
        try:
            self._wait_started()
        except BaseException:
            self.stop()
            raise

    def _wait_started(self) -> None:
        # Poll uvicorn's own flag; the event only fires early if the thread dies.
        for _ in range(int(_STARTUP_TIMEOUT / 0.01)):
            if self.server.started:
                return
            if self.ready.wait(0.01):
                break
        raise RuntimeError(
            f"the simulated provider failed to start on {self.base_url}"
        ) from self.error

    def stop(self) -> None:
        """Ask the server to stop and wait for the thread to end (again: a no-op)."""
        self.server.should_exit = True
        self.thread.join(timeout=_STARTUP_TIMEOUT)
        self.socket.close()
        logging.getLogger("uvicorn.error").removeFilter(self._filter)

    def __enter__(self) -> str:
        self.start()
        return self.base_url

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> str:
        try:
            await anyio.to_thread.run_sync(self.start)
        except BaseException:
            # Cancelled while starting: the thread ran on to the end and may be serving.
            await self._stop_shielded()
            raise
        return self.base_url

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop_shielded()

    async def _stop_shielded(self) -> None:
        # Shielded: a cancelled test must still leave no server thread behind.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)
