"""``wrap(client, fleet=...)`` and ``prompt(..., fleet=...)``: an app process joins a
fleet through a gateway of its own, served on a loopback port by a background thread.

The client given is copied with ``base_url`` at that gateway (:func:`fleet_client`),
so every call goes through the SDK as it would without coalesce, over HTTP: its
request built and its reply parsed by the SDK itself (``parse``, tools, raw and
streamed responses, whichever loop or thread calls). The gateway is the one of
``coalesce serve --fleet``: each call goes to its partition's owner in the fleet, or is
coalesced here; its upstream is the client's own ``base_url``, and each call carries
the client's own credential, so calls of two credentials never share a request.

One gateway runs per distinct set of settings (:func:`running`): wrapping clients of
the same upstream with the same options again reuses it. It binds ``127.0.0.1`` only,
and listens before its thread starts, so calls sent while it starts wait for it in the
socket's backlog; if it cannot start, the socket is closed and they fail as calls to a
server that is down do. At exit it stops gracefully: it answers the calls it holds and
hands its partitions over.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError
from .._options import OPTION, NotGiven, on
from .._wrap.fleet import register
from .config import GatewayConfig
from .server import bind, missing_extra, missing_module

__all__ = ["FLEET_OPTIONS", "Sidecar", "fleet_client", "running", "stop_all"]

logger = logging.getLogger("coalesce.fleet")

#: The options of ``wrap`` and ``prompt`` a fleet's gateway takes, by the name of its
#: setting: those ``serve`` takes too, but ``max_retries`` (the client's own retries
#: stay with it, as without a fleet). Every other option keeps its default with
#: ``fleet=`` (the gateway has no such setting: its calls are judged by the owner).
FLEET_OPTIONS: Mapping[str, str] = {
    option.name: option.setting
    for option in on("serve")
    if "wrap" in option.on.split() and option.name != "max_retries"
}
#: By surface, its keywords that keep their meaning with ``fleet=``: they shape each
#: call in this process, before the fleet coalesces it (``prompt``: each call becomes
#: its plain request, sent through the fleet).
_KEPT: Mapping[str, frozenset[str]] = {
    "wrap": frozenset({"client", "max_retries", "timeout"}),
    "prompt": frozenset(
        {
            *("client", "model", "instructions", "request_options", "fn", "max_retries"),
            *("timeout", "max_attempts", "max_output_tokens", "on_event", "token_estimator"),
            *("expected_output_tokens", "context_window", "schema_enforced", "prices"),
            "stream",
        }
    ),
}
_lock = threading.Lock()
_running: dict[GatewayConfig, Sidecar] = {}


class Sidecar:
    """One gateway serving on ``127.0.0.1`` in a daemon thread (see the module doc)."""

    def __init__(self, config: GatewayConfig) -> None:
        missing = missing_module(config)
        if missing is not None:
            raise ConfigurationError(
                f"fleet= needs {missing}: pip install"
                f" 'coalesce-llm[gateway{missing_extra(missing) or ',fleet'}]'"
            )
        import uvicorn

        from .app import create_app
        from .state import GatewayState

        self.config = config
        self.sock = bind("127.0.0.1", 0)
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.state = GatewayState(config)
        options = uvicorn.Config(
            create_app(config, self.state), lifespan="on", log_config=None,
            log_level="warning", access_log=False,
            timeout_graceful_shutdown=math.ceil(config.graceful_timeout),
        )  # fmt: skip
        self.server = uvicorn.Server(options)
        self._stopping = False
        self.thread = threading.Thread(
            target=self._run, name=f"coalesce fleet {self.url}", daemon=True
        )

    def start(self) -> None:
        """Serve, in the background (calls already wait in the socket's backlog)."""
        self.thread.start()

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException:  # pragma: no cover - logged: the callers see a closed port
            logger.exception("coalesce's fleet gateway at %s stopped", self.url)
        finally:
            if not self._stopping:
                logger.error("coalesce's fleet gateway at %s stopped; its calls fail", self.url)
            self.sock.close()  # calls waiting in the backlog fail at once, not in time

    def stop(self, timeout: float | None = None) -> None:
        """Answer the calls in flight, hand the partitions over, and stop."""
        self._stopping = True
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(self.config.graceful_timeout + 5.0 if timeout is None else timeout)
        self.sock.close()


def running(config: GatewayConfig) -> Sidecar:
    """The gateway of ``config`` in this process, started on first use."""
    with _lock:
        sidecar = _running.get(config)
        if sidecar is None or not sidecar.thread.is_alive():  # none yet, or it died
            sidecar = _running[config] = Sidecar(config)
            sidecar.start()
        return sidecar


def stop_all() -> None:
    """Stop every gateway of this process (at exit: see :func:`_at_exit`)."""
    with _lock:
        sidecars = list(_running.values())
        _running.clear()
    for sidecar in sidecars:
        sidecar.stop()


def _at_exit(stop: Callable[[], None]) -> None:
    """Call ``stop`` as the interpreter exits, before ``atexit``'s handlers: those
    include ``weakref.finalize``'s, which close the SDK clients' connection pools a
    gateway still sends through (a call it answers for another process would fail).
    ``threading``'s own exit hook runs first (``concurrent.futures`` uses it too)."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - CPython has had it since 3.9
        atexit.register(stop)
    else:
        register(stop)


_at_exit(stop_all)


def _provider(client: Any) -> str:
    module = type(client).__module__.split(".")[0]
    name = type(client).__name__
    if (
        module not in ("openai", "anthropic")
        or "Azure" in name
        or "Bedrock" in name
        or "Vertex" in name
    ):
        raise ConfigurationError(
            f"fleet= takes an openai.AsyncOpenAI / OpenAI or anthropic.AsyncAnthropic /"
            f" Anthropic client (its calls go through a fleet gateway in front of its"
            f" base_url), got {client!r}; run `coalesce serve --fleet URL` in front of other"
            " providers and point the client's base_url at it"
        )
    return module


def _config(provider: str, base_url: str, given: Mapping[str, Any], where: str) -> GatewayConfig:
    if given.get("fleet") is None:
        raise ConfigurationError(
            f"{where}(): fleet_creds and fleet_tls_ca are how a fleet is joined; give the"
            ' fleet\'s NATS URL too (fleet="nats://host:4222")'
        )
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "log_level": "warning"}
    for name, value in given.items():
        if name in FLEET_OPTIONS:
            if value is not None and not isinstance(value, NotGiven):
                path = OPTION[name].kind is Path and isinstance(value, str)
                settings[FLEET_OPTIONS[name]] = Path(value) if path else value
        elif name not in _KEPT[where] and not _default(value, OPTION[name].default_on(where)):
            raise ConfigurationError(
                f"{where}(fleet=...) coalesces through the fleet's gateway, which does not"
                f" take {name}={value!r}; leave it out with fleet= (the options a fleet takes:"
                f" {', '.join(FLEET_OPTIONS)}), or drop fleet= to coalesce in this process"
            )
    settings[f"{provider}_upstream"] = base_url.rstrip("/")
    return GatewayConfig(**settings)


def _default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def fleet_client(client: Any, given: Mapping[str, Any], where: str = "wrap") -> Any:
    """A copy of ``client`` whose calls go through the fleet named in ``given`` (the
    keywords of ``wrap`` or ``prompt``; see the module doc).

    Raises:
        ConfigurationError: The client is not OpenAI's or Anthropic's own, or an option
            is one a fleet's gateway does not take.
    """
    provider = _provider(client)
    base_url = str(client.base_url)
    sidecar = running(_config(provider, base_url, given, where))
    # OpenAI's routes are under /v1 at the gateway, as under its default base_url.
    return client.with_options(
        base_url=f"{sidecar.url}/v1" if provider == "openai" else sidecar.url
    )


register(fleet_client)
