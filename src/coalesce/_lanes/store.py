"""The durable job store of the deferred lanes: every job, line and item, in SQLite.

A batch job is written here, with its lines and the items they carry, *before* anything
is uploaded; each later step (uploaded, submitted, a line's results, an expiry, the end)
is written when it happens. A process that crashes and starts again reads the store and
attaches to the jobs it had submitted, so nothing is submitted, or billed, twice.

Durability: every write runs in one SQLite transaction (``BEGIN IMMEDIATE``) that is
committed, in WAL mode with ``synchronous=FULL``, before the method returns. A
``kill -9`` right after a call therefore loses nothing the call recorded, and neither
does a power cut (as far as the file system honours ``fsync``). A write that raises
leaves the store exactly as it was.

States::

    item  pending ──plan_job──▶ assigned ──record_line_result──▶ done | failed
             ▲                     │   (an item the line did not answer: pending)
             └──expire_line────────┘   (failed items may be planned again)

    line  planned ──mark_submitted──▶ submitted ──▶ done | failed | expired
    job   planned ──▶ uploaded ──▶ submitted ──finish_job──▶ completed | expired
                                                            | cancelled | failed | ended

An item belongs to at most one unfinished line at a time, a line to one job, and a
``custom_id`` is never used twice in a store.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, get_args

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.paths import default_store_path
from coalesce._lanes.records import (
    FINISHED_JOB_STATES,
    UNFINISHED_JOB_STATES,
    UNFINISHED_LINE_STATES,
    ItemRow,
    Job,
    JobState,
    JobSummary,
    Lane,
    LineState,
    PlannedLine,
    Provider,
    StoredItem,
    StoredLine,
)
from coalesce._lanes.schema import (
    among,
    connect,
    dump_json,
    item_from_row,
    job_from_row,
    job_metadata_json,
    line_from_row,
)
from coalesce._lanes.statements import (
    carried_keys,
    insert_line,
    item_counts,
    line_counts,
    needs_work,
    release_line,
    require_carried,
    require_job,
    set_batch_id,
    settle,
    touch_job,
)

__all__ = ["JobStore"]


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigurationError(f"{name}={value!r} is not one of {', '.join(allowed)}")


class JobStore:
    """The durable store of the deferred lanes, one SQLite file (see the module docstring).

    One connection per store, shared by threads under a lock; the runner calls these
    methods through ``anyio.to_thread``. Several processes may open the same file: SQLite
    serialises their writes.

    Args:
        path: The store file; :func:`default_store_path` when omitted. Parent
            directories are created.
        clock: Wall-clock seconds for ``created_at``/``updated_at`` (``time.time``).

    Raises:
        ConfigurationError: the file is not a coalesce job store, or a newer coalesce wrote it.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        self._clock = clock
        self._lock = threading.Lock()
        self._line_prefix = uuid.uuid4().hex
        self._line_numbers = itertools.count(1)
        self._closed = False
        self._db = connect(self.path)

    def __repr__(self) -> str:
        return f"<JobStore {str(self.path)!r} {'closed' if self._closed else 'open'}>"

    def close(self) -> None:
        """Close the connection; everything written is already committed."""
        with self._lock:
            self._closed = True
            self._db.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction, committed on exit, rolled back whole if anything raises."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException:
                self._db.rollback()
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        """One consistent snapshot for several reads."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                self._db.rollback()

    # --- custom ids ---

    def new_custom_id(self) -> str:
        """A ``custom_id`` never returned before: a random per-store prefix and a counter.

        It is 1-64 characters of ``[0-9a-f-]``, which both providers accept.
        """
        with self._lock:
            return f"{self._line_prefix}-{next(self._line_numbers)}"

    # --- items ---

    def add_items(self, rows: Iterable[ItemRow]) -> list[str]:
        """Add items that are not in the store yet; return the keys that still need work.

        An item already stored is left as it is. The keys returned (in order, once each)
        are those now ``pending`` or ``failed``; an item ``assigned`` to a line or
        ``done`` is not returned. Durable when it returns; all rows or none.
        """
        rows = list(rows)
        values = [
            (row.key, row.function, row.model, dump_json(row.input, f"the input of item {row.key}"))
            for row in rows
        ]
        with self._write() as cur:
            now = self._clock()
            cur.executemany(
                "INSERT OR IGNORE INTO items (key, function, model, input, state, attempts,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', 0, ?, ?)",
                [(*value, now, now) for value in values],
            )
            return [key for key in dict.fromkeys(r.key for r in rows) if needs_work(cur, key)]

    def get(self, key: str) -> StoredItem | None:
        """The item with this key, or ``None``."""
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[StoredItem | None]:
        """The items with these keys (``None`` where there is none), in one snapshot."""
        found: dict[str, StoredItem] = {}
        with self._read() as cur:
            for start in range(0, len(keys), 500):  # under SQLite's bound-parameter limit
                part = keys[start : start + 500]
                query = f"SELECT * FROM items WHERE key IN ({','.join('?' * len(part))})"
                for row in cur.execute(query, part).fetchall():
                    found[row["key"]] = item_from_row(row)
        return [found.get(key) for key in keys]

    def release(self, key: str) -> None:
        """Send a ``done`` item back to ``pending``, its result dropped: the function
        found the result invalid (``coalesce jobs`` collects without the output type),
        so it is asked again. Other states are left as they are. Durable when it returns.
        """
        with self._write() as cur:
            cur.execute(
                "UPDATE items SET state = 'pending', result = NULL, line = NULL,"
                " error = 'the stored result did not validate', updated_at = ?"
                " WHERE key = ? AND state = 'done'",
                (self._clock(), key),
            )

    def retry_items(self, keys: Sequence[str]) -> None:
        """Send ``failed`` items back to ``pending`` for a follow-up job, keeping why
        they failed (a reply answered them invalidly). Durable when it returns."""
        with self._write() as cur:
            now = self._clock()
            cur.executemany(
                "UPDATE items SET state = 'pending', line = NULL, updated_at = ?"
                " WHERE key = ? AND state = 'failed'",
                [(now, key) for key in keys],
            )

    def pending_items(
        self, function: str | None = None, *, include_failed: bool = False
    ) -> list[StoredItem]:
        """Items waiting for a line (``pending``, and ``failed`` if asked), oldest first."""
        states = ("pending", "failed") if include_failed else ("pending",)
        query = f"SELECT * FROM items WHERE state IN ({among(states)})"
        params: tuple[str, ...] = ()
        if function is not None:
            query, params = query + " AND function = ?", (function,)
        with self._read() as cur:
            rows = cur.execute(query + " ORDER BY rowid", params).fetchall()
        return [item_from_row(row) for row in rows]

    # --- jobs ---

    def plan_job(
        self,
        provider: Provider,
        model: str,
        lane: Lane,
        lines: Sequence[PlannedLine],
        *,
        metadata: Mapping[str, str] | None = None,
    ) -> Job:
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
        _check_choice("lane", lane, get_args(Lane))
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

    def get_job(self, job_id: str) -> Job | None:
        """The job with this local id, or ``None``."""
        with self._read() as cur:
            row = cur.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else job_from_row(row)

    def job_for_batch(self, provider_batch_id: str) -> Job | None:
        """The job submitted as this provider batch, or ``None``."""
        with self._read() as cur:
            row = cur.execute(
                "SELECT * FROM jobs WHERE provider_batch_id = ?", (provider_batch_id,)
            ).fetchone()
        return None if row is None else job_from_row(row)

    def list_jobs(self) -> list[Job]:
        """Every job, oldest first."""
        return self._jobs("SELECT * FROM jobs ORDER BY created_at, rowid")

    def unfinished_jobs(self) -> list[Job]:
        """Jobs planned, uploaded or submitted: those a restarted process must finish
        submitting or attach to, oldest first."""
        return self._jobs(
            f"SELECT * FROM jobs WHERE state IN ({among(UNFINISHED_JOB_STATES)})"
            " ORDER BY created_at, rowid"
        )

    def _jobs(self, query: str) -> list[Job]:
        with self._read() as cur:
            return [job_from_row(row) for row in cur.execute(query).fetchall()]

    def job_lines(self, job_id: str) -> list[StoredLine]:
        """A job's lines, in the order planned, each with the request body to upload."""
        with self._read() as cur:
            rows = cur.execute(
                "SELECT * FROM lines WHERE job_id = ? ORDER BY rowid", (job_id,)
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

    # --- lines ---

    def record_line_result(
        self, custom_id: str, results: Mapping[str, Any], failures: Mapping[str, str]
    ) -> None:
        """Record a line's answers: ``results`` (item key → JSON) and ``failures`` (→ error).

        Items with a result become ``done`` (a result is kept even from an expired line;
        an item already done keeps its first result); items with a failure become
        ``failed`` unless a newer line holds them; items the line carried that neither
        mapping names go back to ``pending``. The line becomes ``done``, or ``failed``
        when it gave no result at all. Safe to repeat. Durable when it returns.

        Raises:
            ConfigurationError: no such line, a key the line does not carry, a key in
                both mappings, or a result that is not JSON.
        """
        self.record_line_results([(custom_id, results, failures)])

    def record_line_results(
        self, answers: Sequence[tuple[str, Mapping[str, Any], Mapping[str, str]]]
    ) -> None:
        """:meth:`record_line_result` for many lines, in one transaction: one commit
        (one fsync) for a job's thousands of lines. All or none are recorded.

        Raises:
            ConfigurationError: as :meth:`record_line_result`, for any line.
        """
        encoded = [
            (custom_id, _encoded(results, failures), failures)
            for custom_id, results, failures in answers
        ]
        with self._write() as cur:
            now = self._clock()
            for custom_id, results, failures in encoded:
                _record_line(cur, self.path, custom_id, results, failures, now)

    def expire_line(self, custom_id: str) -> list[str]:
        """The line got no answer (its batch expired or was cancelled): release it.

        The line becomes ``expired`` (a line already answered keeps its state) and the
        items it still holds go back to ``pending`` for a follow-up job; their keys are
        returned. Items it answered keep their results. Safe to repeat. Durable when it
        returns.

        Raises:
            ConfigurationError: no such line.
        """
        with self._write() as cur:
            require_carried(cur, custom_id, self.path)
            return release_line(cur, custom_id, "expired", self._clock())


def _encoded(results: Mapping[str, Any], failures: Mapping[str, str]) -> dict[str, str]:
    """``results`` as JSON text; refuse a key in both mappings."""
    both = results.keys() & failures.keys()
    if both:
        raise ConfigurationError(f"items {sorted(both)} have both a result and a failure")
    return {key: dump_json(value, f"the result of item {key}") for key, value in results.items()}


def _record_line(
    cur: sqlite3.Cursor,
    path: Path,
    custom_id: str,
    encoded: Mapping[str, str],
    failures: Mapping[str, str],
    now: float,
) -> None:
    """One line's answers, inside the caller's transaction (see ``record_line_result``)."""
    carried = require_carried(cur, custom_id, path)
    strangers = (encoded.keys() | failures.keys()) - set(carried)
    if strangers:
        raise ConfigurationError(
            f"line {custom_id} does not carry items {sorted(strangers)}; record each"
            f" item's answer under the line that carried it"
        )
    for key in carried:
        settle(cur, custom_id, key, encoded.get(key), failures.get(key), now)
    state = "done" if encoded else "failed"
    cur.execute("UPDATE lines SET state = ? WHERE custom_id = ?", (state, custom_id))
