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

__all__ = ["Owns", "Steps"]

#: Whether a job is the resuming lane's to finish (called in a worker thread: it may
#: read the store). The drop-in client's lanes each finish only their own jobs.
Owns = Callable[[BatchJob], bool]


class Steps(NamedTuple):
    """One provider's ways to take a job from the store to its outcome.

    Attributes:
        provider: Whose jobs these are.
        submit: ``(store, client, job, poll)``: the job ``submitted``; its batch id.
        wait: ``(client, batch_id, poll)``: the batch once it has ended.
        collect: ``(store, client, job, batch, validate)``: the job's results, recorded.
    """

    provider: Provider
    submit: Callable[[JobStore, Any, BatchJob, Poll | None], Awaitable[str]]
    wait: Callable[[Any, str, Poll | None], Awaitable[Any]]
    collect: Callable[[JobStore, Any, BatchJob, Any, Callable[[Any], Any]], Awaitable[JobOutcome]]

    async def resume(
        self,
        store: JobStore,
        client: Any,
        validate: Callable[[Any], Any],
        poll: Poll | None = None,
        owns: Owns | None = None,
    ) -> dict[str, JobOutcome]:
        """Finish every unfinished job of the provider in the store (those ``owns`` says
        are the caller's, if given), one after another: submit what was not submitted,
        attach to what was, collect the results. Per local job id, its outcome."""

        def unfinished() -> list[BatchJob]:
            jobs = [job for job in store.unfinished_jobs() if job.provider == self.provider]
            return jobs if owns is None else [job for job in jobs if owns(job)]

        jobs = await anyio.to_thread.run_sync(unfinished)
        outcomes: dict[str, JobOutcome] = {}
        for job in jobs:
            batch_id = await self.submit(store, client, job, poll)
            batch = await self.wait(client, batch_id, poll)
            outcomes[job.id] = await self.collect(store, client, job, batch, validate)
        return outcomes
