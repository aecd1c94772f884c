"""Who sends a call: its credential and the headers that travel upstream with it.

By default each call's own credential (``Authorization: Bearer ...`` or ``x-api-key``)
and its organisation and project headers go upstream with it: the gateway sends it
through a copy of its wrapped client made with them (``with_options``), and
``coalesce.wrap`` never puts calls sent with different credentials in one request. In
``--api-key`` mode the gateway holds the upstream keys: a client presents one of the
gateway's own keys, and calls of different client keys are kept apart by partition.

The credential itself is kept only inside the SDK client copy that sends with it;
:attr:`Caller.digest` (a SHA-256 of it) is what the gateway's own tables key on, and
no error message, log line or metric names either.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Caller", "Unauthorized", "bearer", "presented_key", "read_caller"]

#: OpenAI headers that are part of who sends (``with_options(organization=, project=)``).
_OPENAI_IDENTITY = {"openai-organization": "organization", "openai-project": "project"}


class Unauthorized(Exception):
    """A call without a credential, or (``--api-key`` mode) with a key the gateway does
    not accept. The message names what to send, never the key that was sent."""


@dataclass(frozen=True)
class Caller:
    """Who sends one call.

    Attributes:
        options: The ``with_options()`` arguments of the client copy that sends its calls
            (``api_key``, ``organization``, ``project``); empty: the gateway's own client.
        digest: A digest of who it is (its credential and identity headers): equal
            digests, same sender.
        partition: In ``--api-key`` mode, a digest of the client key the call presented
            (calls of different client keys never share a request); else ``None``.
    """

    options: Mapping[str, str] = field(repr=False)
    digest: str
    partition: str | None = None


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a call presents: its ``x-api-key``, else its bearer token."""
    return headers.get("x-api-key", "").strip() or bearer(headers)


def _digest(parts: Mapping[str, str]) -> str:
    text = json.dumps(dict(parts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read_caller(
    provider: str, headers: Mapping[str, str], gateway_keys: Sequence[str] = ()
) -> Caller:
    """Who sends a call to ``provider`` (``"openai"`` or ``"anthropic"``).

    Args:
        provider: Which API the call is for.
        headers: The request's headers (names in lower case).
        gateway_keys: ``--api-key`` mode's client keys; empty: pass-through mode.

    Raises:
        Unauthorized: No key was presented, or (``--api-key`` mode) not one of
            ``gateway_keys``.
    """
    key = presented_key(headers)
    header = "Authorization: Bearer <key>" + (" or x-api-key" if provider == "anthropic" else "")
    if key is None:
        raise Unauthorized(f"no API key: send {header}")
    identity: dict[str, Any] = {}
    if provider == "openai":
        identity = {
            option: headers[name] for name, option in _OPENAI_IDENTITY.items() if headers.get(name)
        }
    if not gateway_keys:
        options = {"api_key": key, **identity}
        return Caller(options, _digest(options))
    if not any(hmac.compare_digest(key.encode(), known.encode()) for known in gateway_keys):
        raise Unauthorized(
            f"this gateway does not accept the key sent; send {header} with one of its keys"
        )
    client = _digest({"client_key": key})
    return Caller(identity, _digest({**identity, "client_key": client}), partition=client)
