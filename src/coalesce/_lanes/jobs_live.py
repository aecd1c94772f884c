"""What ``coalesce jobs wait | cancel | resume`` do at the provider: poll a job's batch
with a progress display, cancel it, submit it, and collect its results into the store.

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
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio

from coalesce._exceptions import ConfigurationError
from coalesce._lanes import anthropic_jobs, openai_jobs
from coalesce._lanes.records import BatchJob, Provider
from coalesce._lanes.results import JobOutcome, Poll
from coalesce._lanes.store import JobStore

__all__ = [
    "API",
    "Connection",
    "Display",
    "Progress",
    "ProviderFailure",
    "batch_id_of",
    "cancel_job",
    "check_base_url",
    "connect",
    "duration",
    "json_value",
    "outcome_line",
    "poll_every",
    "progress_line",
    "resume_job",
    "wait_job",
]


class ProviderFailure(Exception):
    """The provider refused a call or could not be reached (its error is the cause)."""


# --- progress: pure ------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """A batch as one poll saw it: its status, lines finished of all, and whether it is final."""

    status: str
    done: int
    total: int
    final: bool


def openai_progress(batch: Any) -> Progress:
    """An OpenAI batch's progress (its counts are missing while it validates)."""
    counts = batch.request_counts
    done = 0 if counts is None else counts.completed + counts.failed
    total = 0 if counts is None else counts.total
    return Progress(str(batch.status), done, total, batch.status in openai_jobs.TERMINAL)


def anthropic_progress(batch: Any) -> Progress:
    """An Anthropic message batch's progress."""
    counts = batch.request_counts
    finished = counts.succeeded + counts.errored + counts.canceled + counts.expired
    status = str(batch.processing_status)
    return Progress(status, finished, finished + counts.processing, status == "ended")


def duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h07m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_line(label: str, progress: Progress, elapsed: float, *, bar: int = 0) -> str:
    """One progress report: a ``bar`` characters wide bar first when ``bar`` > 0."""
    counts = f"{progress.done}/{progress.total} lines"
    if bar <= 0:
        return f"{label}: {progress.status}, {counts} done, {duration(elapsed)}"
    filled = bar * progress.done // progress.total if progress.total else 0
    drawn = "#" * filled + "." * (bar - filled)
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


def outcome_line(job: BatchJob, outcome: JobOutcome) -> str:
    """What ``wait``, ``cancel`` and ``resume`` say of a job they collected."""
    line = (
        f"job {job.id} {outcome.state}: {len(outcome.results)} results,"
        f" {len(outcome.failures)} failed"
    )
    if not outcome.released:
        return line
    return (
        f"{line}, {len(outcome.released)} unanswered and pending again (run the program"
        f" again: its batch lane asks them in a follow-up job)"
    )


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


API: Mapping[Provider, Api] = {
    "openai": Api(
        "openai",
        "AsyncOpenAI",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        retrieve=lambda client, batch_id: client.batches.retrieve(batch_id),
        cancel=lambda client, batch_id: client.batches.cancel(batch_id),
        progress=openai_progress,
        submit=lambda store, client, job, poll: openai_jobs.submit(store, client, job, poll),
        collect=openai_jobs.collect,
    ),
    "anthropic": Api(
        "anthropic",
        "AsyncAnthropic",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        retrieve=lambda client, batch_id: client.messages.batches.retrieve(batch_id),
        cancel=lambda client, batch_id: client.messages.batches.cancel(batch_id),
        progress=anthropic_progress,
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
    delays = poll.delays()
    try:
        while True:
            batch = await conn.api.retrieve(conn.client, batch_id)
            progress = conn.api.progress(batch)
            display.show(progress)
            if progress.final:
                return batch
            await anyio.sleep(delays())
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
    batch = await watch(conn, batch_id, poll, display)
    return await conn.api.collect(store, conn.client, job, batch, json_value)


def poll_every(longest: float) -> Poll:
    """Polls from 5 s (or ``longest`` if shorter), backing off by 1.5 up to ``longest``."""
    return Poll(first=min(5.0, longest), factor=1.5, longest=longest)
