"""OpenAI batch jobs, durable: submit once, attach after a crash, keep every result.

The order of writes is what makes a crash harmless (see :mod:`coalesce._lanes.store`):

1. the job, its lines and their items are written to the store (``planned``) before
   anything leaves the process;
2. the input file is uploaded and its id recorded (``uploaded``);
3. before creating the batch, the provider's list is searched for a batch whose
   metadata names this job (a crash between create and step 4 left one there);
   only if there is none is the batch created, with that metadata;
4. the batch id is recorded (``submitted``) as soon as the create returns, while the
   batch validates, so that ``coalesce jobs`` sees it and can wait for it. A batch
   refused at validation for the enqueued-token limit (too many tokens of the model
   already queued) takes the job back to ``uploaded`` and is created again after a
   backoff, up to :data:`CREATE_ATTEMPTS` times (the search in step 3 skips such
   refused batches).

A process started again calls :func:`resume`: every unfinished job continues from the
step it reached, so nothing is submitted (or billed) twice. Results are read by
``custom_id`` from the output and error files; a packed line's reply is split per item
and validated; lines that did not finish (expiry, cancellation, 429/5xx) release their
items for a follow-up job. Each step is logged on the ``"coalesce"`` logger as it
happens: the upload and the creation at ``INFO``, each poll at ``DEBUG``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
from tenacity import AsyncRetrying, retry_if_result

from .._observe.events import logger
from .lines import LineOutcome, jsonl, read_openai_line
from .records import JOB_METADATA_KEY, BatchJob
from .results import (
    CREATE_BACKOFF,
    JobOutcome,
    Poll,
    Progress,
    poll_batch,
    poll_until,
    record_job,
)
from .resume import Steps
from .store import JobStore

__all__ = [
    "CREATE_ATTEMPTS",
    "collect",
    "progress",
    "resume",
    "submit",
    "token_refused",
    "wait",
]

#: Batch states after which nothing more will happen.
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})

#: Creates of one job a full queue (the enqueued-token limit) may refuse before the
#: refusal stands (and the job's items go to a follow-up job).
CREATE_ATTEMPTS = 12


def token_refused(batch: Any) -> bool:
    """Whether the batch failed validation for the enqueued-token limit."""
    errors = getattr(getattr(batch, "errors", None), "data", None) or ()
    return batch.status == "failed" and any(
        getattr(error, "code", None) == "token_limit_exceeded" for error in errors
    )


def progress(batch: Any) -> Progress:
    """A batch's progress; lines that ended unanswered (failed, cancelled, expired)
    are not counted as done. Its counts are missing while it validates."""
    counts = batch.request_counts
    done = 0 if counts is None else counts.completed
    total = 0 if counts is None else counts.total
    unanswered = 0 if counts is None else counts.failed
    return Progress(str(batch.status), done, total, batch.status in TERMINAL, unanswered)


async def submit(store: JobStore, client: Any, job: BatchJob, poll: Poll | None = None) -> str:
    """Take ``job`` from wherever it stopped to ``submitted`` and past validation; its
    batch id."""
    batch_id = job.provider_batch_id or await _find(client, job.id)
    if batch_id is None:
        file_id = job.input_file_id or await _upload(store, client, job)
        batch_id = await _create(store, client, job, file_id)
    elif job.provider_batch_id is None:
        await anyio.to_thread.run_sync(store.mark_submitted, job.id, batch_id)
    return await _validated(store, client, job, batch_id, poll or Poll())


async def _create(store: JobStore, client: Any, job: BatchJob, file_id: str) -> str:
    """Create the job's batch from ``file_id`` and record it at once, while it validates."""
    batch = await client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=dict(job.metadata),
    )
    await anyio.to_thread.run_sync(store.mark_submitted, job.id, batch.id)
    logger.log(logging.INFO, "batch job %s: created batch %s (%s)", job.id, batch.id, batch.status)
    return str(batch.id)


async def _validated(store: JobStore, client: Any, job: BatchJob, batch_id: str, poll: Poll) -> str:
    """Wait for the batch to pass validation; one refused for the enqueued-token limit
    is created again after a backoff (the queue drains as other batches finish), up to
    :data:`CREATE_ATTEMPTS` creates in all. The id of the job's batch."""
    batch_ids: list[str] = [batch_id]
    refused: list[Any] = []  # the batch the limit refused, until it is created again

    async def created() -> bool:
        """One create's batch past validation; whether it must be created again."""
        if refused:  # the backoff has passed: create the refused batch again
            batch_ids.append(await _create(store, client, job, str(refused.pop().input_file_id)))
        current = batch_ids[-1]

        def waiting(_: Any, delay: float) -> None:
            logger.log(logging.DEBUG, "batch %s: validating; next poll in %.0f s", current, delay)

        retrieve = partial(client.batches.retrieve, current)
        batch = await poll_until(retrieve, _past_validation, poll, waiting)
        if not token_refused(batch) or len(batch_ids) == CREATE_ATTEMPTS:
            return False
        logger.log(
            logging.INFO,
            "batch job %s: batch %s refused for the enqueued-token limit; creating it again",
            job.id,
            current,
        )
        if not await anyio.to_thread.run_sync(store.mark_refused, job.id, current):
            batch_ids.append(await _current_batch(store, job.id, current))
            return False
        refused.append(batch)
        return True

    backoff = AsyncRetrying(
        retry=retry_if_result(bool), wait=CREATE_BACKOFF.wait(), sleep=anyio.sleep
    )
    await backoff(created)
    return batch_ids[-1]


def _past_validation(batch: Any) -> bool:
    return bool(batch.status != "validating")


async def _current_batch(store: JobStore, job_id: str, refused: str) -> str:
    """The batch another process created for the job after ``refused`` (else ``refused``)."""
    job = await anyio.to_thread.run_sync(store.get_job, job_id)
    return refused if job is None or job.provider_batch_id is None else job.provider_batch_id


async def _upload(store: JobStore, client: Any, job: BatchJob) -> str:
    lines = await anyio.to_thread.run_sync(store.job_lines, job.id)
    data = jsonl(line.request for line in lines)
    upload = await client.files.create(file=(f"{job.id}.jsonl", data), purpose="batch")
    await anyio.to_thread.run_sync(store.mark_uploaded, job.id, upload.id)
    logger.log(
        logging.INFO,
        "batch job %s: uploaded %d lines (%d bytes) as %s",
        job.id,
        len(lines),
        len(data),
        upload.id,
    )
    return str(upload.id)


async def _find(client: Any, job_id: str) -> str | None:
    """A batch already created for ``job_id`` (its metadata names it), if any."""
    # Page by page rather than ``async for``: leaving that loop early leaves the SDK's
    # async generator unclosed.
    page = await client.batches.list(limit=100)
    while True:
        for batch in page.data:
            ours = (batch.metadata or {}).get(JOB_METADATA_KEY) == job_id
            if ours and not token_refused(batch):
                return str(batch.id)
        if not page.has_next_page():
            return None
        page = await page.get_next_page()


async def wait(client: Any, batch_id: str, poll: Poll | None = None) -> Any:
    """Poll the batch, with backoff, until it is final; the final batch object."""
    return await poll_batch(batch_id, client.batches.retrieve, progress, poll)


async def collect(
    store: JobStore, client: Any, job: BatchJob, batch: Any, validate: Callable[[Any], Any]
) -> JobOutcome:
    """Read every line's result, split and validate it, record it in the store."""
    outcomes: dict[str, LineOutcome] = {}
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            text = (await client.files.content(file_id)).text
            for raw in text.splitlines():
                if raw.strip():
                    outcome = read_openai_line(json.loads(raw))
                    outcomes[outcome.custom_id] = outcome
    return await record_job(store, job.id, str(batch.status), outcomes, validate)


#: Finish every unfinished OpenAI job in the store (:meth:`Steps.resume`).
resume = Steps("openai", submit, wait, collect).resume
