"""One member of a fleet: it connects to NATS, owns the partitions whose leases it
holds, serves the calls other members forward to it, and forwards the calls of
partitions another member owns.

One call's way through :meth:`Member.dispatch`:

1. :meth:`Member.where`: the partition's lease, as known (read again when
   :func:`~.decide.stale`), else read, else claimed; :func:`~.decide.route` decides;
2. owned here, or NATS unreachable: ``None``, and the caller answers the call with its
   own engine (coalesced with this member's other calls);
3. else the call goes to the holder (:meth:`Member.forward`), by NATS request/reply on
   the holder's own subject, with its remaining budget; while it is in flight the
   holder is pinged (:mod:`.forwarding`), and a holder whose connection is gone
   (NATS answers "no responders" at once) or that stops answering is taken over at
   once (a compare-and-set on the lease): the call is answered here, or through the
   member that won the lease, within its budget. The caller gets one reply: the
   holder's, or its own engine's, never both.

Importing this module imports nothing of nats-py; :meth:`Member.run` does.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
import anyio.abc

from . import decide
from .connection import FleetSettings, connect_options, shown_url
from .decide import LeaseView, Route
from .forwarding import TAKE_BACK, Forwarding
from .leases import Leases, LeaseUnavailable
from .wire import (
    Forwarded,
    Reply,
    call_subject,
    decode_call,
    encode_reply,
    member_token,
    ping_subject,
)

__all__ = ["FleetStatistics", "Handler", "Member", "logger"]

logger = logging.getLogger("coalesce.fleet")

#: Answers a forwarded call on its owner (the gateway's coalesced path); ``None``: it
#: cannot (it is stopping), and the forwarder answers the call itself.
Handler = Callable[[Forwarded], Awaitable["Reply | None"]]
_ids = itertools.count()


class FleetStatistics(NamedTuple):
    """One member's fleet counters (``/metrics`` and ``/readyz`` show them).

    Attributes:
        member: Its id (its host, its pid, a counter).
        connected: Whether it is connected to NATS and its lease bucket.
        owned: Partitions it holds the lease of.
        forwarded: Calls it sent to another member that answered them.
        served: Calls other members forwarded to it.
        fallbacks: Calls it answered itself for want of the fleet (NATS unreachable, or
            an owner that did not answer in time).
        lease_changes: Leases it acquired, took over, lost or let go.
        takeovers: Leases it took from a holder found gone.
    """

    member: str
    connected: bool
    owned: int
    forwarded: int
    served: int
    fallbacks: int
    lease_changes: int
    takeovers: int


@dataclass
class _Owned:
    view: LeaseView
    last_call: float


def _default_name() -> str:
    return member_token(f"{socket.gethostname()}-{os.getpid()}-{next(_ids)}")


class Member:
    """One fleet member (see the module doc).

    Args:
        settings: Where the fleet is.
        handler: Answers the calls forwarded to this member.
    """

    def __init__(self, settings: FleetSettings, handler: Handler) -> None:
        self.settings = settings
        self.handler = handler
        self.me = member_token(settings.name) if settings.name else _default_name()
        self.nc: Any = None
        self.leases: Leases | None = None
        self.views: dict[str, LeaseView] = {}
        self.owned: dict[str, _Owned] = {}
        self.forwarding = Forwarding(self._forget)
        self.counts = dict.fromkeys(
            ("forwarded", "served", "fallbacks", "lease_changes", "takeovers"), 0
        )
        self.ceiling = 600.0
        self.serving = 0
        self._tasks: anyio.abc.TaskGroup | None = None
        self._calls: Any = None
        self._idle: anyio.Event | None = None
        self._leaving = False
        self._reading: dict[str, anyio.Event] = {}
        self.joined = anyio.Event()

    def __repr__(self) -> str:
        state = "joined" if self.connected else "local"
        return (
            f"<Member {self.me} {state} at {shown_url(self.settings.url)}, owns {len(self.owned)}>"
        )

    @property
    def connected(self) -> bool:
        """Whether calls may go through the fleet now."""
        return self.leases is not None and self.nc is not None and bool(self.nc.is_connected)

    def statistics(self) -> FleetStatistics:
        """This member's counters, now."""
        return FleetStatistics(self.me, self.connected, len(self.owned), **self.counts)

    # -- routing ---------------------------------------------------------------------

    async def where(self, key: str) -> tuple[Route, LeaseView | None]:
        """Where a call of partition ``key`` goes now, and the lease that says so. While
        one call reads or claims a lease, the other calls of its partition wait for what
        it finds (a burst of a new partition's calls is one read, not one each)."""
        reading = self._reading.get(key)
        if reading is not None:
            await reading.wait()
        else:
            self._reading[key] = anyio.Event()
        try:
            return await self._where(key)
        finally:
            if reading is None:
                self._reading.pop(key).set()

    async def _where(self, key: str) -> tuple[Route, LeaseView | None]:
        now = anyio.current_time()
        view = self.views.get(key)
        if view is not None and view.holder != self.me and decide.stale(view, now):
            view = None
        try:
            for _ in range(3):
                decision = decide.route(view, self.me, connected=self.connected)
                if decision is not Route.CLAIM:
                    break
                view = await self._claim(key, now)
        except LeaseUnavailable:
            decision = Route.FALLBACK
        if decision is Route.OWN and view is not None:
            self._own(key, view, now)
        return decision, view

    async def _claim(self, key: str, now: float) -> LeaseView | None:
        assert self.leases is not None
        view = await self.leases.read(key, now)
        if view is None:
            view = await self.leases.claim(key, now)
            if view is not None:
                self._changed("acquired", key)
        if view is not None:
            self.views[key] = view
        return view

    def _own(self, key: str, view: LeaseView, now: float) -> None:
        owned = self.owned.get(key)
        if owned is None:
            self.owned[key] = _Owned(view, now)
        else:
            owned.last_call = now

    async def dispatch(self, call: Forwarded, budget: float | None, started: float) -> Reply | None:
        """Send ``call`` to its partition's owner: its reply, or ``None`` when this
        member answers it itself (it owns the partition, the fleet is unreachable, or
        the owner was gone or silent: the caller then answers with its own engine).

        Args:
            call: The call (its ``remaining`` is set here).
            budget: Its budget in seconds, if it has one.
            started: When it started (``anyio.current_time()``).
        """
        for attempt in range(2):
            decision, view = await self.where(call.partition)
            if decision is Route.FALLBACK:
                self.counts["fallbacks"] += 1
            if decision is not Route.FORWARD or view is None:
                return None
            elapsed = anyio.current_time() - started
            if attempt and decide.late(budget, elapsed):  # its owner died with it
                return None
            sent = dataclasses.replace(call, remaining=decide.forwarded_budget(budget, elapsed))
            patience = decide.forward_timeout(sent.remaining, self.ceiling)
            outcome = await self.forwarding.send(sent, view.holder, patience)
            if isinstance(outcome, Reply):
                self.counts["forwarded"] += 1
                return outcome
            if outcome != "gone" or not await self._take_over(call.partition, view):
                self.counts["fallbacks"] += 1
                return None
        return None

    async def _take_over(self, key: str, view: LeaseView) -> bool:
        """After the holder in ``view`` was found gone: whether to route the call again
        (this member took the lease, or another member holds it now). The revision this
        member knew may be older than the holder's last renewal: read again, and take
        the lease only from the holder found gone (a compare-and-set: one member wins)."""
        gone = view.holder
        try:
            for _ in range(3):
                now = anyio.current_time()
                taken = await self._leases().take_over(view, key, now)
                if taken is not None:
                    self.views[key] = taken
                    self._own(key, taken, now)
                    self.counts["takeovers"] += 1
                    self._changed("took_over", key, previous=gone)
                    return True
                found = await self._leases().read(key, now)
                if found is None or found.holder != gone:
                    return True  # free (claimed on the next route) or taken by another
                view = found
        except LeaseUnavailable:
            return False
        return False

    def _leases(self) -> Leases:
        if self.leases is None:
            raise LeaseUnavailable("not connected to the fleet")
        return self.leases

    def _forget(self, holder: str) -> None:
        for key in [k for k, v in self.views.items() if v.holder == holder]:
            del self.views[key]

    # -- the owner's side ------------------------------------------------------------

    async def _serve(self, msg: Any) -> None:
        try:
            call = decode_call(msg.data)
        except (ValueError, KeyError):
            return
        self.counts["served"] += 1
        owned = self.owned.get(call.partition)
        if owned is not None:
            owned.last_call = anyio.current_time()
        self.serving += 1
        try:
            reply = await self.handler(call) or TAKE_BACK
        except Exception:
            logger.exception("fleet: a forwarded call could not be answered here")
            reply = TAKE_BACK
        finally:
            self.serving -= 1
            if not self.serving and self._idle is not None:
                self._idle.set()
        try:
            await msg.respond(encode_reply(reply))
        except Exception:  # NATS went away: the forwarder takes the call back
            return

    async def _on_call(self, msg: Any) -> None:
        # nats-py runs one subscription's callbacks one after another: each call gets
        # a task of its own, so that they wait for their groups together.
        assert self._tasks is not None
        self._tasks.start_soon(self._serve, msg)

    @staticmethod
    async def _on_ping(msg: Any) -> None:
        await msg.respond(b"")

    # -- background ------------------------------------------------------------------

    async def keep_leases(self) -> None:
        """Renew each owned lease at a third of its TTL; let go of idle ones."""
        while True:
            await anyio.sleep(decide.LEASE_TTL / 6)
            if not self.connected:
                continue
            for key, owned in list(self.owned.items()):
                await self._keep(key, owned, anyio.current_time())

    async def _keep(self, key: str, owned: _Owned, now: float) -> None:
        assert self.leases is not None
        try:
            if decide.idle(owned.last_call, now):
                self.owned.pop(key, None)
                self.views.pop(key, None)
                await self.leases.release(owned.view, key)
                self._changed("released", key)
            elif decide.renew_due(owned.view.seen, now):
                renewed = await self.leases.renew(owned.view, key, now)
                if renewed is None:
                    self.owned.pop(key, None)
                    self.views.pop(key, None)
                    self._changed("lost", key)
                else:
                    owned.view = self.views[key] = renewed
        except LeaseUnavailable:
            return

    def _changed(self, change: str, key: str, previous: str | None = None) -> None:
        """One structured log line per change of this member's ownership."""
        self.counts["lease_changes"] += 1
        fields = {"change": change, "partition": key[:12], "member": self.me}
        if previous is not None:
            fields["previous"] = previous
        shown = " ".join(f"{name}={value}" for name, value in fields.items())
        logger.info("fleet lease %s", shown, extra={"fleet": fields})

    # -- the connection --------------------------------------------------------------

    async def _disconnected(self) -> None:
        if self._leaving:
            return
        logger.warning("fleet: NATS unreachable; %s coalesces locally until it is back", self.me)
        self.forwarding.all_gone()

    async def _reconnected(self) -> None:
        self.views.clear()
        assert self._tasks is not None
        self._tasks.start_soon(self._open_leases)

    async def _open_leases(self) -> None:
        self.leases = None
        while self.leases is None:
            try:
                self.leases = await Leases.open(self.nc.jetstream(timeout=0.5), self.me)
            except LeaseUnavailable as exc:
                logger.warning("fleet: %s; coalescing locally meanwhile", exc)
                await anyio.sleep(1.0)
        self.joined.set()
        logger.info("fleet: %s joined the fleet at %s", self.me, shown_url(self.settings.url))

    async def _connect(self) -> None:
        import nats

        async def quiet(exc: Exception) -> None:
            logger.debug("fleet: NATS: %s", type(exc).__name__)

        options = connect_options(self.settings)
        while True:
            try:
                self.nc = await nats.connect(
                    **options, disconnected_cb=self._disconnected,
                    reconnected_cb=self._reconnected, error_cb=quiet,
                )  # fmt: skip
                break
            except Exception as exc:
                logger.warning(
                    "fleet: cannot reach NATS at %s (%s); coalescing locally meanwhile",
                    shown_url(self.settings.url), type(exc).__name__,
                )  # fmt: skip
                await anyio.sleep(1.0)
        self.forwarding.nc = self.nc
        self._calls = await self.nc.subscribe(call_subject(self.me), cb=self._on_call)
        await self.nc.subscribe(ping_subject(self.me), cb=self._on_ping)
        await self._open_leases()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Join the fleet, and stay in it until cancelled (started at once: until NATS
        answers, :meth:`dispatch` returns ``None`` and calls are coalesced locally)."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            task_status.started()
            try:
                await self._connect()
                tasks.start_soon(self.forwarding.watch, tasks, lambda: self.connected)
                await self.keep_leases()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._leave()

    async def stop_serving(self, patience: float) -> None:
        """Take no more forwarded calls (their forwarders answer them, or take the
        lease over, at once), and wait up to ``patience`` seconds for those being
        answered."""
        if self._calls is not None:
            with anyio.move_on_after(1.0):
                await self._calls.unsubscribe()
            self._calls = None
        with anyio.move_on_after(patience):
            if self.serving:
                self._idle = anyio.Event()
                await self._idle.wait()

    async def _leave(self) -> None:
        """Let go of every lease (the next call of each partition claims it at once), then
        close the connection."""
        nc, leases, owned = self.nc, self.leases, dict(self.owned)
        self._leaving = True
        self.leases = None
        self.owned.clear()
        if nc is None:
            return
        with anyio.move_on_after(2.0):
            if leases is not None and nc.is_connected:
                for key, held in owned.items():
                    try:
                        await leases.release(held.view, key)
                    except LeaseUnavailable:
                        break
                    self._changed("released", key)
            await nc.close()
