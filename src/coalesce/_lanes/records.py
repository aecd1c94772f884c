"""The records of the job store: the states its rows move through, and the frozen
dataclasses its methods take and return (see :mod:`coalesce._lanes.store` for the
state machine)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from coalesce._lanes.keys import item_key

__all__ = [
    "FINISHED_JOB_STATES",
    "JOB_METADATA_KEY",
    "UNFINISHED_JOB_STATES",
    "UNFINISHED_LINE_STATES",
    "BatchJob",
    "DeferredLane",
    "ItemRow",
    "ItemState",
    "JobState",
    "JobSummary",
    "LineState",
    "PlannedLine",
    "Provider",
    "StoredItem",
    "StoredLine",
]

Provider = Literal["openai", "anthropic"]
DeferredLane = Literal["batch", "flex"]
JobState = Literal[
    "planned", "uploaded", "submitted", "completed", "expired", "cancelled", "failed", "ended"
]
LineState = Literal["planned", "submitted", "done", "failed", "expired"]
ItemState = Literal["pending", "assigned", "done", "failed"]


UNFINISHED_JOB_STATES: tuple[JobState, ...] = ("planned", "uploaded", "submitted")
FINISHED_JOB_STATES: tuple[JobState, ...] = ("completed", "expired", "cancelled", "failed", "ended")
UNFINISHED_LINE_STATES: tuple[LineState, ...] = ("planned", "submitted")
JOB_METADATA_KEY = "coalesce_job"
"""The metadata key carrying the local job id, to find a job again on the provider's side."""


@dataclass(frozen=True)
class ItemRow:
    """One item to add to the store: its key, what it is for, and its input (JSON)."""

    key: str
    function: str
    model: str
    input: Any

    @classmethod
    def for_call(
        cls,
        function: str,
        model: str,
        instructions: str,
        output_schema: Mapping[str, Any],
        item: Any,
    ) -> ItemRow:
        """The row of one call, keyed by :func:`~coalesce._lanes.keys.item_key`."""
        return cls(
            item_key(function, model, instructions, output_schema, item), function, model, item
        )


@dataclass(frozen=True)
class StoredItem:
    """An item as the store has it; ``line`` is the line holding it or that answered it."""

    key: str
    function: str
    model: str
    input: Any
    state: ItemState
    line: str | None
    result: Any
    error: str | None
    attempts: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class PlannedLine:
    """One JSONL line to be uploaded: its ``custom_id``, request body and the items it packs."""

    custom_id: str
    request: Mapping[str, Any]
    item_keys: Sequence[str]


@dataclass(frozen=True)
class StoredLine:
    """A line as the store has it; ``request`` is the body that was, or will be, uploaded."""

    custom_id: str
    job_id: str
    request: Mapping[str, Any]
    state: LineState
    attempt: int
    item_keys: tuple[str, ...]


@dataclass(frozen=True)
class BatchJob:
    """A batch job: ``id`` is local (a uuid4 made before upload), the rest the provider's."""

    id: str
    provider: Provider
    model: str
    lane: DeferredLane
    state: JobState
    input_file_id: str | None
    provider_batch_id: str | None
    metadata: Mapping[str, str]
    cost_usd: float
    created_at: float
    updated_at: float

    @property
    def unfinished(self) -> bool:
        """Whether a restarted process must still finish submitting it or attach to it."""
        return self.state in UNFINISHED_JOB_STATES


@dataclass(frozen=True)
class JobSummary:
    """What one job did, for ``coalesce jobs show``.

    Attributes:
        job: The job.
        lines: Its lines, counted by state.
        items: The items its lines carried: ``assigned``, ``done`` and ``failed`` for
            those this job still holds or answered; ``released`` for those it let go
            (expired or unanswered), now pending or taken by a later job.
        cost_usd: Its cost so far.
    """

    job: BatchJob
    lines: Mapping[LineState, int]
    items: Mapping[str, int]
    cost_usd: float
