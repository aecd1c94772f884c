"""The fleet's decisions, each a pure function of explicit state and ``now``.

* :func:`partition_key`: the lease key of a partition (a digest: safe in a subject and
  a key-value key, and no credential can be read back from it);
* :func:`route`: where a call goes: answered here (this member owns its partition, or
  NATS is down), forwarded to the lease holder, or first a claim of the lease;
* :func:`stale`: whether a member's view of a lease is old enough to read again;
* :func:`renew_due`, :func:`idle`: when an owner renews a lease, when it lets one go;
* :func:`forwarded_budget`, :func:`forward_timeout`: the budget a forwarded call carries
  to its owner (the caller's own remaining seconds, less the hop) and how long the
  forwarder waits for the owner's reply before it answers the call itself;
* :func:`late`: whether a call taken back goes upstream alone, at once;
* :func:`silent`: whether a holder with calls in flight has stopped answering pings.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

__all__ = [
    "GRACE",
    "HOP",
    "LATE_SHARE",
    "LEASE_TTL",
    "PING_INTERVAL",
    "PING_TIMEOUT",
    "RELEASE_AFTER",
    "LeaseView",
    "Route",
    "forward_timeout",
    "forwarded_budget",
    "idle",
    "late",
    "partition_key",
    "renew_due",
    "route",
    "silent",
    "stale",
]

#: Seconds a lease lives unless renewed (the key-value bucket's TTL). An owner renews
#: at a third of it, so two renewals may fail before the lease lapses. A dead owner's
#: partitions are taken over sooner than this: see :func:`silent`.
LEASE_TTL = 2.0
#: Seconds between two pings of a holder that has calls of this member in flight.
PING_INTERVAL = 0.05
#: Seconds a ping may take before it counts as unanswered (NATS request/reply on one
#: machine: p99 under a millisecond; a busy owner's event loop on a loaded machine:
#: hundreds of ms, which must not pass for silence).
PING_TIMEOUT = 1.0
#: Unanswered pings in a row after which a holder is silent. A dead owner is found
#: sooner: NATS answers "no responders" to the first ping after its connection closed.
SILENT_AFTER = 3
#: Seconds without a call after which an owner lets its lease go.
RELEASE_AFTER = 30.0
#: Seconds a forwarded call's budget is cut by for the hop to its owner and back
#: (measured: request/reply p99 0.76 ms; the rest is room for a loaded event loop).
HOP = 0.02
#: The least share of its budget a forwarded or taken-back call is given (see
#: :func:`forwarded_budget`).
LATE_SHARE = 0.5
#: Seconds past its budget a forwarder still waits for the owner's reply before it
#: answers the call itself: the owner then still answers faster than a call begun anew.
GRACE = 0.5


class Route(enum.Enum):
    """Where one call goes."""

    #: Answered by this member's own engine: it owns the partition.
    OWN = "own"
    #: Answered here because the fleet cannot be reached (coalesced locally).
    FALLBACK = "fallback"
    #: The lease is free (or unknown): claim it, then route again.
    CLAIM = "claim"
    #: Sent to the lease's holder.
    FORWARD = "forward"


@dataclass(frozen=True)
class LeaseView:
    """What a member knows of one partition's lease.

    Attributes:
        holder: The member that holds it.
        revision: The key-value revision it was read at (a takeover compares it).
        seen: When it was read (``anyio.current_time()``).
    """

    holder: str
    revision: int
    seen: float


def partition_key(*parts: str) -> str:
    """The lease key of the partition named by ``parts`` (the API, the model, a digest of
    who sends, ...): 32 hex digits of their SHA-256."""
    text = "\x1f".join(parts)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def route(view: LeaseView | None, me: str, *, connected: bool) -> Route:
    """Where a call goes, given this member's view of its partition's lease.

    Args:
        view: The lease as last read (``None``: none known).
        me: This member's id.
        connected: Whether this member is connected to NATS.
    """
    if not connected:
        return Route.FALLBACK
    if view is None:
        return Route.CLAIM
    return Route.OWN if view.holder == me else Route.FORWARD


def stale(view: LeaseView, now: float, ttl: float = LEASE_TTL) -> bool:
    """Whether a forwarder reads a lease again before using it: after a TTL, the holder
    may have changed without any call failing (a handover during a NATS blip)."""
    return now - view.seen >= ttl


def renew_due(renewed: float, now: float, ttl: float = LEASE_TTL) -> bool:
    """Whether an owner renews a lease it last renewed at ``renewed``: at a third of its
    TTL."""
    return now - renewed >= ttl / 3


def idle(last_call: float, now: float, after: float = RELEASE_AFTER) -> bool:
    """Whether an owner lets a lease go: no call of its partition for ``after`` seconds."""
    return now - last_call >= after


def forwarded_budget(budget: float | None, elapsed: float, hop: float = HOP) -> float | None:
    """The budget a forwarded (or taken-back) call carries: what is left of the caller's
    ``budget`` after ``elapsed`` seconds, less the hop, so that the owner's planner sizes
    its window from the caller's own deadline (``None``: the call has no budget).

    Never less than :data:`LATE_SHARE` of the budget: the engine also bounds a call's
    request by its budget, and a call with milliseconds left would fail where it can
    still be answered, late."""
    if budget is None:
        return None
    return max(budget - elapsed - hop, budget * LATE_SHARE)


def late(budget: float | None, elapsed: float) -> bool:
    """Whether a call has less than :data:`LATE_SHARE` of its budget left: taken back
    from an owner that died with it, it goes upstream alone at once (waiting for company,
    or being forwarded again, would make it later still)."""
    return budget is not None and budget - elapsed < budget * LATE_SHARE


def forward_timeout(sent: float | None, ceiling: float, grace: float = GRACE) -> float:
    """Seconds a forwarder waits for the owner's reply to a call sent with the budget
    ``sent`` (:func:`forwarded_budget`): that budget and :data:`GRACE`, at most
    ``ceiling`` (the upstream timeout). An owner that dies is noticed sooner
    (:func:`silent`); this bounds an owner that is alive but stuck."""
    if sent is None:
        return ceiling
    return min(sent + grace, ceiling)


def silent(unanswered: int, *, no_responders: bool, after: int = SILENT_AFTER) -> bool:
    """Whether a holder is gone: NATS said no one listens on its subject (its
    connection closed: the process died or left), or ``after`` pings in a row went
    unanswered."""
    return no_responders or unanswered >= after
