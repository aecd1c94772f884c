"""What planning reads of a call and of a request's report, as protocols.

The planner learns from the group runner's reports (:class:`~coalesce._calls.RequestReport`)
and plans the calls in a window (:class:`~coalesce._calls.Job`), but it sits below them:
these protocols name the few attributes it reads, and the runner's own types satisfy
them. (httpx's transports likewise see requests, never the client.)
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

from ..providers import Completion
from .planner import PlanItem

__all__ = ["Planned", "Report"]


class Planned(Protocol):
    """A call, as planning sees it: its item, its partition and its token plan."""

    @property
    def item(self) -> Any:
        """The call's input."""

    @property
    def plan(self) -> PlanItem | None:
        """Its token estimates and deadline, when a budget is planned."""

    @property
    def partition(self) -> Hashable:
        """The partition it was submitted in (output sizes are learned per partition)."""


class Report(Protocol):
    """One request's report, as planning reads it (see
    :class:`~coalesce._calls.RequestReport` for each attribute)."""

    @property
    def slots(self) -> Mapping[str, Sequence[Planned]]:
        """The calls it carried, by id."""

    @property
    def plain(self) -> bool:
        """A plain call of one item."""

    @property
    def text(self) -> bool:
        """A plain call answered in text."""

    @property
    def completion(self) -> Completion | None:
        """The reply, if any text came."""

    @property
    def error(self) -> BaseException | None:
        """What failed the request as a whole."""

    @property
    def error_headers(self) -> Mapping[str, str]:
        """The error response's headers."""

    @property
    def streamed(self) -> bool:
        """Some of the reply arrived as a stream."""

    @property
    def now(self) -> float:
        """When the report was written."""

    @property
    def schema_broken(self) -> bool:
        """The reply broke the reply schema."""

    @property
    def contradicted(self) -> tuple[str, ...]:
        """Ids a streamed reply answered twice, differently."""

    @property
    def items(self) -> int:
        """Items in the request's prompt."""

    @property
    def partition(self) -> Hashable:
        """The partition of the calls it carried."""
