"""How a member reaches NATS: the fleet's settings, their check, and nats-py's connect
arguments (authentication and TLS passed through).

Importing this module imports nothing of nats-py; :func:`connect_options` builds plain
arguments, and the member imports ``nats`` only when a fleet is configured.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .._exceptions import ConfigurationError

__all__ = ["SCHEMES", "FleetSettings", "check_url", "connect_options", "shown_url"]

#: The URL schemes a fleet may be given (nats-py's; ``tls://`` asks for TLS).
SCHEMES = ("nats", "tls", "ws", "wss")
#: Seconds between two attempts to reach NATS while it is down.
RECONNECT_WAIT = 0.5


@dataclass(frozen=True)
class FleetSettings:
    """Where a member joins its fleet, and how it proves who it is.

    Attributes:
        url: The NATS server(s), comma-separated (``nats://user:password@host:4222``:
            the user and password are passed to NATS, never shown).
        creds: A NATS credentials file (a user JWT and its seed), if any.
        tls_ca: A CA bundle to verify the server with (and TLS asked for), if any.
        name: The member's name, shown in logs and metrics (default: its host and pid).
    """

    url: str
    creds: Path | None = None
    tls_ca: Path | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        check_url(self.url)
        for option, path in (("fleet_creds", self.creds), ("fleet_tls_ca", self.tls_ca)):
            if path is not None and not Path(path).is_file():
                raise ConfigurationError(
                    f"{option}: no file at {str(path)!r}; give a readable file"
                )

    def __repr__(self) -> str:
        return f"FleetSettings(url={shown_url(self.url)!r}, name={self.name!r})"


def _servers(url: str) -> list[str]:
    return [part.strip() for part in url.split(",") if part.strip()]


def check_url(url: str) -> None:
    """Refuse a fleet URL nats-py cannot use, naming what is wrong (never its password).

    Raises:
        ConfigurationError: Not a ``nats://``, ``tls://``, ``ws://`` or ``wss://`` URL
            with a host.
    """
    servers = _servers(url) if isinstance(url, str) else []
    if not servers:
        raise ConfigurationError("fleet must be a NATS URL such as nats://127.0.0.1:4222")
    for server in servers:
        parts = urlsplit(server)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ConfigurationError(
                f"fleet must be a NATS URL such as nats://127.0.0.1:4222 (schemes"
                f" {', '.join(SCHEMES)}), got {shown_url(server)!r}"
            )


def shown_url(url: str) -> str:
    """``url`` as a log line may show it: any user and password replaced by ``***``."""
    shown = []
    for server in _servers(url):
        parts = urlsplit(server)
        if parts.username is not None or parts.password is not None:
            host = parts.hostname or ""
            netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
            parts = parts._replace(netloc=netloc)
        shown.append(urlunsplit(parts))
    return ",".join(shown)


def connect_options(settings: FleetSettings) -> dict[str, Any]:
    """nats-py ``connect()``'s keyword arguments for ``settings``: reconnect forever,
    quickly (a member coalesces locally meanwhile), with the credentials and TLS given."""
    options: dict[str, Any] = {
        "servers": _servers(settings.url),
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": RECONNECT_WAIT,
        "connect_timeout": 2,
        # A dead server is noticed within seconds, not the default two minutes.
        "ping_interval": 5,
        "max_outstanding_pings": 2,
    }
    if settings.name:
        options["name"] = settings.name
    if settings.creds is not None:
        options["user_credentials"] = str(settings.creds)
    if settings.tls_ca is not None:
        options["tls"] = ssl.create_default_context(cafile=str(settings.tls_ca))
    return options
