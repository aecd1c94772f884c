"""The gateway's clients of its upstreams: one wrapped SDK client per provider, and one
plain HTTP client for every path it proxies untouched.

Per provider the gateway holds one ``coalesce.wrap``-ed SDK client
(``openai.AsyncOpenAI`` / ``anthropic.AsyncAnthropic`` with ``base_url`` at the
upstream): its engines coalesce the calls of every client of the gateway. Each call is
sent through a copy made with its caller's credential (:meth:`Upstream.client_for`,
``with_options``; copies are kept per caller, the newest :data:`COPIES`); copies share
the engines, and ``wrap`` gives a copy with other credentials engines and requests of
its own. The partition of ``--api-key`` mode reaches ``wrap``'s ``partition=`` through
:data:`PARTITION`, set by the route around each call.

:func:`warm_up` loads at startup what the first coalesced call would otherwise load
inside the event loop (the token encodings: half a second or more of CPU), where it
would stall every call in flight and teach the planner a provider slower than it is.
"""

from __future__ import annotations

from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp

from .._planning.encodings import encoding
from .._wrap import wrap
from .callers import Caller
from .config import GatewayConfig
from .metrics import GatewayMetrics

__all__ = [
    "COPIES",
    "KEEPALIVE",
    "PARTITION",
    "PROVIDERS",
    "Upstream",
    "Upstreams",
    "env_proxy",
    "proxy_client",
    "warm_up",
]

#: Client copies kept per provider, one per caller (the least recently used goes first).
COPIES = 1024
#: The providers the gateway fronts.
PROVIDERS = ("openai", "anthropic")
#: The call's partition in ``--api-key`` mode (a digest of its client key), read by
#: ``wrap``'s ``partition=`` function in the calling task.
PARTITION: ContextVar[str | None] = ContextVar("coalesce_gateway_partition", default=None)
#: The root clients' key in pass-through mode: never sent, since every call goes
#: through a copy holding its own caller's key.
_UNSET_KEY = "coalesce-gateway-no-key"
#: Seconds an idle proxy connection is kept open for the next call.
KEEPALIVE = 30.0
#: The token encodings the planner counts with: OpenAI's newer models', and the
#: stand-in of every other model (see :func:`~coalesce._planning.encodings.encoding_name_for`).
_ENCODINGS = ("o200k_base", "cl100k_base")


def warm_up() -> None:
    """Load the token encodings now (see the module doc); run it in a worker thread."""
    for name in _ENCODINGS:
        encoding(name)


def _partition(**_: Any) -> str | None:
    return PARTITION.get()


def proxy_client(config: GatewayConfig) -> aiohttp.ClientSession:
    """The plain HTTP client of every call the gateway proxies untouched (open it in the
    event loop that will use it).

    aiohttp, not httpx: each call on this path costs the gateway what its HTTP client
    costs, and aiohttp's takes a kept-alive connection off a queue with its HTTP parsed
    in C, where httpx's pool probes every idle connection's socket for every request
    (about 4x the CPU per call, more as connections grow). No cap on connections: a
    proxied call may stream for minutes, and the upstream says how many it takes. No
    cookies: one caller's reply must not set a cookie that goes with the next caller's
    request. Bodies stay as they came (no decompression). The environment's proxy is
    read once (:func:`env_proxy`), not for every request as aiohttp's ``trust_env`` does
    (in a worker thread, with the ``.netrc`` file read each time).
    """
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=30.0, sock_read=config.upstream_timeout
    )
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE),
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, unless ``NO_PROXY`` covers its host), as the SDKs would use it."""
    parts = urlsplit(url)
    if proxy_bypass(parts.hostname or ""):
        return None
    proxies = getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


@dataclass
class Upstream:
    """One provider's wrapped client and its copies per caller.

    Attributes:
        provider: ``"openai"`` or ``"anthropic"``.
        client: The wrapped SDK client (with the gateway's upstream key in ``--api-key``
            mode, else a key that is never sent).
        base_url: The upstream's base URL, as configured.
        has_key: Whether the client holds a real upstream key (``--api-key`` mode).
        proxy: The HTTP proxy the environment names for ``base_url`` (``HTTPS_PROXY``
            and the like, less ``NO_PROXY``), read once at startup, if any.
    """

    provider: str
    client: Any
    base_url: str
    has_key: bool = False
    proxy: str | None = None
    _copies: OrderedDict[str, Any] = field(default_factory=OrderedDict, repr=False)

    def client_for(self, caller: Caller) -> Any:
        """The wrapped client that sends ``caller``'s calls."""
        if not caller.options:
            return self.client
        copy = self._copies.get(caller.digest)
        if copy is None:
            copy = self.client.with_options(**caller.options)
            self._copies[caller.digest] = copy
            if len(self._copies) > COPIES:
                self._copies.popitem(last=False)  # shares the engines: nothing to close
        else:
            self._copies.move_to_end(caller.digest)
        return copy


@dataclass
class Upstreams:
    """Every upstream client of one gateway (opened by :meth:`open`)."""

    openai: Upstream
    anthropic: Upstream
    http: aiohttp.ClientSession

    @classmethod
    def open(cls, config: GatewayConfig, metrics: GatewayMetrics) -> Upstreams:
        """The clients of ``config``'s upstreams, reporting to ``metrics``."""
        import anthropic
        import openai

        wrapped: dict[str, Upstream] = {}
        keys = {"openai": config.openai_api_key, "anthropic": config.anthropic_api_key}
        urls = {"openai": config.openai_upstream, "anthropic": config.anthropic_upstream}
        sdks = {"openai": openai.AsyncOpenAI, "anthropic": anthropic.AsyncAnthropic}
        for provider in PROVIDERS:
            key = keys[provider] if config.holds_keys else None
            plain = sdks[provider](
                base_url=urls[provider],
                api_key=key or _UNSET_KEY,
                max_retries=config.max_retries,
                timeout=config.upstream_timeout,
            )
            client = wrap(
                plain,
                max_items=config.max_items,
                max_wait=config.max_wait,
                latency_budget=config.budget,
                partition=_partition,
                on_event=metrics.hook(provider),
                **config.lanes,  # issue 23: lane, store, batch_window, poll_interval
            )
            wrapped[provider] = Upstream(
                provider, client, urls[provider], has_key=bool(key), proxy=env_proxy(urls[provider])
            )
        return cls(wrapped["openai"], wrapped["anthropic"], proxy_client(config))

    def of(self, provider: str) -> Upstream:
        """The upstream of ``provider``."""
        return self.openai if provider == "openai" else self.anthropic

    async def aclose(self) -> None:
        """Send what waits in the engines, wait for it, and close every client."""
        for upstream in (self.openai, self.anthropic):
            await upstream.client.aclose()
        await self.http.close()
