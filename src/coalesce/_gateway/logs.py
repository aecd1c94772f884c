"""The gateway's log: one structured line per upstream request, at INFO.

Each line is a JSON object on the ``coalesce.gateway`` logger (its fields are also on
the record, as ``record.gateway``, for handlers that ship structured logs). What goes
in is chosen field by field: the provider, the model, the lane, how many calls the
request carried, how it ended (a status or an error's type, never its message, which
may quote what the provider was sent), its duration, tokens and ids. Credentials,
headers, query strings and bodies are never among them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["configure", "label", "log_upstream", "logger"]

logger = logging.getLogger("coalesce.gateway")

#: What a model name (or any value from a request) may look like to be shown as it is.
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,79}")


def label(value: Any) -> str:
    """``value`` as it may appear in a log line or a metric label: a short name of
    plain characters as it is, anything else ``"other"`` (a request's fields are
    the client's to fill, and a label must not become what it put there)."""
    return value if isinstance(value, str) and _PLAIN.fullmatch(value) else "other"


def log_upstream(fields: Mapping[str, Any]) -> None:
    """Log one upstream request at INFO, its ``fields`` as one JSON object.

    Args:
        fields: The request's fields (``None`` values are left out).
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    shown = {name: value for name, value in fields.items() if value is not None}
    text = json.dumps(shown, separators=(",", ":"), default=str)
    logger.info("upstream request %s", text, extra={"gateway": shown})


def configure(level: str) -> None:
    """Send the gateway's lines (and coalesce's, uvicorn's and warnings) to stderr at
    ``level``. The HTTP clients' own request lines stay out below WARNING: they
    quote whole URLs, query strings included, where a client may have put a key."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    logging.captureWarnings(True)
    for name in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
