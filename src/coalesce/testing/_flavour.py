"""What the two APIs share: the :class:`Flavour` protocol and error replies.

The OpenAI and Anthropic flavours (``_openai``, ``_anthropic``) implement the
protocol; the endpoints only ever talk to a :class:`Flavour`. Every error the
simulator answers, whatever its cause, is built here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from starlette.responses import Response

from ._engine import Answer, Prompt, ReplyContext
from ._faults import FAULT_STATUS, Fault
from ._http import json_response
from ._ratelimit import RateDecision

__all__ = ["Flavour", "StreamEvent", "error_body", "error_response", "fault_error"]

#: One server-sent event: (event name, data, weight). The weight is the event's share
#: of the decoding time (its text length); 0 for events that carry no text.
StreamEvent = tuple["str | None", dict[str, Any], int]


class Flavour(Protocol):
    """What differs between the OpenAI and Anthropic APIs."""

    api: str
    id_prefix: str
    request_id_header: str
    done: bytes

    def parse(self, body: Mapping[str, Any]) -> Prompt: ...
    def render(self, answer: Answer, ctx: ReplyContext) -> dict[str, Any]: ...
    def stream(self, answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]: ...
    def error(self, status: int, message: str, kind: str) -> dict[str, Any]: ...
    def error_kind(self, status: int) -> str: ...
    def rate_headers(self, decision: RateDecision, unix_now: float) -> dict[str, str]: ...
    def sse(self, event: str | None, data: dict[str, Any]) -> bytes: ...


def error_body(flavour: Flavour, status: int, message: str) -> dict[str, Any]:
    """Return the body of an error answer in the flavour's shape."""
    return flavour.error(status, message, flavour.error_kind(status))


def fault_error(flavour: Flavour, fault: Fault) -> tuple[int, dict[str, Any]]:
    """Return the status and body a fault answers with (``500`` for faults without a status
    of their own: a batch line that hangs or drops)."""
    status = FAULT_STATUS.get(fault, 500)
    return status, error_body(flavour, status, f"simulated fault: {fault.value}")


def error_response(
    flavour: Flavour, status: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """Return an error answer in the flavour's shape."""
    return json_response(error_body(flavour, status, message), status, headers)
