"""Reading the providers' rate-limit headers into quotas. Pure: no clock, no I/O.

OpenAI (and compatible servers) send ``x-ratelimit-{remaining,limit,reset}-{requests,
tokens}``, Anthropic ``anthropic-ratelimit-{requests,tokens}-{remaining,limit,reset}``.
Providers read them off each reply (:attr:`~coalesce.providers.Completion.quota`) and
each refusal (:attr:`~coalesce.providers.RetryAdvice.quota`); the planner only reads
the parsed :class:`RateLimitState`.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Quota", "RateLimitState", "parse_go_duration", "parse_rate_limit_headers"]


@dataclass(frozen=True, slots=True)
class Quota:
    """One rate-limit quota as the provider last reported it.

    Attributes:
        remaining: Units (requests or tokens) left before the provider refuses.
        reset_at: When the quota is full again, on the caller's clock (``now``'s), or
            ``None`` if the provider did not say.
        limit: The quota's size, if reported.
    """

    remaining: int
    reset_at: float | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class RateLimitState:
    """The request and token quotas of one API key and model, ``None`` if unreported."""

    requests: Quota | None = None
    tokens: Quota | None = None


_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|h|m|s)")
_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5
    "μs": 1e-6,  # U+03BC
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(text: str) -> float | None:
    """Return the seconds of a Go duration (``"20ms"``, ``"1.5s"``, ``"6m0s"``), or ``None``.

    A bare number counts as seconds (some OpenAI-compatible servers send one).

    Args:
        text: The header value.
    """
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        if not text or _GO_PART.sub("", text):  # empty, or something besides parts
            return None
        seconds = sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_PART.findall(text))
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _rfc3339_seconds(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (``Z`` or an offset), or None."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:  # RFC 3339 requires an offset; assume UTC if missing
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _http_date_seconds(text: str | None) -> float | None:
    """Seconds since the epoch of an HTTP ``date`` header, or ``None``."""
    if text is None:
        return None
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(float(text.strip()))
    except (ValueError, OverflowError):
        return None
    return value if value >= 0 else None


def _quota(
    remaining: str | None, limit: str | None, reset_in: float | None, now: float
) -> Quota | None:
    """A quota from header values; ``None`` without a readable ``remaining``."""
    count = _int(remaining)
    if count is None:
        return None
    reset_at = None if reset_in is None else now + max(0.0, reset_in)
    return Quota(count, reset_at, _int(limit))


def parse_rate_limit_headers(
    headers: Mapping[str, str], now: float, *, unix_now: float | None = None
) -> RateLimitState:
    """Read the rate-limit state from a response's headers; never raises.

    OpenAI (and compatible servers) send ``x-ratelimit-{remaining,limit,reset}-{requests,
    tokens}``, the reset as a Go duration (``"1s"``, ``"6m0s"``, ``"20ms"``). Anthropic
    sends ``anthropic-ratelimit-{requests,tokens}-{remaining,limit,reset}``, the reset as
    an RFC 3339 timestamp, converted with ``unix_now`` (the wall-clock time of the
    response) or, without it, the response's ``date`` header. Unreadable values count as
    missing.

    Args:
        headers: Response headers (names in any case).
        now: The caller's current time; reset times are expressed on this clock.
        unix_now: Seconds since the epoch when the response arrived, for Anthropic.
    """
    lower = {name.lower(): value for name, value in headers.items()}
    if unix_now is None:
        unix_now = _http_date_seconds(lower.get("date"))
    quotas: dict[str, Quota | None] = {}
    for kind in ("requests", "tokens"):
        if f"x-ratelimit-remaining-{kind}" in lower:
            reset = lower.get(f"x-ratelimit-reset-{kind}")
            quotas[kind] = _quota(
                lower[f"x-ratelimit-remaining-{kind}"],
                lower.get(f"x-ratelimit-limit-{kind}"),
                None if reset is None else parse_go_duration(reset),
                now,
            )
        else:
            prefix = f"anthropic-ratelimit-{kind}"
            reset = lower.get(f"{prefix}-reset")
            at = None if reset is None else _rfc3339_seconds(reset)
            quotas[kind] = _quota(
                lower.get(f"{prefix}-remaining"),
                lower.get(f"{prefix}-limit"),
                None if at is None or unix_now is None else at - unix_now,
                now,
            )
    return RateLimitState(quotas["requests"], quotas["tokens"])
