"""What ``coalesce jobs wait | cancel | resume`` do at the provider: poll a job's batch
with a progress display, cancel it, submit it, collect its results into the store with
their cost (:func:`job_cost`, the batch lane's own pricing), and plan the follow-up
jobs ``resume`` sends for lines that got no answer (:func:`plan_follow_ups`).

The provider's client is the official SDK's, built from the environment (see
:func:`connect`). Submitting and collecting are those of the batch lane itself
(:mod:`~coalesce._lanes.openai_jobs`, :mod:`~coalesce._lanes.anthropic_jobs`), so a
job is never submitted twice, whichever process submits it. Only the waiting is this
module's own: it polls with the same backoff and reports each answer as it comes.

Results are checked only as JSON here (:func:`json_value`): the command line does
not have the decorated function's output type. The function validates each result
again, against that type, when it reads the store.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio

from coalesce._exceptions import ConfigurationError
from coalesce._lanes import anthropic_jobs, openai_jobs
from coalesce._lanes.records import BatchJob, Provider, StoredLine
from coalesce._lanes.results import JobOutcome, Poll, Progress, follow_up_line, poll_until
from coalesce._lanes.store import JobStore
from coalesce._observe.savings import lane_cost
from coalesce._pricing import price_for

__all__ = [
    "API",
    "FOLLOW_UP_KEY",
    "PROGRAM_HINT",
    "RESUME_HINT",
    "Connection",
    "Display",
    "Progress",
    "ProviderFailure",
    "batch_id_of",
    "cancel_job",
    "check_base_url",
    "connect",
    "duration",
    "follow_up_lines",
    "job_cost",
    "json_value",
    "outcome_line",
    "plan_follow_ups",
    "progress_line",
    "resume_job",
    "wait_job",
]


#: The metadata key naming the job a follow-up job asks again for.
FOLLOW_UP_KEY = "coalesce_follow_up_of"


class ProviderFailure(Exception):
    """The provider refused a call or could not be reached (its error is the cause)."""


# --- progress: pure ------------------------------------------------------------------


def duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h07m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_line(label: str, progress: Progress, elapsed: float, *, bar: int = 0) -> str:
    """One progress report: a ``bar`` characters wide bar first when ``bar`` > 0, its
    lines answered drawn ``#``, those that ended unanswered ``x``."""
    if bar <= 0:
        return f"{label}: {progress}, {duration(elapsed)}"
    total = progress.total
    done = bar * progress.done // total if total else 0
    ended = bar * (progress.done + progress.unanswered) // total if total else 0
    drawn = "#" * done + "x" * (ended - done) + "." * (bar - ended)
    counts = f"{progress.done}/{total} lines"
    if progress.unanswered:
        counts += f", {progress.unanswered} unanswered"
    return f"{label} [{drawn}] {counts}  {progress.status}  {duration(elapsed)}"


class Display:
    """Shows each poll on ``stream``: one bar redrawn in place (``\\r``) on a terminal,
    a plain line per poll otherwise (a log, a pipe, CI)."""

    BAR = 30

    def __init__(self, stream: TextIO, label: str) -> None:
        self._stream = stream
        self._label = label
        self._tty = stream.isatty()
        self._start = anyio.current_time()
        self._width = 0

    def show(self, progress: Progress) -> None:
        elapsed = anyio.current_time() - self._start
        line = progress_line(self._label, progress, elapsed, bar=self.BAR if self._tty else 0)
        if self._tty:
            # Pad to the last width so a shorter line leaves nothing of the longer one.
            self._stream.write("\r" + line.ljust(self._width))
            self._width = max(self._width, len(line))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self) -> None:
        """End the bar's line, so that what is printed next starts on its own."""
        if self._tty and self._width:
            self._stream.write("\n")
            self._stream.flush()
            self._width = 0


# --- what the commands say -------------------------------------------------------


#: What asks again the items a job left unanswered, as ``wait`` and ``cancel`` say.
PROGRAM_HINT = "run the program again: its batch lane asks them in a follow-up job"
RESUME_HINT = "`coalesce jobs resume` asks them again in a follow-up job"


def outcome_line(job: BatchJob, outcome: JobOutcome, hint: str = PROGRAM_HINT) -> str:
    """What ``wait``, ``cancel`` and ``resume`` say of a job they collected; ``hint``
    says what asks its unanswered items again (empty: nothing to say)."""
    line = (
        f"job {job.id} {outcome.state}: {len(outcome.results)} results,"
        f" {len(outcome.failures)} failed"
    )
    if outcome.released:
        line += f", {len(outcome.released)} unanswered and pending again"
        line += f" ({hint})" if hint else ""
    if outcome.usage and math.isnan(outcome.cost_usd):
        line += f"; no price is known for {job.model}, so its cost is not recorded"
    return line


def check_base_url(providers: Sequence[Provider], base_url: str | None) -> None:
    """``--base-url`` names one provider's endpoint: refuse it for jobs of two.

    Raises:
        ConfigurationError: ``base_url`` is given and ``providers`` holds more than one.
    """
    if base_url is not None and len(set(providers)) > 1:
        raise ConfigurationError(
            f"--base-url {base_url} would serve jobs of {' and '.join(sorted(set(providers)))};"
            f" add --provider to resume one provider's jobs, or set OPENAI_BASE_URL and"
            f" ANTHROPIC_BASE_URL instead"
        )


# --- providers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    """What the commands need of one provider's batch API."""

    provider: Provider
    client_class: str
    key_variable: str
    url_variable: str
    retrieve: Callable[[Any, str], Awaitable[Any]]
    cancel: Callable[[Any, str], Awaitable[Any]]
    progress: Callable[[Any], Progress]
    submit: Callable[[JobStore, Any, BatchJob, Poll], Awaitable[str]]
    collect: Callable[[JobStore, Any, BatchJob, Any, Callable[[Any], Any]], Awaitable[JobOutcome]]
    #: Whether a final batch was refused at validation, having run nothing (OpenAI's
    #: enqueued-token limit): the job's ``submit`` creates it again.
    refused: Callable[[Any], bool] = lambda batch: False


API: Mapping[Provider, Api] = {
    "openai": Api(
        "openai",
        "AsyncOpenAI",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        retrieve=lambda client, batch_id: client.batches.retrieve(batch_id),
        cancel=lambda client, batch_id: client.batches.cancel(batch_id),
        progress=openai_jobs.progress,
        submit=lambda store, client, job, poll: openai_jobs.submit(store, client, job, poll),
        collect=openai_jobs.collect,
        refused=openai_jobs.token_refused,
    ),
    "anthropic": Api(
        "anthropic",
        "AsyncAnthropic",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        retrieve=lambda client, batch_id: client.messages.batches.retrieve(batch_id),
        cancel=lambda client, batch_id: client.messages.batches.cancel(batch_id),
        progress=anthropic_jobs.progress,
        submit=anthropic_jobs.submit,
        collect=anthropic_jobs.collect,
    ),
}


@dataclass(frozen=True)
class Connection:
    """One provider's API, its SDK client, and the SDK's root exception type."""

    api: Api
    client: Any
    errors: type[Exception]

    @contextmanager
    def calls(self) -> Iterator[None]:
        """Turn the SDK's errors into :class:`ProviderFailure` (the SDK's as its cause)."""
        try:
            yield
        except self.errors as exc:
            raise ProviderFailure(
                f"the {self.api.provider} API failed: {exc}. Nothing recorded is lost: check"
                f" {self.api.key_variable} and {self.api.url_variable} (or --base-url), then"
                f" run the command again"
            ) from exc


@asynccontextmanager
async def connect(provider: Provider, base_url: str | None) -> AsyncIterator[Connection]:
    """The official SDK's async client, built from the environment, closed on exit.

    ``openai.AsyncOpenAI()`` reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``,
    ``anthropic.AsyncAnthropic()`` reads ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``;
    ``base_url`` overrides the latter.

    Raises:
        ConfigurationError: the API key's variable is unset or empty, or the SDK is not
            installed.
    """
    api = API[provider]
    if not os.environ.get(api.key_variable):
        raise ConfigurationError(
            f"{api.key_variable} is not set, and the job is on {provider}'s batch API:"
            f" export {api.key_variable} (the key of the account the job belongs to)"
        )
    try:
        sdk = importlib.import_module(provider)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {provider} SDK is not installed: pip install 'coalesce[{provider}]'"
        ) from exc
    async with getattr(sdk, api.client_class)(base_url=base_url) as client:
        yield Connection(api, client, sdk.APIError)


# --- commands ------------------------------------------------------------------------


def json_value(value: Any) -> Any:
    """The validator of results collected here: ``value`` as it is, if it is JSON.

    The decorated function validates it again, against its output type, when it
    reads the store.

    Raises:
        ValueError: ``value`` is not JSON (e.g. ``NaN``); the item is recorded failed.
    """
    json.dumps(value, allow_nan=False)
    return value


async def watch(conn: Connection, batch_id: str, poll: Poll, display: Display) -> Any:
    """Poll the batch, with backoff, showing each answer, until it is final; the batch."""

    async def look() -> Any:
        batch = await conn.api.retrieve(conn.client, batch_id)
        display.show(conn.api.progress(batch))
        return batch

    try:
        return await poll_until(look, lambda batch: conn.api.progress(batch).final, poll)
    finally:
        display.close()


async def wait_job(
    store: JobStore, conn: Connection, job: BatchJob, poll: Poll, display: Display
) -> JobOutcome:
    """Wait for a submitted job's batch to be final, then collect its results."""
    return await _finish(store, conn, job, batch_id_of(job, "wait for"), poll, display)


async def cancel_job(
    store: JobStore, conn: Connection, job: BatchJob, poll: Poll, display: Display
) -> JobOutcome:
    """Ask the provider to cancel the job's batch (unless it is final already), wait for
    it to end, and collect what it finished; the lines it did not finish release their
    items, which stay pending for a follow-up job."""
    batch_id = batch_id_of(job, "cancel")
    batch = await conn.api.retrieve(conn.client, batch_id)
    if not conn.api.progress(batch).final:
        await conn.api.cancel(conn.client, batch_id)
    return await _finish(store, conn, job, batch_id, poll, display)


async def resume_job(
    store: JobStore, conn: Connection, job: BatchJob, poll: Poll, display: Display
) -> JobOutcome:
    """Take an unfinished job to its end: submit it if it never was (the batch lane's own
    submit, which finds a batch created before a crash instead of creating another),
    then wait for it and collect its results."""
    batch_id = await conn.api.submit(store, conn.client, job, poll)
    return await _finish(store, conn, job, batch_id, poll, display)


def follow_up_lines(
    store: JobStore, max_attempts: int, provider: Provider | None = None
) -> list[tuple[BatchJob, list[StoredLine]]]:
    """Each job with lines ``resume`` sends again (only ``provider``'s, unless ``None``),
    and those lines, oldest job first.

    They are the lines that got no answer (an expired batch, a 429 or 5xx; see
    :meth:`~coalesce._lanes.store.JobStore.unanswered_lines`) whose items were asked
    fewer than ``max_attempts`` times, the follow-up included. Items released from a
    line that was answered in part are not among them: asking them needs the
    function's instructions and output type.
    """
    by_job: dict[str, list[StoredLine]] = {}
    for line in store.unanswered_lines():
        if _asked(store, line) < max_attempts:
            by_job.setdefault(line.job_id, []).append(line)
    jobs = {job_id: store.get_job(job_id) for job_id in by_job}
    return [
        (job, by_job[job_id])
        for job_id, job in jobs.items()
        if job is not None and provider in (None, job.provider)
    ]


def plan_follow_ups(
    store: JobStore, max_attempts: int, provider: Provider | None = None
) -> list[BatchJob]:
    """Plan one follow-up job per job with :func:`follow_up_lines`: each line's request
    sent again as it is, under a new ``custom_id``; the follow-ups, oldest job's first."""
    return [
        store.plan_job(
            job.provider,
            job.model,
            job.lane,
            [follow_up_line(line, store.new_custom_id()) for line in lines],
            metadata={FOLLOW_UP_KEY: job.id},
        )
        for job, lines in follow_up_lines(store, max_attempts, provider)
    ]


def _asked(store: JobStore, line: StoredLine) -> int:
    """How many lines the most asked of ``line``'s items has been sent in."""
    return max((item.attempts for item in store.get_many(line.item_keys) if item), default=0)


def batch_id_of(job: BatchJob, doing: str) -> str:
    """The job's batch id.

    Raises:
        ConfigurationError: the job was never submitted, so there is no batch to ``doing``.
    """
    if job.provider_batch_id is None:
        raise ConfigurationError(
            f"job {job.id} is {job.state}: it was never submitted, so there is no batch to"
            f" {doing}; `coalesce jobs resume` submits it"
        )
    return job.provider_batch_id


async def _finish(
    store: JobStore, conn: Connection, job: BatchJob, batch_id: str, poll: Poll, display: Display
) -> JobOutcome:
    """Watch the batch to its end (a batch refused at validation is created again, by
    the job's own ``submit``), collect its results and record its cost."""
    batch = await watch(conn, batch_id, poll, display)
    if conn.api.refused(batch):
        current = await anyio.to_thread.run_sync(store.get_job, job.id)
        batch_id = await conn.api.submit(store, conn.client, current or job, poll)
        batch = await watch(conn, batch_id, poll, display)
    outcome = await conn.api.collect(store, conn.client, job, batch, json_value)
    outcome.cost_usd = job_cost(job, outcome)
    if not math.isnan(outcome.cost_usd):
        await anyio.to_thread.run_sync(
            lambda: store.finish_job(job.id, outcome.state, cost_usd=outcome.cost_usd)  # type: ignore[arg-type]
        )
    return outcome


def job_cost(job: BatchJob, outcome: JobOutcome) -> float:
    """What the lines of ``outcome`` cost, at the price of the job's model
    (:data:`~coalesce.DEFAULT_PRICES`) and lane, as the batch lane prices them in
    process; NaN when the model has no price."""
    price = price_for(job.model)
    return sum((lane_cost(line.usage, price, job.lane) for line in outcome.usage), 0.0)
