"""What one running gateway holds: its settings, its metrics, its upstream clients."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._fleet import Member
from .config import GatewayConfig
from .metrics import GatewayMetrics
from .upstream import Upstreams

__all__ = ["GatewayState"]


@dataclass
class GatewayState:
    """One gateway's state, shared by its routes.

    Attributes:
        config: Its settings.
        metrics: Its metrics.
        upstreams: Its upstream clients, from startup to shutdown (else ``None``).
        draining: Set when it was told to stop: ``/readyz`` then answers 503.
        member: Its membership of a fleet (``--fleet``), from startup to shutdown.
    """

    config: GatewayConfig
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    upstreams: Upstreams | None = None
    draining: bool = False
    member: Member | None = None

    @property
    def ready(self) -> bool:
        """Whether it takes calls: started, and not stopping."""
        return self.upstreams is not None and not self.draining
