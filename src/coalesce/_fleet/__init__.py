"""A fleet: gateway replicas, worker processes (and, later, app pods) that coalesce as
one over NATS (``docs/fleet.md``).

Each partition has one owner, the member holding its lease in a JetStream key-value
bucket (:mod:`.leases`); other members forward its calls to the owner by NATS
request/reply (:mod:`.wire`), and take them back when the owner is gone or silent, or
when NATS itself is down (:mod:`.member`). Every decision is a pure function
(:mod:`.decide`); :mod:`.connection` turns the settings into nats-py's.

Importing this package imports nothing of nats-py: a member imports it when it runs.
"""

from __future__ import annotations

from .connection import FleetSettings
from .member import FleetStatistics, Member

__all__ = ["FleetSettings", "FleetStatistics", "Member"]
