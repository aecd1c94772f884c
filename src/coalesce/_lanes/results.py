"""What a batch job's lines gave, whatever the provider: split, validated, recorded.

A packed line's reply is split by id (``"1"`` .. ``"n"`` in the order of the items the
line carries) and each output validated; a line of one item is a plain request, as in
real time (:mod:`coalesce._wire.plain`), and its ``custom_id`` says how its reply
reads (:func:`plain_custom_id`). The store then records each item's result or failure. A line with no reply that may come on a second asking (expiry,
cancellation, 429/5xx) releases its items for a follow-up job.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, wait_exponential

from .. import _options
from .._observe.events import logger
from .._wire.outcomes import Split
from .._wire.packing import make_ids, split_reply
from .._wire.plain import split_plain, text_output, wrapped_output
from ..providers import Usage
from .lines import LineOutcome
from .records import JobState, PlannedLine, StoredLine
from .store import JobStore

__all__ = [
    "CREATE_BACKOFF",
    "POLL_INTERVAL",
    "JobOutcome",
    "LineUsage",
    "Poll",
    "Progress",
    "final_state",
    "follow_up_line",
    "plain_custom_id",
    "plain_reading",
    "poll_batch",
    "poll_until",
    "record_job",
    "record_lines",
    "split_line",
]

#: How a plain line's reply reads, by the mark ending its ``custom_id``.
_PLAIN_MARKS = {"-pt": "text", "-pw": "wrapped", "-po": "object"}

T = TypeVar("T")


#: The longest wait, in seconds, between two polls of a batch (``poll_interval=``, and
#: ``coalesce jobs --poll``).
POLL_INTERVAL = _options.POLL_INTERVAL

#: The first wait between two polls, when the longest allows it.
_FIRST_POLL = 5.0


@dataclass(frozen=True)
class Poll:
    """How often to ask about a batch: from ``first`` seconds, times ``factor`` after
    each answer that is not final, up to ``longest`` (``first`` too)."""

    first: float = _FIRST_POLL
    factor: float = 1.5
    longest: float = POLL_INTERVAL

    @classmethod
    def every(cls, longest: float) -> Poll:
        """Polls from 5 s (or ``longest`` if shorter), backing off by 1.5 up to ``longest``."""
        return cls(first=min(_FIRST_POLL, longest), longest=longest)

    def wait(self) -> wait_exponential:
        """The waits as tenacity's strategy: ``first · factorⁿ⁻¹`` after the n-th answer,
        at most ``longest``."""
        return wait_exponential(multiplier=self.first, exp_base=self.factor, max=self.longest)


async def poll_until(
    ask: Callable[[], Awaitable[T]],
    final: Callable[[T], bool],
    poll: Poll,
    on_wait: Callable[[T, float], None] | None = None,
) -> T:
    """``ask()`` (one look: a batch retrieved, a row read) until ``final`` says its answer
    is, waiting ``poll``'s waits between (tenacity's ``AsyncRetrying``, sleeping through
    ``anyio`` so virtual clocks apply); ``on_wait`` is told each answer that was not
    final and the wait that follows it. An error of ``ask`` ends the polling, unchanged."""

    def waiting(state: RetryCallState) -> None:
        if on_wait is not None and state.outcome is not None and state.next_action:
            on_wait(state.outcome.result(), state.next_action.sleep)

    async def look() -> T:  # tenacity 9 awaits only what is a coroutine function
        return await ask()

    retrying = AsyncRetrying(
        retry=retry_if_result(lambda answer: not final(answer)),
        wait=poll.wait(),
        before_sleep=waiting,
        sleep=anyio.sleep,
    )
    answer: T = await retrying(look)
    return answer


async def poll_batch(
    batch_id: str,
    retrieve: Callable[[str], Awaitable[Any]],
    progress: Callable[[Any], Progress],
    poll: Poll | None = None,
) -> Any:
    """Poll a batch (``retrieve``: the SDK's method reading it by id; ``progress``: the
    provider's reading of it), with ``poll``'s backoff, until it is final; the final
    batch. Each poll is logged at ``DEBUG``, the end at ``INFO``."""

    def waiting(batch: Any, delay: float) -> None:
        seen = progress(batch)
        logger.log(logging.DEBUG, "batch %s: %s; next poll in %.0f s", batch_id, seen, delay)

    def final(batch: Any) -> bool:
        return progress(batch).final

    batch = await poll_until(partial(retrieve, batch_id), final, poll or Poll(), waiting)
    logger.log(logging.INFO, "batch %s: %s", batch_id, progress(batch))
    return batch


#: The waits before a batch refused for the enqueued-token limit is created again: the
#: queue drains as other batches end, in minutes or hours, whatever the poll interval.
CREATE_BACKOFF = Poll(first=10.0, factor=1.5, longest=600.0)


@dataclass(frozen=True)
class Progress:
    """A batch as one poll saw it.

    Attributes:
        status: The provider's status (``validating``, ``in_progress``, ``ended``...).
        done: Lines answered.
        total: Lines in the batch (0 while OpenAI validates it).
        final: Whether nothing more will happen to it.
        unanswered: Lines that ended without an answer: failed, cancelled or expired.
    """

    status: str
    done: int
    total: int
    final: bool
    unanswered: int = 0

    def __str__(self) -> str:
        line = f"{self.status}, {self.done}/{self.total} lines done"
        return line + (f", {self.unanswered} unanswered" if self.unanswered else "")


class LineUsage(NamedTuple):
    """A line that got a reply: its id, how many items it carried, its tokens, and how
    many lines have carried its items (1 for the first)."""

    custom_id: str
    items: int
    usage: Usage
    attempt: int = 1


@dataclass
class JobOutcome:
    """What one job gave: per item key, a result or an error, and what was released."""

    state: str
    results: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    #: Items a reply answered with an invalid output, or not at all (worth asking again,
    #: unlike the items of a line the provider refused).
    invalid: list[str] = field(default_factory=list)
    #: Per line with a reply: its id, how many items it carried and its tokens.
    usage: list[LineUsage] = field(default_factory=list)
    #: What the job cost, once priced (NaN: not priced, or no price for its model).
    cost_usd: float = math.nan

    def __str__(self) -> str:
        line = f"{self.state}: {len(self.results)} results, {len(self.failures)} failed"
        return line + (f", {len(self.released)} released" if self.released else "")


def final_state(status: str, answered: bool) -> JobState:
    """The job's end: a "completed" batch in which no line was answered is a failure."""
    if status == "completed":
        return "completed" if answered else "failed"
    return "expired" if status == "expired" else "cancelled" if status == "cancelled" else "failed"


async def record_job(
    store: JobStore,
    job_id: str,
    status: str,
    outcomes: Mapping[str, LineOutcome],
    validate: Callable[[Any], Any],
) -> JobOutcome:
    """Record the lines of a job whose batch ended as ``status`` (in OpenAI's words),
    then finish the job in the store; what it gave."""
    lines = await anyio.to_thread.run_sync(store.job_lines, job_id)
    result = JobOutcome(state=status)
    await record_lines(store, lines, outcomes, validate, result)
    state = final_state(status, bool(result.results))
    await anyio.to_thread.run_sync(lambda: store.finish_job(job_id, state))
    result.state = state
    logger.log(logging.DEBUG, "batch job %s %s", job_id, result)
    return result


async def record_lines(
    store: JobStore,
    lines: Sequence[StoredLine],
    outcomes: Mapping[str, LineOutcome],
    validate: Callable[[Any], Any],
    into: JobOutcome,
) -> None:
    """Record every line of a job: replies split and validated here, then recorded in
    one transaction; lines without a reply released, each on its own."""
    answers: list[tuple[str, Mapping[str, Any], Mapping[str, str]]] = []
    for line in lines:
        outcome = outcomes.get(line.custom_id)
        if outcome is None or outcome.status == "retry":
            into.released += await anyio.to_thread.run_sync(store.expire_line, line.custom_id)
            continue
        results, failures = _answers(line, outcome, validate, into)
        if outcome.status == "ok":
            into.invalid += failures
        answers.append((line.custom_id, results, failures))
        into.results.update(results)
        into.failures.update(failures)
    await anyio.to_thread.run_sync(store.record_line_results, answers)


def _answers(
    line: StoredLine, outcome: LineOutcome, validate: Callable[[Any], Any], into: JobOutcome
) -> tuple[dict[str, Any], dict[str, str]]:
    """A line's results and failures from its reply (a failed line: every item failed)."""
    if outcome.status == "failed":
        return {}, dict.fromkeys(line.item_keys, outcome.error)
    into.usage.append(LineUsage(line.custom_id, len(line.item_keys), outcome.usage, line.attempt))
    truncated = outcome.finish_reason in ("length", "max_tokens")
    return split_line(
        line.item_keys, outcome.text, validate, plain=plain_reading(line.custom_id), cut=truncated
    )


def plain_custom_id(custom_id: str, output_schema: Mapping[str, Any]) -> str:
    """``custom_id`` marked as a plain line's, with how its reply reads: the output as
    text, wrapped in ``{"answer": ...}``, or an object (the store's ids never end so)."""
    if text_output(output_schema):
        return custom_id + "-pt"
    return custom_id + ("-pw" if wrapped_output(output_schema) else "-po")


def follow_up_line(line: StoredLine, custom_id: str) -> PlannedLine:
    """``line``'s request sent again, unchanged, under ``custom_id`` (a plain line's
    keeps the mark that says how its reply reads), for the items it carries."""
    mark = line.custom_id[-3:] if plain_reading(line.custom_id) else ""
    new = custom_id + mark
    return PlannedLine(new, {**line.request, "custom_id": new}, line.item_keys)


def plain_reading(custom_id: str) -> str | None:
    """How a plain line's reply reads (``"text"``, ``"wrapped"``, ``"object"``), or
    ``None`` for a packed line."""
    return _PLAIN_MARKS.get(custom_id[-3:])


def split_line(
    keys: Sequence[str],
    text: str,
    validate: Callable[[Any], Any],
    *,
    plain: str | None = None,
    cut: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Per item key, the validated output (as JSON) or why there is none.

    ``plain`` is how a plain line's reply reads (:func:`plain_reading`); ``cut``, that
    the reply was cut off by the token cap."""
    ids = make_ids(len(keys))
    split: Split[Any]
    if plain is not None and len(keys) == 1:
        as_text, wrapped = plain == "text", plain == "wrapped"
        split = split_plain(text, validate, truncated=cut, as_text=as_text, wrapped=wrapped)
        ids = split.ids
    else:
        split = split_reply(text, ids, validate, truncated=cut)
    by_id: Mapping[str, str] = dict(zip(ids, keys, strict=True))
    results = {by_id[i]: _jsonable(value) for i, value in split.values.items()}
    failures = {by_id[i]: str(failure) for i, failure in split.failures.items()}
    return results, failures


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value
