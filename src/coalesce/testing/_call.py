"""What an endpoint is given: one :class:`Call`, and the :class:`Simulation` behind it.

Endpoints are typed against the :class:`Simulation` protocol rather than the provider
class, so the provider can import the app that serves it and nothing imports back.
"""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from ._accounting import Ledger
from ._batches import BatchStore
from ._cache_store import PromptCacheStore
from ._clock import Clock
from ._context import ContextWindows
from ._degradation import PackingDegradation
from ._faults import FaultPlan, FaultSource
from ._flex import FlexSource
from ._http import HttpError, json_response
from ._latency import SimulatedLatency
from ._length import OutputTokens
from ._ratelimit import RateLimiter

__all__ = ["Call", "Handler", "Simulation"]


class Simulation(Protocol):
    """The provider as its endpoints see it: configuration and state."""

    clock: Clock
    ledger: Ledger
    limiter: RateLimiter
    faults: FaultSource
    fault_plan: FaultPlan
    batches: BatchStore
    latency: SimulatedLatency
    output_tokens: OutputTokens
    jitter_rng: random.Random
    time_scale: float
    context_window: ContextWindows
    output_limit: ContextWindows
    prompt_cache: PromptCacheStore
    flex: FlexSource
    enqueued_token_limit: ContextWindows
    degradation: PackingDegradation | None

    def next_id(self, prefix: str) -> str: ...
    def unique_id(self, prefix: str) -> str: ...
    def reset(self) -> None: ...


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
        """Answer ``200`` with ``value`` as JSON.

        Args:
            value: Anything JSON-able.
        """
        return json_response(value)


Handler = Callable[[Call], Awaitable[Response]]
