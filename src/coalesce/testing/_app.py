"""The simulator as an ASGI app (Starlette): its routes, and its errors in each API's shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ._admin import expire_batch, inject, inject_flex, reset, root, stats
from ._anthropic import ANTHROPIC
from ._batch_routes import (
    cancel_batch,
    create_batch,
    delete_file,
    file_content,
    get_batch,
    get_file,
    list_batches,
    upload_file,
)
from ._call import Call, Handler, Simulation
from ._flavour import Flavour, error_response
from ._generate import chat_completions, messages, responses
from ._http import HttpError, Unanswered
from ._message_batch_routes import (
    cancel_message_batch,
    create_message_batch,
    get_message_batch,
    list_message_batches,
    message_batch_results,
)
from ._openai import OPENAI
from ._tokens import count_text

__all__ = ["create_app", "flavour_of"]

_TABLE: list[tuple[str, str, Handler]] = [
    ("GET", "/", root),
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/v1/responses", responses),
    ("POST", "/v1/messages", messages),
    ("GET", "/_sim/stats", stats),
    ("POST", "/_sim/reset", reset),
    ("POST", "/_sim/faults", inject),
    ("POST", "/_sim/flex", inject_flex),
    ("POST", "/_sim/batches/expire", expire_batch),
    ("POST", "/v1/files", upload_file),
    ("GET", "/v1/files/{id}", get_file),
    ("DELETE", "/v1/files/{id}", delete_file),
    ("GET", "/v1/files/{id}/content", file_content),
    ("POST", "/v1/batches", create_batch),
    ("GET", "/v1/batches", list_batches),
    ("GET", "/v1/batches/{id}", get_batch),
    ("POST", "/v1/batches/{id}/cancel", cancel_batch),
    ("POST", "/v1/messages/batches", create_message_batch),
    ("GET", "/v1/messages/batches", list_message_batches),
    ("GET", "/v1/messages/batches/{id}", get_message_batch),
    ("POST", "/v1/messages/batches/{id}/cancel", cancel_message_batch),
    ("GET", "/v1/messages/batches/{id}/results", message_batch_results),
]


def flavour_of(path: str) -> Flavour:
    """Return the API flavour of a path (Anthropic under ``/v1/messages``)."""
    return ANTHROPIC if path.startswith("/v1/messages") else OPENAI


def create_app(sim: Simulation) -> Starlette:
    """The ASGI app that serves ``sim``: one route per endpoint; an :class:`HttpError`,
    an unknown path (404) or method (405) answered in the API's own error shape."""
    routes = [
        Route(path, _endpoint(sim, handler), methods=[method]) for method, path, handler in _TABLE
    ]
    handlers = {HttpError: _http_error, HTTPException: _starlette_error}
    count_text("")  # the tokenizer loads now, not in the first reply's latency
    return Starlette(routes=routes, exception_handlers=handlers)


def _endpoint(sim: Simulation, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:  # the client left before its request was read
            return Unanswered()
        return await handler(Call(sim, request, body))

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HttpError)
    return error_response(flavour_of(request.url.path), exc.status, exc.message)


async def _starlette_error(request: Request, exc: Exception) -> Response:
    """Starlette's own: no route (404), another method (405), a form it cannot read."""
    assert isinstance(exc, HTTPException)
    status, path = exc.status_code, request.url.path
    message = f"no route for {request.method} {path}" if status in (404, 405) else exc.detail
    return error_response(flavour_of(path), status, message)
