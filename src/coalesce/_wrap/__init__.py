"""``coalesce.wrap(client)``: the drop-in SDK client, a thin translation to the engine."""

from __future__ import annotations

from .client import CoalescedClient, wrap

__all__ = ["CoalescedClient", "wrap"]
