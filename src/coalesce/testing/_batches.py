"""Batch APIs as pure timelines: a batch's status is a function of the time asked.

Every line of a batch that will be done is answered when the batch is created
(deterministically, no latency); what the clients see then unfolds on the simulation
clock: OpenAI's validating → in_progress → finalizing → completed (or cancelling →
cancelled, or expired), Anthropic's in_progress → ended (or canceling → ended). No
background task runs.

A line that would finish after the batch's completion window (or after a scripted
stall, :meth:`BatchStore.stall_next`) is never done: its finish time is infinite,
and the batch expires at the end of the window with the lines done before it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from coalesce.exceptions import ConfigurationError

__all__ = [
    "Batch",
    "BatchStore",
    "BatchSubmission",
    "BatchTiming",
    "LineResult",
    "StoredFile",
    "Timeline",
    "anthropic_status",
    "batch_end",
    "lines_done",
    "make_timeline",
    "openai_status",
    "unfinished",
]


@dataclass(frozen=True)
class BatchTiming:
    """How long batches take, before the time scale.

    Attributes:
        validating: OpenAI's validation phase.
        per_request: Processing time per line (lines finish one after another).
        finalizing: OpenAI's finalizing phase (Anthropic: the tail before ``ended``).
        cancelling: From a cancel request to ``cancelled`` / ``ended``.
        completion_window: From creation to expiry (both APIs: 24 hours). Lines not
            done by then are never done, and the batch ends ``expired`` (OpenAI) or
            ``ended`` with ``expired`` results (Anthropic).
    """

    validating: float = 1.0
    per_request: float = 0.05
    finalizing: float = 1.0
    cancelling: float = 1.0
    completion_window: float = 86400.0

    def __post_init__(self) -> None:
        for name in ("validating", "per_request", "finalizing", "cancelling"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"batch timing {name} must be >= 0, got {getattr(self, name)}"
                )
        if not self.completion_window > 0:
            raise ConfigurationError(
                f"batch timing completion_window must be > 0 seconds, got {self.completion_window}"
            )


class Timeline(NamedTuple):
    """When a batch passes each phase (simulation seconds).

    Attributes:
        created: Creation.
        validated: End of validation, start of processing.
        finishes: When each line is done (``math.inf``: never, the batch expires).
        finalizing: When the last line is done (``math.inf`` if one never is).
        completed: When the batch is complete (``math.inf`` if it expires).
        expires: The end of the completion window.
    """

    created: float
    validated: float
    finishes: tuple[float, ...]
    finalizing: float
    completed: float
    expires: float


def make_timeline(
    created: float,
    lines: int,
    timing: BatchTiming,
    scale: float,
    *,
    validate: bool,
    stall_after: int | None = None,
) -> Timeline:
    """Return the timeline of a batch of ``lines`` lines created at ``created``, its
    phases as ``timing`` says at the provider's time ``scale``; ``validate``: OpenAI's
    validation phase; ``stall_after``: only this many lines are ever done (a scripted
    expiry), ``None`` as many as the completion window allows."""
    validated = created + (timing.validating * scale if validate else 0.0)
    expires = created + timing.completion_window * scale
    stall = lines if stall_after is None else min(stall_after, lines)
    due = (validated + (i + 1) * timing.per_request * scale for i in range(lines))
    finishes = tuple(t if i < stall and t <= expires else math.inf for i, t in enumerate(due))
    finalizing = max(finishes, default=validated)
    return Timeline(
        created, validated, finishes, finalizing, finalizing + timing.finalizing * scale, expires
    )


def lines_done(timeline: Timeline, until: float) -> int:
    """Return how many lines are done at ``until`` (lines never done never count)."""
    return sum(1 for finish in timeline.finishes if finish <= until and finish < math.inf)


def unfinished(timeline: Timeline) -> bool:
    """Return whether some line is never done: the batch expires."""
    return math.isinf(timeline.finalizing)


def batch_end(
    timeline: Timeline, cancel_at: float | None, cancelling: float, failed: bool
) -> float:
    """Return when a batch ends: cancelled (a cancel asked at ``cancel_at``, taking
    ``cancelling`` seconds, scaled), ``failed`` at validation, expired or complete."""
    if cancel_at is not None:
        return cancel_at + cancelling
    if failed:
        return timeline.validated
    return timeline.expires if unfinished(timeline) else timeline.completed


def openai_status(
    timeline: Timeline, cancel_at: float | None, cancelling: float, failed: bool, now: float
) -> str:
    """Return an OpenAI batch's status at ``now``; the other arguments are
    :func:`batch_end`'s."""
    if cancel_at is not None:
        return "cancelled" if now >= cancel_at + cancelling else "cancelling"
    if now < timeline.validated:
        return "validating"
    if failed:
        return "failed"
    if unfinished(timeline) and now >= timeline.expires:
        return "expired"
    if now < timeline.finalizing:
        return "in_progress"
    return "finalizing" if now < timeline.completed else "completed"


def anthropic_status(
    timeline: Timeline, cancel_at: float | None, cancelling: float, now: float
) -> str:
    """Return an Anthropic message batch's ``processing_status`` at ``now``; the
    other arguments are :func:`batch_end`'s."""
    if cancel_at is not None:
        return "ended" if now >= cancel_at + cancelling else "canceling"
    end = batch_end(timeline, None, cancelling, failed=False)
    return "ended" if now >= end else "in_progress"


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


class BatchSubmission(NamedTuple):
    """One batch as the provider received it: what a test counts submissions with.

    Attributes:
        provider: ``"openai"`` or ``"anthropic"``.
        batch_id: The batch's id.
        created_at: When it was created (``anyio.current_time()``).
        input_file_id: The uploaded JSONL file (OpenAI), or ``None``.
        custom_ids: Every line's ``custom_id``, in the order sent.
        items: Items carried by the lines: packed items, or 1 per plain line.
        metadata: The ``metadata`` given on create (OpenAI), or ``None``.
        failed: The batch was refused at validation (bad lines, the enqueued-token
            limit): none of its lines runs.
    """

    provider: str
    batch_id: str
    created_at: float
    input_file_id: str | None
    custom_ids: tuple[str, ...]
    items: int
    metadata: Mapping[str, Any] | None
    failed: bool

    def as_dict(self) -> dict[str, Any]:
        """Return the submission as a JSON-able dict."""
        value = self._asdict()
        value["custom_ids"] = list(self.custom_ids)
        return value


@dataclass
class Batch:
    """One batch of either API.

    Attributes:
        id: The batch id.
        timeline: When it passes each phase.
        results: The answers of the lines that are ever done, in line order.
        request: The creating request's body (OpenAI), kept for the batch object.
        errors: Validation errors; a batch with errors fails and runs no line.
        custom_ids: Every line's ``custom_id``, done or not.
        tokens: Prompt tokens per model, enqueued until the batch ends.
        items: Items carried by the lines.
        cancel_at: When a cancel was requested, if ever.
        output_file_id: OpenAI's output file, once written.
        error_file_id: OpenAI's error file, once written.
        finished: The output files are written.
    """

    id: str
    timeline: Timeline
    results: list[LineResult]
    request: dict[str, Any]
    errors: list[dict[str, Any]] = field(default_factory=list)
    custom_ids: tuple[str, ...] = ()
    tokens: Mapping[str, int] = field(default_factory=dict)
    items: int = 0
    cancel_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    finished: bool = False

    def done(self, now: float) -> int:
        """Return how many lines are done at ``now`` (none after a cancel request)."""
        until = now if self.cancel_at is None else min(now, self.cancel_at)
        return lines_done(self.timeline, until)

    @property
    def provider(self) -> str:
        """``"anthropic"`` for a message batch, else ``"openai"``."""
        return "anthropic" if self.id.startswith("msgbatch_") else "openai"

    def submission(self) -> BatchSubmission:
        """Return the batch as submitted."""
        return BatchSubmission(
            self.provider, self.id, self.timeline.created, self.request.get("input_file_id"),
            self.custom_ids, self.items, self.request.get("metadata"), bool(self.errors),
        )  # fmt: skip


class BatchStore:
    """Files and batches of one provider."""

    def __init__(self, timing: BatchTiming, scale: float) -> None:
        self.timing = timing
        self.scale = scale
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}
        self._stalls: deque[int] = deque()

    def timeline(self, created: float, lines: int, *, validate: bool) -> Timeline:
        """Return the timeline of a new batch, taking a scripted stall if one waits
        (see :func:`make_timeline`)."""
        stall = self._stalls.popleft() if self._stalls and lines else None
        return make_timeline(
            created, lines, self.timing, self.scale, validate=validate, stall_after=stall
        )

    def stall_next(self, after_lines: int) -> None:
        """Make the next accepted batch stop after ``after_lines`` lines (0: none) and expire.

        Raises:
            ConfigurationError: ``after_lines`` is negative.
        """
        if isinstance(after_lines, bool) or not isinstance(after_lines, int) or after_lines < 0:
            raise ConfigurationError(f"after_lines must be an integer >= 0, got {after_lines!r}")
        self._stalls.append(after_lines)

    @property
    def cancelling(self) -> float:
        """The scaled duration of the cancelling phase."""
        return self.timing.cancelling * self.scale

    def end(self, batch: Batch) -> float:
        """Return when ``batch`` ends (see :func:`batch_end`)."""
        return batch_end(batch.timeline, batch.cancel_at, self.cancelling, bool(batch.errors))

    def enqueued(self, provider: str, model: str, now: float) -> int:
        """Return the prompt tokens of ``model`` in ``provider``'s unfinished batches at ``now``."""
        return sum(
            batch.tokens.get(model, 0)
            for batch in self.batches.values()
            if batch.provider == provider and self.end(batch) > now
        )

    def submissions(self) -> tuple[BatchSubmission, ...]:
        """Return every batch created, in order of creation."""
        return tuple(batch.submission() for batch in self.batches.values())
