"""The job store's job writes: a job planned with its lines, uploaded, submitted and
finished (see :mod:`coalesce._lanes.store` for the states a job moves through)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import get_args

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.connection import StoreConnection
from coalesce._lanes.records import (
    FINISHED_JOB_STATES,
    UNFINISHED_LINE_STATES,
    BatchJob,
    DeferredLane,
    JobState,
    LineState,
    PlannedLine,
    Provider,
)
from coalesce._lanes.schema import among, dump_json, job_metadata_json
from coalesce._lanes.statements import (
    insert_line,
    release_line,
    require_job,
    set_batch_id,
    touch_job,
)

__all__ = ["JobWrites"]


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigurationError(f"{name}={value!r} is not one of {', '.join(allowed)}")


class JobWrites(StoreConnection):
    """The job writes of :class:`~coalesce._lanes.store.JobStore`."""

    def plan_job(
        self,
        provider: Provider,
        model: str,
        lane: DeferredLane,
        lines: Sequence[PlannedLine],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> BatchJob:
        """Write a job (``planned``), its lines, and assign their items, in ONE transaction.

        Call it before uploading anything. The job's metadata gets ``coalesce_job`` = the
        local job id, to find it again in the provider's list after a crash. Durable when
        it returns; on any refusal nothing at all is written.

        Raises:
            ConfigurationError: (a ``ValueError``) no lines, a line with no items, a
                ``custom_id`` already in the store (or twice in this plan), an item not
                in the store, already assigned to an unfinished line, already done, or
                for another model; or a bad ``provider``/``lane``.
        """
        _check_choice("provider", provider, get_args(Provider))
        _check_choice("lane", lane, get_args(DeferredLane))
        if not lines:
            raise ConfigurationError("plan_job() got no lines; a job needs at least one")
        requests = [
            dump_json(line.request, f"the request of line {line.custom_id}") for line in lines
        ]
        job_id = uuid.uuid4().hex
        meta = job_metadata_json(job_id, metadata)
        with self._write() as cur:
            now = self._clock()
            cur.execute(
                "INSERT INTO jobs (id, provider, model, state, metadata, lane, created_at,"
                " updated_at) VALUES (?, ?, ?, 'planned', ?, ?, ?, ?)",
                (job_id, provider, model, meta, lane, now, now),
            )
            for line, request in zip(lines, requests, strict=True):
                insert_line(cur, job_id, model, line, request, now, path=self.path)
            return require_job(cur, job_id, self.path)

    def mark_uploaded(self, job_id: str, file_id: str) -> None:
        """Record the uploaded input file (``planned``/``uploaded`` → ``uploaded``).

        Uploading again before submitting replaces the file id. Durable when it returns.

        Raises:
            ConfigurationError: no such job, or it is already submitted or finished.
        """
        with self._write() as cur:
            job = require_job(cur, job_id, self.path)
            if job.state not in ("planned", "uploaded"):
                raise ConfigurationError(
                    f"job {job_id} is already {job.state} (batch {job.provider_batch_id});"
                    f" its file cannot change: attach to that batch instead"
                )
            touch_job(cur, job_id, self._clock(), state="uploaded", input_file_id=file_id)

    def mark_submitted(self, job_id: str, provider_batch_id: str) -> None:
        """Record the provider's batch id: the job and its planned lines become ``submitted``.

        Calling it again with the same batch id changes nothing. Durable when it returns.

        Raises:
            ConfigurationError: no such job; it is already submitted as another batch
                or finished; or another job already has this batch id.
        """
        with self._write() as cur:
            job = require_job(cur, job_id, self.path)
            if job.state == "submitted" and job.provider_batch_id == provider_batch_id:
                return
            if job.state not in ("planned", "uploaded"):
                raise ConfigurationError(
                    f"job {job_id} is already {job.state} (batch {job.provider_batch_id});"
                    f" it cannot also be batch {provider_batch_id}"
                )
            set_batch_id(cur, job_id, provider_batch_id, self._clock())
            cur.execute(
                "UPDATE lines SET state = 'submitted' WHERE job_id = ? AND state = 'planned'",
                (job_id,),
            )

    def mark_refused(self, job_id: str, provider_batch_id: str) -> bool:
        """The provider refused the job's batch at validation (the enqueued-token
        limit), having run nothing of it: the job goes back to ``uploaded`` (its lines
        to ``planned``), to be created again. Durable when it returns.

        Returns:
            Whether the job was taken back; ``False`` when it is no longer submitted as
            that batch (another process created it again, or finished it).
        """
        with self._write() as cur:
            job = require_job(cur, job_id, self.path)
            if job.state != "submitted" or job.provider_batch_id != provider_batch_id:
                return False
            cur.execute(
                "UPDATE jobs SET state = 'uploaded', provider_batch_id = NULL, updated_at = ?"
                " WHERE id = ?",
                (self._clock(), job_id),
            )
            cur.execute(
                "UPDATE lines SET state = 'planned' WHERE job_id = ? AND state = 'submitted'",
                (job_id,),
            )
            return True

    def finish_job(self, job_id: str, state: JobState, *, cost_usd: float | None = None) -> None:
        """End a job in ``state`` and record its cost (kept as it was when ``None``).

        Lines still unfinished are released: marked ``expired`` (for an ``expired`` or
        ``cancelled`` job) or ``failed``, and the items they held go back to ``pending``.
        Calling it again with the same state only updates the cost. Durable when it returns.

        Raises:
            ConfigurationError: no such job, ``state`` is not a finished state, or the
                job already finished in another state.
        """
        _check_choice("state", state, FINISHED_JOB_STATES)
        with self._write() as cur:
            job = require_job(cur, job_id, self.path)
            if job.state in FINISHED_JOB_STATES and job.state != state:
                raise ConfigurationError(
                    f"job {job_id} already finished as {job.state}; it cannot become {state}"
                )
            now = self._clock()
            leftover: LineState = "expired" if state in ("expired", "cancelled") else "failed"
            for (custom_id,) in cur.execute(
                f"SELECT custom_id FROM lines WHERE job_id = ?"
                f" AND state IN ({among(UNFINISHED_LINE_STATES)})",
                (job_id,),
            ).fetchall():
                release_line(cur, custom_id, leftover, now)
            touch_job(cur, job_id, now, state=state)
            if cost_usd is not None:
                cur.execute("UPDATE jobs SET cost_usd = ? WHERE id = ?", (cost_usd, job_id))
