"""Bare ASGI plumbing: read a request, send JSON, bytes or server-sent events."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import anyio
import anyio.lowlevel

__all__ = [
    "ASGIApp",
    "HttpError",
    "HttpRequest",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "SimulatedDisconnect",
    "read_request",
    "send_body",
    "send_json",
    "send_start",
    "wait_for_disconnect",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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


@dataclass(frozen=True)
class HttpRequest:
    """An HTTP request, fully read.

    Attributes:
        method: Upper-case method.
        path: The path, without the query.
        query: Query parameters (last one wins).
        headers: Lower-case names (last one wins).
        body: The raw body.
        base_url: Scheme and host the client used, e.g. ``http://127.0.0.1:8000``.
    """

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    base_url: str

    def json(self) -> Any:
        """Return the body parsed as JSON.

        Raises:
            HttpError: The body is not JSON.
        """
        try:
            return json.loads(self.body or b"null")
        except ValueError as exc:
            raise HttpError(400, f"the request body is not valid JSON: {exc}") from None

    def json_object(self) -> dict[str, Any]:
        """Return the body as a JSON object.

        Raises:
            HttpError: The body is not a JSON object.
        """
        value = self.json()
        if not isinstance(value, dict):
            raise HttpError(400, "the request body must be a JSON object")
        return value

    @property
    def api_key(self) -> str:
        """The bearer token, or else the ``x-api-key`` header, or ``""``."""
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return self.headers.get("x-api-key", "")


async def read_request(scope: Scope, receive: Receive) -> HttpRequest:
    """Read the whole request.

    Args:
        scope: The ASGI HTTP scope.
        receive: The ASGI receive callable.
    """
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    host = headers.get("host") or "{}:{}".format(*scope.get("server") or ("localhost", 80))
    return HttpRequest(
        method=scope["method"].upper(),
        path=scope["path"],
        query=query,
        headers=headers,
        body=b"".join(chunks),
        base_url=f"{scope.get('scheme', 'http')}://{host}",
    )


def _raw(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_start(send: Send, status: int, headers: Mapping[str, str]) -> None:
    """Send the status line and headers.

    Args:
        send: The ASGI send callable.
        status: The HTTP status.
        headers: Response headers.
    """
    await send({"type": "http.response.start", "status": status, "headers": _raw(headers)})


async def send_body(
    send: Send, status: int, body: bytes, content_type: str, headers: Mapping[str, str]
) -> None:
    """Send a complete response.

    Args:
        send: The ASGI send callable.
        status: The HTTP status.
        body: The body.
        content_type: Its media type.
        headers: Further headers.
    """
    all_headers = {**headers, "content-type": content_type, "content-length": str(len(body))}
    await send_start(send, status, all_headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, value: Any, headers: Mapping[str, str]) -> None:
    """Send a JSON response.

    Args:
        send: The ASGI send callable.
        status: The HTTP status.
        value: Anything JSON-able.
        headers: Further headers.
    """
    body = json.dumps(value, ensure_ascii=False).encode()
    await send_body(send, status, body, "application/json", headers)


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone away.

    Args:
        receive: The ASGI receive callable (the request body already read).
    """
    while (await receive())["type"] != "http.disconnect":
        await anyio.lowlevel.checkpoint()
