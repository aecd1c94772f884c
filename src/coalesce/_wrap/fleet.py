"""``fleet=`` on ``wrap`` and ``prompt``: the calls go through a fleet's gateway in
this process (``coalesce._gateway.sidecar``, the layer above, which registers itself
here when coalesce is imported), so they coalesce with every process of the fleet."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._exceptions import ConfigurationError

__all__ = ["FleetClient", "register", "through_fleet"]

#: ``maker(client, given, surface)``: ``client``'s copy whose calls go through the fleet
#: ``given`` (the keywords of ``surface``, ``"wrap"`` or ``"prompt"``) names.
FleetClient = Callable[[Any, Mapping[str, Any], str], Any]
_makers: list[FleetClient] = []


def register(maker: FleetClient) -> None:
    """Make ``fleet=`` copy clients with ``maker``."""
    _makers[:] = [maker]


def through_fleet(client: Any, given: Mapping[str, Any], surface: str) -> Any:
    """``client``'s copy whose calls go through the fleet ``given`` names.

    Raises:
        ConfigurationError: The client or an option cannot go through a fleet.
    """
    if not _makers:  # pragma: no cover - coalesce's own import registers it
        raise ConfigurationError("fleet= needs coalesce's gateway: import coalesce first")
    return _makers[0](client, given, surface)
