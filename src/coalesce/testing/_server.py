"""Serving the simulated provider over real HTTP: uvicorn in a background thread."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

import anyio.to_thread

from ._asgi import SimulatedDisconnect

if TYPE_CHECKING:
    from ._provider import SimulatedProvider

__all__ = ["ServerThread", "serve_in_thread", "serve_in_thread_async"]

_STARTUP_TIMEOUT = 30.0


class _QuietDisconnects(logging.Filter):
    """Keep the ``disconnect`` fault out of uvicorn's error log: it is on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], SimulatedDisconnect))


class ServerThread:
    """uvicorn serving a provider on an already bound socket, in a daemon thread."""

    def __init__(self, sim: SimulatedProvider, host: str, port: int) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError:
            self.socket.close()
            raise
        bound_host, bound_port = self.socket.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.base_url = f"http://{shown}:{bound_port}"
        config = uvicorn.Config(
            sim, log_level="warning", lifespan="off", loop="asyncio", http="h11",
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
        """Start the thread; call :meth:`wait_started` next."""
        logging.getLogger("uvicorn.error").addFilter(self._filter)
        self.thread.start()

    def wait_started(self) -> None:
        """Block until the server accepts connections.

        Raises:
            RuntimeError: The server failed to start.
        """
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
        """Ask the server to stop and wait for the thread to end."""
        self.server.should_exit = True
        self.thread.join(timeout=_STARTUP_TIMEOUT)
        self.socket.close()
        logging.getLogger("uvicorn.error").removeFilter(self._filter)


@contextmanager
def serve_in_thread(sim: SimulatedProvider, host: str, port: int) -> Iterator[str]:
    """Serve ``sim`` until the block ends; yield its base URL.

    Args:
        sim: The provider.
        host: The interface.
        port: The port, 0 for any free one.
    """
    server = ServerThread(sim, host, port)
    server.start()
    try:
        server.wait_started()
        yield server.base_url
    finally:
        server.stop()


@asynccontextmanager
async def serve_in_thread_async(sim: SimulatedProvider, host: str, port: int) -> AsyncIterator[str]:
    """Like :func:`serve_in_thread`, starting and stopping in a worker thread.

    Args:
        sim: The provider.
        host: The interface.
        port: The port, 0 for any free one.
    """
    server = ServerThread(sim, host, port)
    server.start()
    try:
        await anyio.to_thread.run_sync(server.wait_started)
        yield server.base_url
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(server.stop)
