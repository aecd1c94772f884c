"""The simulator's HTTP vocabulary: an error answer, a dropped connection, a JSON reply,
no answer.

Starlette serves the simulator (:mod:`~coalesce.testing._app`); this module only adds
what the endpoints share on top of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["HttpError", "SimulatedDisconnect", "Unanswered", "json_response"]


class SimulatedDisconnect(ConnectionResetError):
    """Raised inside the app to drop the connection (the ``disconnect`` fault).

    Over real HTTP the server closes the socket; in process, the ASGI transport
    raises this exception to the client, whose SDK reports a connection error.
    """


class HttpError(Exception):
    """An error answer: status, message and the API's error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self.status = status
        self.message = message
        self.kind = kind
        super().__init__(message)


def json_response(
    value: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON answer, with ``json.dumps``'s own separators: byte for byte what the
    simulator has always sent (Starlette's ``JSONResponse`` writes compact JSON)."""
    body = json.dumps(value, ensure_ascii=False).encode()
    return Response(body, status, headers, media_type="application/json")


class Unanswered(Response):
    """No answer at all: the client has gone."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return
