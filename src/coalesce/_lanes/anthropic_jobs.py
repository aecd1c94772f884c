"""Anthropic message batches, durable: submit once, attach after a crash, keep results.

As for OpenAI (:mod:`coalesce._lanes.openai_jobs`), the job, its lines and items are
in the store before anything leaves the process, and the batch id is recorded as soon
as the create returns. Anthropic's batches carry no metadata, so a batch created just
before a crash (before its id was recorded) is found again by its requests instead:
among the batches the store does not already claim, one with as many requests as the
job has lines, whose results (once it has ended) carry exactly the job's custom_ids.
The search waits for such candidates to end before deciding, so a restarted process
may wait, but never submits a job twice. A create refused with 429 (the enqueued-token
limit, or the rate limit) created nothing: it is sent again after a backoff, up to
:data:`CREATE_ATTEMPTS` times. Each step is logged on the ``"coalesce"`` logger as it
happens: the creation at ``INFO``, each poll at ``DEBUG``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt

from .._observe.events import logger
from .lines import LineOutcome, as_json, read_anthropic_result
from .records import BatchJob
from .results import CREATE_BACKOFF, JobOutcome, Poll, Progress, poll_batch, record_job
from .resume import Steps
from .store import JobStore

__all__ = ["CREATE_ATTEMPTS", "collect", "progress", "resume", "submit", "wait"]

#: Creates of one job that 429s may refuse before the refusal stands.
CREATE_ATTEMPTS = 12


async def submit(store: JobStore, client: Any, job: BatchJob, poll: Poll | None = None) -> str:
    """Take ``job`` to ``submitted``; its batch id."""
    if job.provider_batch_id is not None:
        return job.provider_batch_id
    lines = await anyio.to_thread.run_sync(store.job_lines, job.id)
    ours = {line.custom_id for line in lines}
    found = await _find(store, client, ours, poll)
    if found is None:
        found = await _create(client, [as_json(line.request) for line in lines])
    await anyio.to_thread.run_sync(store.mark_submitted, job.id, found)
    logger.log(
        logging.INFO, "batch job %s: submitted as batch %s (%d lines)", job.id, found, len(lines)
    )
    return found


async def _create(client: Any, requests: list[Any]) -> str:
    """Create the batch; a 429 (nothing was created) is retried after a backoff."""

    async def create() -> str:  # a coroutine function: the SDK's methods may not look like one
        return str((await client.messages.batches.create(requests=requests)).id)

    retrying = AsyncRetrying(
        retry=retry_if_exception(lambda exc: getattr(exc, "status_code", None) == 429),
        stop=stop_after_attempt(CREATE_ATTEMPTS),
        wait=CREATE_BACKOFF.wait(),
        sleep=anyio.sleep,
        reraise=True,
    )
    batch_id: str = await retrying(create)
    return batch_id


async def _find(
    store: JobStore, client: Any, custom_ids: set[str], poll: Poll | None
) -> str | None:
    """An unclaimed batch whose results carry exactly ``custom_ids``, if any."""
    for batch in await _batches(client):
        total = _total(batch)
        claimed = await anyio.to_thread.run_sync(store.job_for_batch, batch.id)
        if claimed is not None or total != len(custom_ids):
            continue
        ended = await wait(client, batch.id, poll)
        if {outcome.custom_id for outcome in await _results(client, ended.id)} == custom_ids:
            return str(batch.id)
    return None


async def _batches(client: Any) -> list[Any]:
    # Page by page: leaving an ``async for`` early leaves the SDK's generator unclosed.
    page = await client.messages.batches.list(limit=100)
    batches = list(page.data)
    while page.has_next_page():
        page = await page.get_next_page()
        batches.extend(page.data)
    return batches


def _total(batch: Any) -> int:
    counts = batch.request_counts
    return int(
        counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
    )


def progress(batch: Any) -> Progress:
    """A message batch's progress; requests that ended unanswered (errored, cancelled,
    expired) are not counted as done."""
    counts = batch.request_counts
    unanswered = counts.errored + counts.canceled + counts.expired
    status = str(batch.processing_status)
    total = counts.succeeded + unanswered + counts.processing
    return Progress(status, counts.succeeded, total, status == "ended", unanswered)


async def wait(client: Any, batch_id: str, poll: Poll | None = None) -> Any:
    """Poll the batch, with backoff, until it has ended; the ended batch."""
    return await poll_batch(batch_id, client.messages.batches.retrieve, progress, poll)


async def _results(client: Any, batch_id: str) -> list[LineOutcome]:
    entries = await client.messages.batches.results(batch_id)
    return [read_anthropic_result(entry.model_dump()) async for entry in entries]


def _status(batch: Any) -> str:
    """The ended batch in OpenAI's words: expired or cancelled when some requests were."""
    counts = batch.request_counts
    if counts.expired:
        return "expired"
    return "cancelled" if counts.canceled else "completed"


async def collect(
    store: JobStore, client: Any, job: BatchJob, batch: Any, validate: Callable[[Any], Any]
) -> JobOutcome:
    """Read every request's result, split and validate it, record it in the store."""
    outcomes = {outcome.custom_id: outcome for outcome in await _results(client, batch.id)}
    return await record_job(store, job.id, _status(batch), outcomes, validate)


#: Finish every unfinished Anthropic job in the store (:meth:`Steps.resume`).
resume = Steps("anthropic", submit, wait, collect).resume
