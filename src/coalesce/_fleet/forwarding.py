"""A member's calls in flight on other members, and the watch on those members.

:meth:`Forwarding.send` asks a holder to answer one call, by NATS request/reply on the
holder's own subject, and races the reply against the holder going: while a holder has
calls of this member in flight, :meth:`Forwarding.watch` pings it every
:data:`~.decide.PING_INTERVAL`; NATS answering "no responders" (its connection closed)
or pings unanswered for a second (:func:`~.decide.silent`) mark it gone, and every call
in flight on it comes back at once, for the member to take its lease over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from . import decide
from .wire import Forwarded, Reply, call_subject, decode_reply, encode_call, ping_subject

__all__ = ["TAKE_BACK", "Forwarding"]

#: A reply that says "not answered: take the call back" (the owner's handler could not).
TAKE_BACK = Reply(0, (), b"")


@dataclass
class _Watch:
    """A holder with calls of this member in flight, pinged while it has any."""

    inflight: int = 0
    unanswered: int = 0
    lost: anyio.Event = field(default_factory=anyio.Event)


class Forwarding:
    """The calls one member forwarded, by holder.

    Args:
        forget: Called with a holder found gone (the member forgets its leases).
    """

    def __init__(self, forget: Callable[[str], None]) -> None:
        self.forget = forget
        self.nc: Any = None
        self.watches: dict[str, _Watch] = {}

    async def send(self, call: Forwarded, holder: str, patience: float) -> Reply | str:
        """Ask ``holder`` to answer ``call``: its reply, or why not (``"gone"``: its
        connection closed or it stopped answering pings; ``"silent"``: no reply in
        ``patience`` seconds; ``"unreachable"``: NATS failed; ``"refused"``: it could not)."""
        watch = self.watches.setdefault(holder, _Watch())
        watch.inflight += 1
        outcome: list[Reply | str] = []
        try:
            async with anyio.create_task_group() as group:

                async def ask() -> None:
                    outcome.append(await self._ask(call, holder, patience))
                    group.cancel_scope.cancel()

                async def lost() -> None:
                    await watch.lost.wait()
                    outcome.append("gone")
                    group.cancel_scope.cancel()

                group.start_soon(ask)
                group.start_soon(lost)
        finally:
            watch.inflight -= 1
        if outcome[0] == "gone":
            self.gone(holder)
        return outcome[0]

    async def _ask(self, call: Forwarded, holder: str, patience: float) -> Reply | str:
        import nats.errors

        try:
            msg = await self.nc.request(call_subject(holder), encode_call(call), patience)
        except nats.errors.NoRespondersError:
            return "gone"
        except nats.errors.TimeoutError:
            return "silent"
        except Exception:
            return "unreachable"
        try:
            reply = decode_reply(msg.data)
        except (ValueError, KeyError):  # not a member of this version
            return "refused"
        return "refused" if reply == TAKE_BACK else reply

    def gone(self, holder: str) -> None:
        """``holder`` is gone: its calls in flight come back, its leases are forgotten."""
        watch = self.watches.pop(holder, None)
        if watch is not None:
            watch.lost.set()
        self.forget(holder)

    def all_gone(self) -> None:
        """NATS itself is gone: every call in flight comes back."""
        for holder in list(self.watches):
            self.gone(holder)

    async def watch(self, tasks: anyio.abc.TaskGroup, connected: Callable[[], bool]) -> None:
        """Ping, every :data:`~.decide.PING_INTERVAL`, each holder with calls in flight
        (each ping a task of ``tasks``), while ``connected()``."""
        while True:
            await anyio.sleep(decide.PING_INTERVAL)
            if not connected():
                continue
            for holder, watch in list(self.watches.items()):
                if watch.inflight:
                    tasks.start_soon(self._ping, holder, watch)

    async def _ping(self, holder: str, watch: _Watch) -> None:
        import nats.errors

        gone = False
        try:
            await self.nc.request(ping_subject(holder), b"", timeout=decide.PING_TIMEOUT)
            watch.unanswered = 0
        except nats.errors.NoRespondersError:
            gone = True
        except Exception:
            watch.unanswered += 1
        silent = decide.silent(watch.unanswered, no_responders=gone)
        if silent and self.watches.get(holder) is watch:
            self.gone(holder)
