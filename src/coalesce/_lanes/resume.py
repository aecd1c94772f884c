"""Finishing the jobs an earlier process left unfinished, whatever the provider: each
is submitted (if it never was), waited for and collected, by that provider's steps
(:mod:`~coalesce._lanes.openai_jobs`, :mod:`~coalesce._lanes.anthropic_jobs`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio

from .records import BatchJob, Provider
from .results import JobOutcome, Poll
from .store import JobStore

__all__ = ["Owns", "Steps", "resume_jobs"]

#: Whether a job is the resuming lane's to finish (called in a worker thread: it may
#: read the store). The drop-in client's lanes each finish only their own jobs.
Owns = Callable[[BatchJob], bool]


class Steps(NamedTuple):
    """One provider's ways to take a job from the store to its outcome.

    Attributes:
        submit: ``(store, client, job, poll)``: the job ``submitted``; its batch id.
        wait: ``(client, batch_id, poll)``: the batch once it has ended.
        collect: ``(store, client, job, batch, validate)``: the job's results, recorded.
    """

    submit: Callable[[JobStore, Any, BatchJob, Poll | None], Awaitable[str]]
    wait: Callable[[Any, str, Poll | None], Awaitable[Any]]
    collect: Callable[[JobStore, Any, BatchJob, Any, Callable[[Any], Any]], Awaitable[JobOutcome]]


async def resume_jobs(
    provider: Provider,
    steps: Steps,
    store: JobStore,
    client: Any,
    validate: Callable[[Any], Any],
    poll: Poll | None,
    owns: Owns | None = None,
) -> dict[str, JobOutcome]:
    """Finish every unfinished job of ``provider`` in the store (those ``owns`` says are
    this caller's, if given), one after another; per local job id, its outcome."""

    def unfinished() -> list[BatchJob]:
        jobs = [job for job in store.unfinished_jobs() if job.provider == provider]
        return jobs if owns is None else [job for job in jobs if owns(job)]

    jobs = await anyio.to_thread.run_sync(unfinished)
    outcomes: dict[str, JobOutcome] = {}
    for job in jobs:
        batch_id = await steps.submit(store, client, job, poll)
        batch = await steps.wait(client, batch_id, poll)
        outcomes[job.id] = await steps.collect(store, client, job, batch, validate)
    return outcomes
