"""Rate limits per API key: requests per minute and tokens per minute.

Each limit is a bucket that refills continuously (the whole limit per window), as
the providers describe theirs. The bucket arithmetic is pure; :class:`RateLimiter`
keeps one pair of buckets per key. Times come from the caller
(``anyio.current_time()`` in the app, so virtual time works).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from coalesce.exceptions import ConfigurationError

__all__ = [
    "Bucket",
    "Quota",
    "RateDecision",
    "RateLimit",
    "RateLimiter",
    "RateLimits",
    "anthropic_headers",
    "go_duration",
    "openai_headers",
    "refill",
    "retry_headers",
    "seconds_until",
]


@dataclass(frozen=True)
class RateLimit:
    """The limits of one API key (``None``: unlimited).

    Attributes:
        requests_per_minute: Requests allowed per window.
        tokens_per_minute: Prompt plus completion tokens allowed per window.
    """

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigurationError(f"rate limit {name} must be > 0 or None, got {value}")


@dataclass(frozen=True)
class RateLimits:
    """Rate limits: a default for every key, and overrides per key.

    Attributes:
        default: The limits of any key not in ``keys``.
        keys: Limits per API key (the bearer token or ``x-api-key``).
    """

    default: RateLimit = field(default_factory=RateLimit)
    keys: Mapping[str, RateLimit] = field(default_factory=dict)


class Bucket(NamedTuple):
    """Capacity left at ``updated`` (seconds of the caller's clock)."""

    level: float
    updated: float


class Quota(NamedTuple):
    """One limit as the headers report it (``limit`` is ``None`` if unlimited)."""

    limit: int | None
    remaining: int
    reset: float


class RateDecision(NamedTuple):
    """The outcome of one request against its key's limits.

    Attributes:
        allowed: Whether the request goes through (it has then been charged).
        retry_after: Seconds until it would go through (0 when allowed).
        requests: The requests quota after the decision.
        tokens: The tokens quota after the decision.
    """

    allowed: bool
    retry_after: float
    requests: Quota
    tokens: Quota


def refill(bucket: Bucket, capacity: float, window: float, now: float) -> Bucket:
    """Return the bucket at ``now``, refilled at ``capacity`` per ``window`` seconds."""
    level = min(capacity, bucket.level + max(0.0, now - bucket.updated) * capacity / window)
    return Bucket(level, now)


def seconds_until(bucket: Bucket, capacity: float, window: float, cost: float) -> float:
    """Return the seconds until the bucket (refilled to now) holds ``cost`` (``inf`` if it
    never can)."""
    if cost > capacity:
        return math.inf
    return max(0.0, (cost - bucket.level) * window / capacity)


class RateLimiter:
    """Per-key buckets for requests and tokens."""

    def __init__(self, limits: RateLimits, window: float) -> None:
        self.limits = limits
        self.window = window
        self._buckets: dict[tuple[str, str], Bucket] = {}

    def reset(self) -> None:
        """Forget every bucket: each key starts full again."""
        self._buckets.clear()

    def check(self, key: str, tokens: int, now: float) -> RateDecision:
        """Charge one request of ``tokens`` (prompt plus completion) to the API ``key`` if
        its limits allow it at ``now``."""
        limit = self.limits.keys.get(key, self.limits.default)
        costs = {
            "requests": (limit.requests_per_minute, 1),
            "tokens": (limit.tokens_per_minute, tokens),
        }
        buckets: dict[str, Bucket] = {}
        wait = 0.0
        for kind, (capacity, cost) in costs.items():
            if capacity is None:
                continue
            bucket = self._buckets.get((key, kind), Bucket(float(capacity), now))
            buckets[kind] = refill(bucket, capacity, self.window, now)
            wait = max(wait, seconds_until(buckets[kind], capacity, self.window, cost))
        allowed = wait <= 0.0
        if allowed:
            for kind, bucket in buckets.items():
                buckets[kind] = Bucket(bucket.level - costs[kind][1], now)
        self._buckets.update({(key, kind): b for kind, b in buckets.items()})
        quotas = {kind: self._quota(buckets.get(kind), costs[kind][0]) for kind in costs}
        return RateDecision(allowed, wait, quotas["requests"], quotas["tokens"])

    def _quota(self, bucket: Bucket | None, capacity: int | None) -> Quota:
        if bucket is None or capacity is None:
            return Quota(None, 0, 0.0)
        reset = (capacity - bucket.level) * self.window / capacity
        return Quota(capacity, max(0, math.floor(bucket.level)), reset)


def go_duration(seconds: float) -> str:
    """Format a duration as OpenAI's reset headers do (``"20ms"``, ``"1.5s"``, ``"6m0s"``)."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def openai_headers(decision: RateDecision) -> dict[str, str]:
    """Return OpenAI's ``x-ratelimit-*`` headers for a decision."""
    headers = {}
    for kind, quota in (("requests", decision.requests), ("tokens", decision.tokens)):
        if quota.limit is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(quota.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(quota.remaining)
            headers[f"x-ratelimit-reset-{kind}"] = go_duration(quota.reset)
    return headers


def anthropic_headers(decision: RateDecision, unix_now: float) -> dict[str, str]:
    """Return Anthropic's ``anthropic-ratelimit-*`` headers for a decision, the reset
    timestamps counted from the wall-clock ``unix_now``."""
    headers = {}
    for kind, quota in (("requests", decision.requests), ("tokens", decision.tokens)):
        if quota.limit is not None:
            reset = datetime.datetime.fromtimestamp(unix_now + quota.reset, datetime.timezone.utc)
            headers[f"anthropic-ratelimit-{kind}-limit"] = str(quota.limit)
            headers[f"anthropic-ratelimit-{kind}-remaining"] = str(quota.remaining)
            headers[f"anthropic-ratelimit-{kind}-reset"] = reset.isoformat(
                timespec="seconds"
            ).replace("+00:00", "Z")
    return headers


def retry_headers(seconds: float) -> dict[str, str]:
    """Return ``retry-after`` (whole seconds, rounded up) and ``retry-after-ms``."""
    finite = seconds if math.isfinite(seconds) else 60.0
    return {
        "retry-after": str(max(1, math.ceil(finite))),
        "retry-after-ms": str(math.ceil(finite * 1000)),
    }
