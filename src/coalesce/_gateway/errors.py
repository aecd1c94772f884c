"""Errors as each provider shapes them, and what each failure of a call becomes.

An upstream's own error (the SDK's ``APIStatusError``, which ``coalesce.wrap`` hands
every caller of the request it broke) reaches the client as the upstream sent it: its
status, its body, its rate-limit and request-id headers. What the gateway itself
refuses or cannot do gets that provider's own shape: OpenAI's ``{"error": {"message",
"type", "param", "code"}}``, Anthropic's ``{"type": "error", "error": {"type",
"message"}}``, with the status that says who is at fault (400 a malformed call, 401 a
missing or refused key, 413 a body over the gateway's limit, 502 an upstream that failed, 504 one that did not answer in
time, 503 a gateway that is stopping).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anthropic
import openai
from starlette.responses import JSONResponse, Response

from .._exceptions import (
    BatcherClosedError,
    ConfigurationError,
    InvalidInputError,
    ItemError,
    RequestTimeoutError,
)

__all__ = ["error_body", "error_response", "failure_response", "reply_headers_of"]

logger = logging.getLogger("coalesce.gateway")

_ANTHROPIC_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_STATUS_ERRORS = (openai.APIStatusError, anthropic.APIStatusError)
_TIMEOUTS = (openai.APITimeoutError, anthropic.APITimeoutError, RequestTimeoutError)
_UNREACHABLE = (openai.APIConnectionError, anthropic.APIConnectionError)
#: Response headers that never pass from one hop to the next, or that the gateway's own
#: server writes anew (the body may have been decoded on the way).
_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "content-length", "content-encoding",
        "date", "server",
    }
)  # fmt: skip


def error_body(provider: str, status: int, message: str) -> dict[str, Any]:
    """The body of an error the gateway itself returns, in ``provider``'s shape."""
    if provider == "anthropic":
        kind = _ANTHROPIC_KINDS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = "server_error" if status >= 500 else "invalid_request_error"
    code = {401: "invalid_api_key"}.get(status)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_response(provider: str, status: int, message: str) -> Response:
    """The gateway's own error, in ``provider``'s shape."""
    return JSONResponse(error_body(provider, status, message), status_code=status)


def reply_headers_of(headers: Mapping[str, str]) -> dict[str, str]:
    """An upstream response's headers as the gateway passes them on (without the
    hop-by-hop ones and those its server writes itself)."""
    return {name: value for name, value in headers.items() if name.lower() not in _HOP}


def failure_response(provider: str, exc: Exception) -> Response:
    """What a call that raised ``exc`` gets (see the module doc).

    Args:
        provider: The API the call was for.
        exc: What the SDK call raised.
    """
    if isinstance(exc, _STATUS_ERRORS):
        response = exc.response  # the upstream's own status, body and headers
        return Response(response.content, exc.status_code, reply_headers_of(response.headers))
    status, message = _status_of(exc)
    if status == 500:
        logger.error("a call failed inside the gateway: %s", type(exc).__name__, exc_info=exc)
    return error_response(provider, status, message)


def _status_of(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, (ConfigurationError, InvalidInputError)):
        return 400, str(exc)
    if isinstance(exc, _TIMEOUTS):
        return 504, f"the upstream did not answer in time: {exc}"
    if isinstance(exc, _UNREACHABLE):
        return 502, "the gateway could not reach the upstream; try again"
    if isinstance(exc, ItemError):
        return 502, f"the upstream gave no valid answer to this call: {exc}"
    if isinstance(exc, BatcherClosedError):
        return 503, "the gateway is shutting down; send the call to another replica or retry"
    return 500, f"the gateway failed to answer this call ({type(exc).__name__}); see its log"
