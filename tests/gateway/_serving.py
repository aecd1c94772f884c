"""The gateway's test harness: the simulator recording what reaches it, and the gateway
served by uvicorn (lifespan on) in a thread, as ``coalesce serve`` serves it."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn

from coalesce._gateway.app import create_app
from coalesce._gateway.config import GatewayConfig
from coalesce._gateway.server import bind
from coalesce._gateway.state import GatewayState

ASGI = Callable[[Any, Any, Any], Awaitable[None]]


@dataclass
class Seen:
    """One request as it reached the simulator."""

    method: str
    path: str
    query: str
    key: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """The simulator, recording every request it is sent (its key, headers and body)."""

    app: ASGI
    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recorded() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        query = scope.get("query_string", b"").decode()

        async def sent(message: Any) -> None:
            # Recorded as the reply starts, before the client can read it: a test that
            # looks as soon as its call returns finds the request.
            if message["type"] == "http.response.start":
                self.seen.append(
                    Seen(scope["method"], scope["path"], query, key, headers, b"".join(chunks))
                )
            await send(message)

        await self.app(scope, recorded, sent)


@dataclass
class Running:
    """A gateway serving in a thread."""

    url: str
    state: GatewayState

    @property
    def openai_url(self) -> str:
        return f"{self.url}/v1"


class GatewayThread:
    """The gateway of ``config`` under uvicorn (lifespan on) in a daemon thread."""

    def __init__(self, config: GatewayConfig) -> None:
        self.sock = bind("127.0.0.1", 0)
        host, port = self.sock.getsockname()[:2]
        self.state = GatewayState(config)
        options = uvicorn.Config(
            create_app(config, self.state), lifespan="on", log_level="warning",
            access_log=False, timeout_graceful_shutdown=5,
        )  # fmt: skip
        self.server = uvicorn.Server(options)
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self._run, name=f"gateway {self.url}", daemon=True)

    def _run(self) -> None:
        self.server.run(sockets=[self.sock])

    def start(self) -> None:
        self.thread.start()
        for _ in range(3000):
            if self.server.started or not self.thread.is_alive():
                break
            self.thread.join(0.01)
        assert self.server.started, "the gateway did not start"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def gateway_config(sim_url: str, **options: Any) -> GatewayConfig:
    """A gateway in front of the simulator at ``sim_url``: a 2 s budget and groups of up
    to 20, as tests/integrations wrap their clients."""
    settings: dict[str, Any] = {"budget": 2.0, "max_items": 20, **options}
    return GatewayConfig(
        openai_upstream=f"{sim_url}/v1", anthropic_upstream=sim_url, port=0, **settings
    )


@asynccontextmanager
async def serving(config: GatewayConfig) -> AsyncIterator[Running]:
    """Serve a gateway of ``config`` for the block."""
    thread = GatewayThread(config)
    await anyio.to_thread.run_sync(thread.start)
    try:
        yield Running(thread.url, thread.state)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.stop)
