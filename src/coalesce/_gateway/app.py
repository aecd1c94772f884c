"""The gateway as an ASGI app (Starlette): its routes, and its life from startup to
shutdown.

* ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``: coalesced
  (:mod:`.routes`);
* ``GET /healthz`` (the process answers), ``GET /readyz`` (it takes calls: started and
  not stopping), ``GET /metrics`` (Prometheus, :mod:`.metrics`);
* every other method and path: proxied untouched (:mod:`.proxy`).

Startup loads the token encodings (:func:`~.upstream.warm_up`) and opens the upstream
clients (:meth:`~.upstream.Upstreams.open`); shutdown, which
the server runs once the calls in flight have their replies, closes them: what still
waits in an engine is sent and awaited first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio.abc
import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._fleet import Member
from .._fleet.wire import Forwarded, Reply
from . import fleet
from .config import GatewayConfig
from .metrics import CONTENT_TYPE
from .proxy import proxy
from .routes import APIS, Api, answer
from .state import GatewayState
from .upstream import Upstreams, warm_up

__all__ = ["JOIN_WAIT", "METHODS", "create_app", "gateway_of"]

#: Seconds a gateway in a fleet waits at startup to join it before taking calls.
JOIN_WAIT = 5.0
#: Every method the proxy passes on.
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]

Endpoint = Callable[[Request], Awaitable[Response]]


def gateway_of(app: Starlette) -> GatewayState:
    """The state of the gateway ``app`` serves."""
    state: GatewayState = app.state.gateway
    return state


def _coalescing(state: GatewayState, api: Api) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        if state.member is not None:
            return await fleet.answer(state, api, request)
        return await answer(state, api, request)

    return endpoint


def _routes(state: GatewayState) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = state.ready
        shown: dict[str, Any] = {"ready": ready}
        if state.member is not None:  # NATS down is no reason to refuse calls: they
            # are coalesced here meanwhile, and the fleet's state says so
            shown["fleet"] = state.member.statistics()._asdict()
        return JSONResponse(shown, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    async def other(request: Request) -> Response:
        return await proxy(state, request)

    own = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    coalesced = [Route(api.path, _coalescing(state, api), methods=["POST"]) for api in APIS]
    return [*own, *coalesced, Route("/{path:path}", other, methods=METHODS)]


async def _join(tasks: anyio.abc.TaskGroup, state: GatewayState) -> Member | None:
    """Join the fleet ``state``'s settings name, if any (in the background: calls are
    coalesced here until NATS answers)."""
    settings = state.config.fleet_settings
    if settings is None:
        return None

    async def serve(call: Forwarded) -> Reply | None:
        return await fleet.serve(state, call)

    member = Member(settings, serve)
    member.ceiling = state.config.upstream_timeout
    await tasks.start(member.run)
    # Calls are taken once the fleet is joined (none coalesced apart while it settles),
    # or, NATS unreachable, after a short wait (they are coalesced here meanwhile).
    with anyio.move_on_after(JOIN_WAIT):
        await member.joined.wait()
    state.metrics.watch_fleet(member.statistics)
    state.member = member
    return member


def create_app(config: GatewayConfig, state: GatewayState | None = None) -> Starlette:
    """The gateway's ASGI app for ``config``.

    Args:
        config: Its settings.
        state: Its state (a new one by default; pass one to watch it from outside).
    """
    gateway = state if state is not None else GatewayState(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(warm_up)
        gateway.upstreams = Upstreams.open(config, gateway.metrics)
        try:
            async with anyio.create_task_group() as tasks:
                member = await _join(tasks, gateway)
                try:
                    yield
                finally:
                    gateway.draining = True
                    if member is not None:  # it answers what it holds, then leaves
                        await member.stop_serving(config.graceful_timeout)
                        gateway.member = None
                    tasks.cancel_scope.cancel()
        finally:
            await gateway.upstreams.aclose()
            gateway.upstreams = None

    app = Starlette(routes=_routes(gateway), lifespan=lifespan)
    app.state.gateway = gateway
    return app
