"""What an endpoint is given: one :class:`Call`, and the :class:`Simulation` behind it."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ._http import HttpError, json_response
from ._provider_state import ProviderState

__all__ = ["Call", "Handler", "Simulation"]


#: The provider as its endpoints see it: its configuration and state (the provider's
#: own class imports the app that serves it, so endpoints name its state instead).
Simulation = ProviderState


@dataclass(frozen=True)
class Call:
    """One request routed to an endpoint.

    Attributes:
        sim: The provider.
        request: Starlette's request (its path parameters, query, headers, form).
        body: The request's body, fully read.
    """

    sim: Simulation
    request: Request
    body: bytes

    def json_object(self) -> dict[str, Any]:
        """Return the body as a JSON object.

        Raises:
            HttpError: The body is not JSON, or not an object.
        """
        try:
            value = json.loads(self.body or b"null")
        except ValueError as exc:
            raise HttpError(400, f"the request body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "the request body must be a JSON object")
        return value

    @property
    def api_key(self) -> str:
        """The bearer token, or else the ``x-api-key`` header, or ``""``."""
        headers = self.request.headers
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return headers.get("x-api-key", "")

    @property
    def base_url(self) -> str:
        """Scheme and host the client used, e.g. ``http://127.0.0.1:8000``."""
        return str(self.request.base_url).rstrip("/")

    @property
    def id(self) -> str:
        """The path's ``{id}`` (a file or batch id)."""
        value: str = self.request.path_params["id"]
        return value

    @property
    def query(self) -> Mapping[str, str]:
        """The query parameters (the last one of a name wins)."""
        return self.request.query_params

    def reply(self, value: Any) -> Response:
        """Answer ``200`` with ``value`` as JSON."""
        return json_response(value)


Handler = Callable[[Call], Awaitable[Response]]
