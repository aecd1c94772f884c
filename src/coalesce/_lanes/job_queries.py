"""The job store's reads of jobs and lines: by id, by provider batch, unfinished, and
a job's lines, functions and summary."""

from __future__ import annotations

from coalesce._lanes.connection import StoreConnection
from coalesce._lanes.records import UNFINISHED_JOB_STATES, BatchJob, JobSummary, StoredLine
from coalesce._lanes.schema import among, job_from_row, line_from_row
from coalesce._lanes.statements import carried_keys, item_counts, line_counts, require_job

__all__ = ["JobQueries"]


class JobQueries(StoreConnection):
    """The job and line reads of :class:`~coalesce._lanes.store.JobStore`."""

    def get_job(self, job_id: str) -> BatchJob | None:
        """The job with this local id, or ``None``."""
        return self._job("SELECT * FROM jobs WHERE id = ?", job_id)

    def job_for_batch(self, provider_batch_id: str) -> BatchJob | None:
        """The job submitted as this provider batch, or ``None``."""
        return self._job("SELECT * FROM jobs WHERE provider_batch_id = ?", provider_batch_id)

    def _job(self, query: str, value: str) -> BatchJob | None:
        with self._read() as cur:
            row = cur.execute(query, (value,)).fetchone()
        return None if row is None else job_from_row(row)

    def list_jobs(self) -> list[BatchJob]:
        """Every job, oldest first."""
        return self._jobs("SELECT * FROM jobs ORDER BY created_at, rowid")

    def unfinished_jobs(self) -> list[BatchJob]:
        """Jobs planned, uploaded or submitted: those a restarted process must finish
        submitting or attach to, oldest first."""
        return self._jobs(
            f"SELECT * FROM jobs WHERE state IN ({among(UNFINISHED_JOB_STATES)})"
            " ORDER BY created_at, rowid"
        )

    def job_functions(self, job_id: str) -> frozenset[str]:
        """The functions whose items a job's lines carry (the ``function`` of each item)."""
        with self._read() as cur:
            rows = cur.execute(
                "SELECT DISTINCT items.function FROM lines"
                " JOIN line_items ON line_items.custom_id = lines.custom_id"
                " JOIN items ON items.key = line_items.item_key WHERE lines.job_id = ?",
                (job_id,),
            ).fetchall()
        return frozenset(str(row[0]) for row in rows)

    def _jobs(self, query: str) -> list[BatchJob]:
        with self._read() as cur:
            return [job_from_row(row) for row in cur.execute(query).fetchall()]

    def job_lines(self, job_id: str) -> list[StoredLine]:
        """A job's lines, in the order planned, each with the request body to upload."""
        with self._read() as cur:
            rows = cur.execute(
                "SELECT * FROM lines WHERE job_id = ? ORDER BY rowid", (job_id,)
            ).fetchall()
            return [line_from_row(row, carried_keys(cur, row["custom_id"])) for row in rows]

    def unanswered_lines(self) -> list[StoredLine]:
        """Lines that got no answer (their batch expired, or a 429 or 5xx) and whose
        items are all still pending, so the same request may be sent again as it is;
        lines of cancelled jobs left out (cancelling said not to). Oldest job first."""
        with self._read() as cur:
            rows = cur.execute(
                "SELECT lines.* FROM lines JOIN jobs ON jobs.id = lines.job_id"
                " WHERE lines.state = 'expired' AND jobs.state != 'cancelled'"
                " AND NOT EXISTS (SELECT 1 FROM line_items"
                " JOIN items ON items.key = line_items.item_key"
                " WHERE line_items.custom_id = lines.custom_id AND items.state != 'pending')"
                " ORDER BY jobs.created_at, jobs.rowid, lines.rowid"
            ).fetchall()
            return [line_from_row(row, carried_keys(cur, row["custom_id"])) for row in rows]

    def job_summary(self, job_id: str) -> JobSummary:
        """Counts of a job's lines and items by state, and its cost (see :class:`JobSummary`).

        Raises:
            ConfigurationError: no such job.
        """
        with self._read() as cur:
            job = require_job(cur, job_id, self.path)
            return JobSummary(
                job=job,
                lines=line_counts(cur, job_id),
                items=item_counts(cur, job_id),
                cost_usd=job.cost_usd,
            )
