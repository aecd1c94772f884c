"""Batch APIs as pure timelines: a batch's status is a function of the time asked.

Every line of a batch is answered when the batch is created (deterministically, no
latency); what the clients see then unfolds on the simulation clock: OpenAI's
validating → in_progress → finalizing → completed (or cancelling → cancelled),
Anthropic's in_progress → ended (or canceling → ended). No background task runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from coalesce._exceptions import ConfigurationError

__all__ = [
    "Batch",
    "BatchStore",
    "BatchTiming",
    "LineResult",
    "StoredFile",
    "Timeline",
    "anthropic_status",
    "lines_done",
    "make_timeline",
    "openai_status",
]


@dataclass(frozen=True)
class BatchTiming:
    """How long batches take, before the time scale.

    Attributes:
        validating: OpenAI's validation phase.
        per_request: Processing time per line (lines finish one after another).
        finalizing: OpenAI's finalizing phase (Anthropic: the tail before ``ended``).
        cancelling: From a cancel request to ``cancelled`` / ``ended``.
    """

    validating: float = 1.0
    per_request: float = 0.05
    finalizing: float = 1.0
    cancelling: float = 1.0

    def __post_init__(self) -> None:
        for name in ("validating", "per_request", "finalizing", "cancelling"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"batch timing {name} must be >= 0, got {getattr(self, name)}"
                )


class Timeline(NamedTuple):
    """When a batch passes each phase (simulation seconds).

    Attributes:
        created: Creation.
        validated: End of validation, start of processing.
        finishes: When each line is done.
        finalizing: When the last line is done.
        completed: When the batch is complete.
    """

    created: float
    validated: float
    finishes: tuple[float, ...]
    finalizing: float
    completed: float


def make_timeline(
    created: float, lines: int, timing: BatchTiming, scale: float, *, validate: bool
) -> Timeline:
    """Return the timeline of a batch of ``lines`` lines created at ``created``.

    Args:
        created: Creation time.
        lines: Number of lines.
        timing: Phase durations.
        scale: The provider's time scale.
        validate: Whether there is a validation phase (OpenAI).
    """
    validated = created + (timing.validating * scale if validate else 0.0)
    finishes = tuple(validated + (i + 1) * timing.per_request * scale for i in range(lines))
    finalizing = finishes[-1] if finishes else validated
    return Timeline(
        created, validated, finishes, finalizing, finalizing + timing.finalizing * scale
    )


def lines_done(timeline: Timeline, until: float) -> int:
    """Return how many lines are done at ``until``.

    Args:
        timeline: The batch's timeline.
        until: A time.
    """
    return sum(1 for finish in timeline.finishes if finish <= until)


def openai_status(
    timeline: Timeline, cancel_at: float | None, cancelling: float, failed: bool, now: float
) -> str:
    """Return an OpenAI batch's status at ``now``.

    Args:
        timeline: The batch's timeline.
        cancel_at: When a cancel was requested, if ever.
        cancelling: Scaled duration of the cancelling phase.
        failed: Validation failed.
        now: The time asked.
    """
    if cancel_at is not None:
        return "cancelled" if now >= cancel_at + cancelling else "cancelling"
    if now < timeline.validated:
        return "validating"
    if failed:
        return "failed"
    if now < timeline.finalizing:
        return "in_progress"
    return "finalizing" if now < timeline.completed else "completed"


def anthropic_status(
    timeline: Timeline, cancel_at: float | None, cancelling: float, now: float
) -> str:
    """Return an Anthropic message batch's ``processing_status`` at ``now``.

    Args:
        timeline: The batch's timeline.
        cancel_at: When a cancel was requested, if ever.
        cancelling: Scaled duration of the canceling phase.
        now: The time asked.
    """
    if cancel_at is not None:
        return "ended" if now >= cancel_at + cancelling else "canceling"
    return "ended" if now >= timeline.completed else "in_progress"


@dataclass
class StoredFile:
    """An uploaded or generated file."""

    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: float


@dataclass(frozen=True)
class LineResult:
    """One line's answer: its status and the API's response body."""

    custom_id: str
    status: int
    body: dict[str, Any]


@dataclass
class Batch:
    """One batch of either API."""

    id: str
    timeline: Timeline
    results: list[LineResult]
    request: dict[str, Any]
    errors: list[dict[str, Any]] = field(default_factory=list)
    cancel_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    finished: bool = False


class BatchStore:
    """Files and batches of one provider."""

    def __init__(self, timing: BatchTiming, scale: float) -> None:
        self.timing = timing
        self.scale = scale
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}

    def timeline(self, created: float, lines: int, *, validate: bool) -> Timeline:
        """Return the timeline of a new batch (see :func:`make_timeline`)."""
        return make_timeline(created, lines, self.timing, self.scale, validate=validate)

    @property
    def cancelling(self) -> float:
        """The scaled duration of the cancelling phase."""
        return self.timing.cancelling * self.scale
