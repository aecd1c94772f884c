"""What an endpoint is given: one :class:`Call`, and the :class:`Simulation` behind it.

Endpoints are typed against the :class:`Simulation` protocol rather than the provider
class, so the provider can import the app that serves it and nothing imports back.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ._accounting import Ledger
from ._asgi import HttpRequest, Receive, Send, send_json
from ._batches import BatchStore
from ._cache_store import PromptCacheStore
from ._clock import Clock
from ._context import ContextWindows
from ._degradation import PackingDegradation
from ._faults import FaultPlan, FaultSource
from ._flex import FlexSource
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
        request: The request, fully read.
        match: The route's match of the path (``match["id"]``, ...).
        receive: The ASGI receive callable (to notice a client going away).
        send: The ASGI send callable.
    """

    sim: Simulation
    request: HttpRequest
    match: re.Match[str]
    receive: Receive
    send: Send

    async def reply(self, value: Any) -> None:
        """Answer ``200`` with ``value`` as JSON.

        Args:
            value: Anything JSON-able.
        """
        await send_json(self.send, 200, value, {})


Handler = Callable[[Call], Awaitable[None]]
