"""Partition leases in a JetStream key-value bucket: one key per partition digest, its
value the holder's member id, the bucket's TTL the lease's life.

Every change is a compare-and-set on the key's revision, so two members never both
win one: :meth:`Leases.claim` creates a key that does not exist (or has lapsed),
:meth:`Leases.take_over` replaces a holder found gone only if no one changed the key
since it was read, :meth:`Leases.renew` succeeds only while this member still holds it.
A lost race is an answer (``None``), not an error; NATS itself failing raises
:class:`LeaseUnavailable`, and the caller then coalesces locally.
"""

from __future__ import annotations

from typing import Any

import anyio

from .decide import LEASE_TTL, LeaseView

__all__ = ["BUCKET", "KV_TIMEOUT", "LeaseUnavailable", "Leases"]

#: The key-value bucket of the leases.
BUCKET = "coalesce_fleet_leases"
#: Seconds one key-value operation may take before NATS counts as unreachable for it
#: (p50 0.28 ms on one machine; a loaded machine's event loops add hundreds of ms).
KV_TIMEOUT = 1.0


class LeaseUnavailable(Exception):
    """The bucket could not be read or written (NATS down, JetStream not enabled)."""


class Leases:
    """The lease bucket, seen by one member (``me``).

    Args:
        kv: The nats-py ``KeyValue`` of the bucket (:meth:`open` makes it).
        me: This member's id.
    """

    def __init__(self, kv: Any, me: str) -> None:
        self.kv = kv
        self.me = me

    @classmethod
    async def open(cls, js: Any, me: str, ttl: float = LEASE_TTL) -> Leases:
        """The bucket through the JetStream context ``js``, created if it is missing.

        Raises:
            LeaseUnavailable: JetStream did not answer, or refused the bucket.
        """
        import nats.js.api
        import nats.js.errors

        try:
            with anyio.fail_after(KV_TIMEOUT * 4):
                try:
                    kv = await js.key_value(BUCKET)
                except nats.js.errors.BucketNotFoundError:
                    config = nats.js.api.KeyValueConfig(bucket=BUCKET, ttl=ttl, history=1)
                    kv = await js.create_key_value(config)
        except Exception as exc:
            raise LeaseUnavailable(f"the lease bucket {BUCKET}: {type(exc).__name__}") from exc
        return cls(kv, me)

    async def read(self, key: str, now: float) -> LeaseView | None:
        """The lease of ``key`` (``None``: no one holds it).

        Raises:
            LeaseUnavailable: NATS did not answer.
        """
        import nats.js.errors

        try:
            with anyio.fail_after(KV_TIMEOUT):
                entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except Exception as exc:
            raise LeaseUnavailable(type(exc).__name__) from exc
        if not entry.value:
            return None
        return LeaseView(entry.value.decode(), entry.revision, now)

    async def claim(self, key: str, now: float) -> LeaseView | None:
        """Take the lease of ``key`` if no one holds it: the lease, or ``None`` if another
        member holds it (read it again to learn who).

        Raises:
            LeaseUnavailable: NATS did not answer.
        """
        import nats.js.errors

        try:
            with anyio.fail_after(KV_TIMEOUT):
                revision = await self.kv.create(key, self.me.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
        except Exception as exc:
            raise LeaseUnavailable(type(exc).__name__) from exc
        return LeaseView(self.me, revision, now)

    async def take_over(self, view: LeaseView, key: str, now: float) -> LeaseView | None:
        """Take the lease of ``key`` from a holder found gone, as ``view`` read it: the
        lease, or ``None`` if the key changed since (another member was faster, or the
        holder renewed it).

        Raises:
            LeaseUnavailable: NATS did not answer.
        """
        return await self._write(key, view.revision, now)

    async def renew(self, view: LeaseView, key: str, now: float) -> LeaseView | None:
        """Renew this member's lease of ``key``: the renewed lease, or ``None`` if it
        lapsed or another member took it.

        Raises:
            LeaseUnavailable: NATS did not answer.
        """
        return await self._write(key, view.revision, now)

    async def release(self, view: LeaseView, key: str) -> None:
        """Let this member's lease of ``key`` go (only if it still holds it)."""
        import nats.js.errors

        try:
            with anyio.fail_after(KV_TIMEOUT):
                await self.kv.delete(key, last=view.revision)
        except (nats.js.errors.KeyWrongLastSequenceError, TimeoutError):
            pass
        except Exception as exc:
            raise LeaseUnavailable(type(exc).__name__) from exc

    async def _write(self, key: str, last: int, now: float) -> LeaseView | None:
        import nats.js.errors

        try:
            with anyio.fail_after(KV_TIMEOUT):
                revision = await self.kv.update(key, self.me.encode(), last=last)
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
        except Exception as exc:
            raise LeaseUnavailable(type(exc).__name__) from exc
        return LeaseView(self.me, revision, now)
