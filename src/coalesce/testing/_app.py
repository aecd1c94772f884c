"""The ASGI app: the route table, dispatch, and the ASGI lifespan protocol."""

from __future__ import annotations

import re

from ._admin import expire_batch, inject, inject_flex, reset, root, stats
from ._anthropic import ANTHROPIC
from ._asgi import HttpError, Receive, Scope, Send, read_request
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
from ._flavour import Flavour, send_error
from ._generate import chat_completions, messages, responses
from ._message_batch_routes import (
    cancel_message_batch,
    create_message_batch,
    get_message_batch,
    list_message_batches,
    message_batch_results,
)
from ._openai import OPENAI
from ._routing import Call, Handler, Simulation

__all__ = ["flavour_of", "handle"]

_TABLE: list[tuple[str, str, Handler]] = [
    ("GET", r"/", root),
    ("POST", r"/v1/chat/completions", chat_completions),
    ("POST", r"/v1/responses", responses),
    ("POST", r"/v1/messages", messages),
    ("GET", r"/_sim/stats", stats),
    ("POST", r"/_sim/reset", reset),
    ("POST", r"/_sim/faults", inject),
    ("POST", r"/_sim/flex", inject_flex),
    ("POST", r"/_sim/batches/expire", expire_batch),
    ("POST", r"/v1/files", upload_file),
    ("GET", r"/v1/files/(?P<id>[^/]+)", get_file),
    ("DELETE", r"/v1/files/(?P<id>[^/]+)", delete_file),
    ("GET", r"/v1/files/(?P<id>[^/]+)/content", file_content),
    ("POST", r"/v1/batches", create_batch),
    ("GET", r"/v1/batches", list_batches),
    ("GET", r"/v1/batches/(?P<id>[^/]+)", get_batch),
    ("POST", r"/v1/batches/(?P<id>[^/]+)/cancel", cancel_batch),
    ("POST", r"/v1/messages/batches", create_message_batch),
    ("GET", r"/v1/messages/batches", list_message_batches),
    ("GET", r"/v1/messages/batches/(?P<id>[^/]+)", get_message_batch),
    ("POST", r"/v1/messages/batches/(?P<id>[^/]+)/cancel", cancel_message_batch),
    ("GET", r"/v1/messages/batches/(?P<id>[^/]+)/results", message_batch_results),
]
_ROUTES = [(method, re.compile(path + r"/?\Z"), handler) for method, path, handler in _TABLE]


def flavour_of(path: str) -> Flavour:
    """Return the API flavour of a path (Anthropic under ``/v1/messages``).

    Args:
        path: The request path.
    """
    return ANTHROPIC if path.startswith("/v1/messages") else OPENAI


async def handle(sim: Simulation, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one ASGI connection scope.

    Args:
        sim: The provider.
        scope: The ASGI scope.
        receive: The ASGI receive callable.
        send: The ASGI send callable.
    """
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    request = await read_request(scope, receive)
    flavour = flavour_of(request.path)
    path_matched = False
    for method, pattern, handler in _ROUTES:
        match = pattern.match(request.path)
        if match is None:
            continue
        path_matched = True
        if method == request.method:
            try:
                await handler(Call(sim, request, match, receive, send))
            except HttpError as exc:
                await send_error(send, flavour, exc.status, exc.message)
            return
    status = 405 if path_matched else 404
    await send_error(send, flavour, status, f"no route for {request.method} {request.path}")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
