"""Which calls may share a request as far as the client is concerned: a digest of
what the client sends with every call (credentials, base URL, default headers).

Copies of a wrapped client (``with_options()``, ``copy()``) share its engines; a copy
that sends with other credentials, to another URL or with other default headers gets
engines, and a provider, of its own, so its calls never ride in a request sent with
someone else's key.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["credentials_key"]

#: The SDK clients' public attributes that change what a request is sent with or to.
_FIELDS = ("base_url", "api_key", "auth_token", "organization", "project", "default_query")


def _headers(client: Any) -> dict[str, str]:
    """The client's default headers, without the SDK's own ``X-Stainless-*`` ones (they
    name the running event loop, not the sender) and without omitted ones."""
    headers = getattr(client, "default_headers", None)
    if not isinstance(headers, Mapping):
        return {}
    return {
        str(name).lower(): value
        for name, value in headers.items()
        if isinstance(value, str) and not str(name).lower().startswith("x-stainless")
    }


def _field(client: Any, name: str) -> Any:
    """``client.<name>`` as text, a mapping or ``None``; ``None`` where the SDK has a
    resource of that name (Anthropic's ``organization``) rather than an option."""
    if isinstance(getattr(type(client), name, None), functools.cached_property):
        return None
    value = getattr(client, name, None)
    if value is None or isinstance(value, (str, Mapping)):
        return value
    return str(value) if name == "base_url" else repr(value)


def credentials_key(client: Any) -> str:
    """A digest of what ``client`` sends with every request: its type, base URL,
    credentials (API key, auth token, organization, project), default headers and
    default query. Two clients with equal keys may share requests.

    Args:
        client: An SDK client (``openai.AsyncOpenAI``, ``anthropic.AsyncAnthropic``).
    """
    parts = {name: _field(client, name) for name in _FIELDS}
    parts["headers"] = _headers(client)
    parts["type"] = f"{type(client).__module__}.{type(client).__qualname__}"
    text = json.dumps(parts, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
