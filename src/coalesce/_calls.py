"""What the group runner tells its listeners: one report per request, one per group.

:func:`~coalesce._engine.group.run_group` knows which calls each request carried, what the
provider answered and what each call got. Rather than have statistics, the planner
and the drop-in client's usage shares each re-derive that from the wire, the runner
writes it down once, as a :class:`RequestReport`, and hands it to a
:class:`GroupObserver`. :class:`Observers` fans one report out to several listeners;
:class:`NoObserver` is the base of a listener that hears only some of it.

A call in flight, a :class:`Job`, has one writer: its own data is frozen when it is
made, and only the group runner moves its :class:`Progress`. Listeners that follow
calls keep their own tables, keyed by the job; what answered a call (its requests, its
lane) is handed to its record in a :class:`Carried`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._planning.planner import PlanItem
    from .providers import Completion

__all__ = [
    "Carried",
    "GroupObserver",
    "Job",
    "NoObserver",
    "Observers",
    "Progress",
    "RequestReport",
    "Retry",
    "Runner",
]


@dataclass
class Progress:
    """How far one call has gone. Written by the group runner alone
    (:mod:`coalesce._engine.group`); everyone else reads it through :class:`Job`.

    Attributes:
        attempts: Requests that carried the call so far.
        done: Whether its caller has its outcome.
        company: Items in the last request that carried it (1: a plain call).
        dispatched_at: When its group started to be asked (``None`` until then).
    """

    attempts: int = 0
    done: bool = False
    company: int = 0
    dispatched_at: float | None = None


@dataclass(frozen=True, eq=False)
class Job:
    """One call in flight: its own data, fixed when it is made, and its progress.

    Listeners that follow calls (statistics, usage shares, dispatch) keep their own
    tables keyed by the job (it hashes by identity); they never write on it.

    Attributes:
        item: The call's input, as JSON-able data.
        key: Canonical JSON of the item (dedupe compares it).
        deadline: When the caller's latency budget runs out (``inf`` without one).
        arrival: When the call was made.
        budget: Its latency budget in seconds, or ``None``.
        partition: Calls with different partitions never share a request.
        plan: Its token estimates and deadline (the planner's when a budget is
            planned, else admission's), or ``None``.
        progress: What the group runner has done with it so far.
        alone: It must not share a request (the screen found it reads like instructions).
    """

    item: Any
    key: str
    deadline: float
    arrival: float = 0.0
    budget: float | None = None
    partition: Hashable = None
    plan: PlanItem | None = None
    progress: Progress = field(default_factory=Progress)
    alone: bool = False

    @property
    def attempts(self) -> int:
        """Requests that carried it so far."""
        return self.progress.attempts

    @property
    def done(self) -> bool:
        """Whether its caller has its outcome."""
        return self.progress.done

    @property
    def company(self) -> int:
        """Items in the last request that carried it (1: a plain call)."""
        return self.progress.company

    @property
    def dispatched_at(self) -> float | None:
        """When its group started to be asked (``None`` until then)."""
        return self.progress.dispatched_at


@dataclass
class Carried:
    """What answered one call, for its record: filled while it is asked (by the engine,
    and by the lane router when a call goes through more than one engine).

    Attributes:
        requests: The requests that carried it, in order: each the provider's reply id
            when it gave one, else the request's local number (``"#12"``).
        attempts: How many requests carried it.
        lane: The lane that answered it (``"realtime"``, or ``"flex"``).
    """

    requests: Sequence[str] = ()
    attempts: int = 0
    lane: str = "realtime"


@dataclass(frozen=True)
class RequestReport:
    """One request of a group, after its retries: what it carried and what came back.

    Attributes:
        slots: The calls it carried, by id (several calls share an id with ``dedupe``).
        plain: It was a plain call of one item (no packing format).
        text: A plain call answered in text (the reply is the output itself).
        reask: It asked again for items an earlier reply failed.
        completion: The reply, or ``None`` if the request failed before any text.
        error: What failed the request as a whole, or ``None``.
        error_headers: The error response's headers (a 429 carries the quota).
        outcomes: Per id, the validated output or an
            :class:`~coalesce._wire.outcomes.ItemFailure`.
        streamed: Some text of the reply arrived as a stream.
        seconds: From sending to the reply's end (or the failure).
        now: When the report was written.
        schema_broken: The reply broke the reply schema (an id twice with differing
            outputs, an id missing from a complete reply, an id not asked for).
        contradicted: Ids answered while the reply streamed that the complete reply
            contradicts (the same id again with another output).
        pinned: Its reply schema named every id (see docs/protocol.md).
        attempt: How many requests have carried its items, this one included (1: the
            first; 0: not known).
    """

    slots: Mapping[str, Sequence[Job]]
    plain: bool
    text: bool
    reask: bool
    completion: Completion | None
    error: BaseException | None
    error_headers: Mapping[str, str]
    outcomes: Mapping[str, Any]
    streamed: bool
    seconds: float
    now: float
    schema_broken: bool = False
    contradicted: tuple[str, ...] = ()
    pinned: bool = True
    attempt: int = 0

    @property
    def items(self) -> int:
        """Items in the request's prompt."""
        return len(self.slots)

    @property
    def partition(self) -> Hashable:
        """The partition of the calls it carried."""
        return self._first.partition

    @property
    def request_id(self) -> str:
        """The provider's reply id when it gave one (``"chatcmpl-..."``), else ``""``
        (the statistics listener names such a request by its local number, ``"#12"``)."""
        reply_id = None if self.completion is None else self.completion.reply.get("id")
        return reply_id if isinstance(reply_id, str) else ""

    @property
    def _first(self) -> Job:
        return next(jobs[0] for jobs in self.slots.values())


@dataclass(frozen=True)
class Retry:
    """A request failed as a whole and will be sent again after ``delay`` seconds."""

    attempt: int
    delay: float
    error: BaseException


class GroupObserver(Protocol):
    """Listens to one engine's groups. Every method is synchronous and cheap."""

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """A request carrying ``slots`` (the calls, by id) is being sent."""

    def request_done(self, report: RequestReport) -> None:
        """One request finished or failed (after its retries)."""

    def retrying(self, retry: Retry) -> None:
        """A request failed as a whole and will be sent again."""

    def group_done(self, jobs: Sequence[Job]) -> None:
        """Every call of a group has its outcome."""


class NoObserver:
    """A :class:`GroupObserver` that listens to nothing: subclass it and override what
    you listen to."""

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """Nothing to do when a request is sent."""

    def request_done(self, report: RequestReport) -> None:
        """Nothing to do when a request is done."""

    def retrying(self, retry: Retry) -> None:
        """Nothing to do when a request is retried."""

    def group_done(self, jobs: Sequence[Job]) -> None:
        """Nothing to do when a group is done."""


#: Asks for a group of calls and hands each its outcome: ``await runner(jobs, resolve)``
#: calls ``resolve(index, outcome)`` once for every job (an outcome is a value or an
#: exception). The group runner is one; the vote and the shadow guard wrap one.
Runner = Callable[[list[Job], Callable[[int, Any], None]], Awaitable[None]]


class Observers:
    """Several observers as one, told in the order given."""

    def __init__(self, *observers: GroupObserver) -> None:
        self._observers = observers

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        for observer in self._observers:
            observer.request_sent(slots, reask)

    def request_done(self, report: RequestReport) -> None:
        for observer in self._observers:
            observer.request_done(report)

    def retrying(self, retry: Retry) -> None:
        for observer in self._observers:
            observer.retrying(retry)

    def group_done(self, jobs: Sequence[Job]) -> None:
        for observer in self._observers:
            observer.group_done(jobs)

    def __repr__(self) -> str:
        return f"Observers{self._observers!r}"
