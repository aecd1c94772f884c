"""``coalesce serve``: the gateway under uvicorn, from the command line.

It binds the socket itself (so ``--port 0`` works and the address is printed once it
accepts connections), then serves until SIGTERM or Ctrl-C. Stopping is graceful:
``/readyz`` turns 503 at once, the socket stops accepting, the calls in flight get
their replies (their groups go within their budgets) for up to ``graceful_timeout``
seconds, then the upstream clients are closed and the process exits with status 0.

Importing this module imports none of the gateway's dependencies (Starlette, uvicorn,
prometheus-client, the SDKs): :func:`main` does, and says which extra to install if
one is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .config import GatewayConfig, load_config
from .workers import FD_VARIABLE

__all__ = ["bind", "main", "missing_extra", "missing_module", "run"]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port).

    Raises:
        OSError: The address cannot be bound.
    """
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets whose
    # protocol says TCP, and without it a kept-alive client waits ~40 ms for each reply
    # whose headers and body go in two writes (Nagle against delayed ACKs).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    # Listening before the address is printed: a client that reads it and connects at
    # once waits in the backlog until uvicorn accepts, instead of being refused.
    sock.listen(2048)
    return sock


def run(
    config: GatewayConfig, sock: socket.socket, started: Callable[[], None] | None = None
) -> None:
    """Serve the gateway of ``config`` on ``sock`` until told to stop (see the module doc);
    ``started()``, if given, is called once it takes calls."""
    import uvicorn

    from .app import create_app
    from .state import GatewayState

    state = GatewayState(config)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and started is not None:
                started()

        def handle_exit(self, sig: int, frame: Any) -> None:
            state.draining = True  # /readyz says so while the calls in flight finish
            super().handle_exit(sig, frame)

    options = uvicorn.Config(
        create_app(config, state),
        lifespan="on",
        log_level=config.log_level,
        access_log=False,  # its lines carry query strings; the gateway logs its own
        proxy_headers=False,  # the client's address is never used: no need to read it
        timeout_graceful_shutdown=math.ceil(config.graceful_timeout),
    )
    with _stop_quietly():
        Server(options).run(sockets=[sock])


def main(argv: Sequence[str]) -> int:
    """Run ``coalesce serve ARGV``; returns the exit status (0 after a clean stop, 2 when
    it cannot start: a dependency missing, an address that cannot be bound).

    Raises:
        ConfigurationError: A setting is out of range (the command line prints it).
    """
    args = list(argv[1:] if argv[:1] == ["serve"] else argv)
    config = load_config(args)
    missing = missing_module(config)
    if missing is not None:
        print(
            f"coalesce serve needs {missing}: pip install 'coalesce-llm[gateway{missing_extra(missing)}]'",
            file=sys.stderr,
        )
        return 2
    from .logs import configure, logger
    from .workers import READY

    configure(config.log_level)
    inherited = os.environ.get(FD_VARIABLE)
    if inherited:  # a worker of --workers: the parent's socket, already listening
        run(config, socket.socket(fileno=int(inherited)), lambda: print(READY, flush=True))
        return 0
    try:
        sock = bind(config.host, config.port)
    except OSError as exc:
        print(
            f"coalesce serve: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr
        )
        return 2
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def listening() -> None:
        print(f"coalesce gateway listening on {url}", flush=True)
        print(f"  OpenAI base_url: {url}/v1   Anthropic base_url: {url}", flush=True)

    logger.info("coalesce gateway starting: %s", config.describe())
    if config.workers > 1:  # the address is printed once every worker takes calls
        return _workers(args, config, sock, listening)
    listening()
    run(config, sock)
    return 0


#: The modules ``coalesce serve`` needs (the gateway extra's), and a fleet's.
_NEEDED = ("aiohttp", "anthropic", "openai", "prometheus_client", "starlette", "uvicorn")


def missing_module(config: GatewayConfig) -> str | None:
    """The first module the gateway of ``config`` needs that is not installed. A gateway
    imports them here, before it says it listens (seconds of imports its first calls
    would otherwise wait for); a parent of ``--workers`` only finds them, never
    importing what only its workers run."""
    needed = _NEEDED + (("nats",) if config.fleet or config.workers > 1 else ())
    if config.workers > 1 and FD_VARIABLE not in os.environ:
        return next((name for name in needed if importlib.util.find_spec(name) is None), None)
    for name in needed:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def missing_extra(module: str) -> str:
    """The extra besides ``gateway`` that installs ``module``: ``,fleet`` for nats-py."""
    return ",fleet" if module == "nats" else ""


def _workers(
    argv: Sequence[str], config: GatewayConfig, sock: socket.socket, ready: Callable[[], None]
) -> int:
    """``--workers N``: N processes on ``sock``, one fleet (``workers.py``)."""
    from .workers import embedded_nats, supervise

    with contextlib.ExitStack() as stack:
        fleet = None if config.fleet else stack.enter_context(embedded_nats())
        return supervise(argv, sock, config.workers, fleet, ready)


@contextlib.contextmanager
def _stop_quietly() -> Iterator[None]:
    """Let Ctrl-C and SIGTERM end the server with status 0.

    uvicorn shuts down gracefully on these signals, then raises them again with the
    handlers it found; ignoring them here makes that a no-op.
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
