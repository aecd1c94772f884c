"""What travels between members: a forwarded call, its reply, and their subjects. Pure.

A forwarded call is one JSON object: the API it is for, the caller's request headers
(its credential among them), its body, its remaining budget in seconds (relative, so
that members' clocks need not agree) and its partition's key. It travels only as the
payload of a NATS request on the member connection: a subject names a member and what
it is asked, never a caller, a model or a credential (:func:`call_subject`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PREFIX",
    "Forwarded",
    "Reply",
    "call_subject",
    "decode_call",
    "decode_reply",
    "encode_call",
    "encode_reply",
    "member_token",
    "ping_subject",
]

#: Every fleet subject starts with it.
PREFIX = "coalesce.fleet"
_VERSION = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Forwarded:
    """One call sent to its partition's owner.

    Attributes:
        api: The route's API (``"openai.chat"``, ...).
        headers: The caller's request headers (its credential among them).
        body: The request body, as the caller sent it.
        remaining: Its remaining budget in seconds when sent (``None``: no budget).
        partition: Its partition's key (:func:`~.decide.partition_key`).
    """

    api: str
    headers: Headers
    body: bytes
    remaining: float | None
    partition: str

    def __repr__(self) -> str:  # never the headers: the credential is among them
        return f"Forwarded(api={self.api!r}, partition={self.partition!r})"


@dataclass(frozen=True)
class Reply:
    """The owner's answer to one forwarded call: the HTTP reply its caller gets."""

    status: int
    headers: Headers
    body: bytes


def member_token(text: str) -> str:
    """``text`` as one token of a subject (letters, digits, ``-`` and ``_``)."""
    return _UNSAFE.sub("-", text)[:64] or "member"


def call_subject(member: str) -> str:
    """The subject ``member`` answers forwarded calls on."""
    return f"{PREFIX}.{member}.call"


def ping_subject(member: str) -> str:
    """The subject ``member`` answers pings on."""
    return f"{PREFIX}.{member}.ping"


def _headers(value: Any) -> Headers:
    pairs: Sequence[Any] = value if isinstance(value, list) else []
    return tuple((str(name), str(text)) for name, text in pairs)


def encode_call(call: Forwarded) -> bytes:
    """``call`` as a NATS payload."""
    data = {
        "v": _VERSION,
        "api": call.api,
        "headers": [list(pair) for pair in call.headers],
        "body": base64.b64encode(call.body).decode("ascii"),
        "remaining": call.remaining,
        "partition": call.partition,
    }
    return json.dumps(data, separators=(",", ":")).encode()


def decode_call(payload: bytes) -> Forwarded:
    """The call in ``payload``.

    Raises:
        ValueError: It is not a forwarded call of this version.
    """
    data = json.loads(payload)
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        raise ValueError("not a forwarded call of this version")
    remaining = data.get("remaining")
    return Forwarded(
        api=str(data["api"]),
        headers=_headers(data.get("headers")),
        body=base64.b64decode(data.get("body", "")),
        remaining=None if remaining is None else float(remaining),
        partition=str(data.get("partition", "")),
    )


def encode_reply(reply: Reply) -> bytes:
    """``reply`` as a NATS payload."""
    data = {
        "v": _VERSION,
        "status": reply.status,
        "headers": [list(pair) for pair in reply.headers],
        "body": base64.b64encode(reply.body).decode("ascii"),
    }
    return json.dumps(data, separators=(",", ":")).encode()


def decode_reply(payload: bytes) -> Reply:
    """The reply in ``payload``.

    Raises:
        ValueError: It is not a reply of this version.
    """
    data = json.loads(payload)
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        raise ValueError("not a fleet reply of this version")
    return Reply(int(data["status"]), _headers(data.get("headers")), base64.b64decode(data["body"]))
