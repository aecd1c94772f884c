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
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Literal, get_args

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.keys import item_key

__all__ = [
    "SCHEMA_VERSION",
    "ItemRow",
    "Job",
    "JobStore",
    "JobSummary",
    "PlannedLine",
    "StoredItem",
    "StoredLine",
    "default_store_path",
    "store_path_for",
]

Provider = Literal["openai", "anthropic"]
Lane = Literal["batch", "flex"]
JobState = Literal[
    "planned", "uploaded", "submitted", "completed", "expired", "cancelled", "failed", "ended"
]
LineState = Literal["planned", "submitted", "done", "failed", "expired"]
ItemState = Literal["pending", "assigned", "done", "failed"]

SCHEMA_VERSION = 1
"""Stored in ``PRAGMA user_version``; a store written by a newer coalesce is refused."""

UNFINISHED_JOB_STATES: tuple[JobState, ...] = ("planned", "uploaded", "submitted")
FINISHED_JOB_STATES: tuple[JobState, ...] = ("completed", "expired", "cancelled", "failed", "ended")
UNFINISHED_LINE_STATES: tuple[LineState, ...] = ("planned", "submitted")
JOB_METADATA_KEY = "coalesce_job"
"""The metadata key carrying the local job id, to find a job again on the provider's side."""


def _among(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


_SCHEMA = f"""
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    provider TEXT NOT NULL CHECK (provider IN ({_among(get_args(Provider))})),
    model TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({_among(get_args(JobState))})),
    input_file_id TEXT,
    provider_batch_id TEXT UNIQUE,
    metadata TEXT NOT NULL,
    lane TEXT NOT NULL CHECK (lane IN ({_among(get_args(Lane))})),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    cost_usd REAL NOT NULL DEFAULT 0
);
CREATE TABLE lines (
    custom_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs (id),
    request TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({_among(get_args(LineState))})),
    attempt INTEGER NOT NULL
);
CREATE INDEX lines_by_job ON lines (job_id);
CREATE TABLE items (
    key TEXT PRIMARY KEY,
    function TEXT NOT NULL,
    model TEXT NOT NULL,
    input TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({_among(get_args(ItemState))})),
    line TEXT REFERENCES lines (custom_id),
    result TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX items_by_state ON items (state, function);
CREATE INDEX items_by_line ON items (line);
CREATE TABLE line_items (
    custom_id TEXT NOT NULL REFERENCES lines (custom_id),
    position INTEGER NOT NULL,
    item_key TEXT NOT NULL REFERENCES items (key),
    PRIMARY KEY (custom_id, position),
    UNIQUE (custom_id, item_key)
);
CREATE INDEX line_items_by_item ON line_items (item_key)
"""


# --- records -------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemRow:
    """One item to add to the store: its key, what it is for, and its input (JSON)."""

    key: str
    function: str
    model: str
    input: Any

    @classmethod
    def for_call(
        cls,
        function: str,
        model: str,
        instructions: str,
        output_schema: Mapping[str, Any],
        item: Any,
    ) -> ItemRow:
        """The row of one call, keyed by :func:`~coalesce._lanes.keys.item_key`."""
        return cls(
            item_key(function, model, instructions, output_schema, item), function, model, item
        )


@dataclass(frozen=True)
class StoredItem:
    """An item as the store has it; ``line`` is the line holding it or that answered it."""

    key: str
    function: str
    model: str
    input: Any
    state: ItemState
    line: str | None
    result: Any
    error: str | None
    attempts: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class PlannedLine:
    """One JSONL line to be uploaded: its ``custom_id``, request body and the items it packs."""

    custom_id: str
    request: Mapping[str, Any]
    item_keys: Sequence[str]


@dataclass(frozen=True)
class StoredLine:
    """A line as the store has it; ``request`` is the body that was, or will be, uploaded."""

    custom_id: str
    job_id: str
    request: Mapping[str, Any]
    state: LineState
    attempt: int
    item_keys: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    """A batch job: ``id`` is local (a uuid4 made before upload), the rest the provider's."""

    id: str
    provider: Provider
    model: str
    lane: Lane
    state: JobState
    input_file_id: str | None
    provider_batch_id: str | None
    metadata: Mapping[str, str]
    cost_usd: float
    created_at: float
    updated_at: float

    @property
    def unfinished(self) -> bool:
        """Whether a restarted process must still finish submitting it or attach to it."""
        return self.state in UNFINISHED_JOB_STATES


@dataclass(frozen=True)
class JobSummary:
    """What one job did, for ``coalesce jobs show``.

    Attributes:
        job: The job.
        lines: Its lines, counted by state.
        items: The items its lines carried: ``assigned``, ``done`` and ``failed`` for
            those this job still holds or answered; ``released`` for those it let go
            (expired or unanswered), now pending or taken by a later job.
        cost_usd: Its cost so far.
    """

    job: Job
    lines: Mapping[LineState, int]
    items: Mapping[str, int]
    cost_usd: float


# --- where the store lives ------------------------------------------------------------


def store_path_for(platform: str, env: Mapping[str, str], home: Path) -> Path:
    """The default store file for a platform (``sys.platform``), environment and home.

    ``$COALESCE_STORE`` (a file path) wins; otherwise ``coalesce/jobs.sqlite3`` in the
    user data directory: ``$XDG_DATA_HOME`` (if absolute) or ``~/.local/share`` on
    Linux, ``~/Library/Application Support`` on macOS, ``%LOCALAPPDATA%`` on Windows.
    These are the directories ``platformdirs.user_data_dir("coalesce")`` names.
    """
    override = env.get("COALESCE_STORE", "")
    if override:
        return Path(override).expanduser()
    return _user_data_dir(platform, env, home) / "coalesce" / "jobs.sqlite3"


def _user_data_dir(platform: str, env: Mapping[str, str], home: Path) -> Path:
    if platform == "win32":
        local = env.get("LOCALAPPDATA", "")
        return Path(local) if local else home / "AppData" / "Local"
    if platform == "darwin":
        return home / "Library" / "Application Support"
    xdg = env.get("XDG_DATA_HOME", "").strip()
    return Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "share"


def default_store_path() -> Path:
    """This user's default store file (see :func:`store_path_for`)."""
    return store_path_for(sys.platform, os.environ, Path.home())


# --- opening -------------------------------------------------------------------------


def _open(path: Path) -> sqlite3.Connection:
    """Connect in WAL mode with ``synchronous=FULL``: a commit is on disk when it returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from exc
    db.row_factory = sqlite3.Row
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        _migrate(db, path)
    except BaseException as exc:
        db.close()
        if isinstance(exc, sqlite3.Error):
            raise _unusable(path, exc) from exc
        raise
    return db


def _unusable(path: Path, exc: sqlite3.Error) -> ConfigurationError:
    return ConfigurationError(
        f"{path} is not a usable coalesce job store ({exc}); point store= at another file"
    )


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Create the schema in a new store, in one transaction; refuse a newer one."""
    db.execute("BEGIN IMMEDIATE")
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise ConfigurationError(
                f"the job store {path} has schema version {version}, newer than this"
                f" coalesce's {SCHEMA_VERSION}; upgrade coalesce, or point store= at another file"
            )
        if version == 0:
            for statement in _SCHEMA.split(";"):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.rollback()
        raise


# --- encoding -------------------------------------------------------------------------


def _dump(value: Any, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{what} is not JSON ({exc}); store only JSON values") from exc


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigurationError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def _item(row: sqlite3.Row) -> StoredItem:
    return StoredItem(
        key=row["key"],
        function=row["function"],
        model=row["model"],
        input=_load(row["input"]),
        state=row["state"],
        line=row["line"],
        result=_load(row["result"]),
        error=row["error"],
        attempts=row["attempts"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        provider=row["provider"],
        model=row["model"],
        lane=row["lane"],
        state=row["state"],
        input_file_id=row["input_file_id"],
        provider_batch_id=row["provider_batch_id"],
        metadata=MappingProxyType(json.loads(row["metadata"])),
        cost_usd=row["cost_usd"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _job_metadata(job_id: str, metadata: Mapping[str, str] | None) -> str:
    extra = dict(metadata or {})
    if JOB_METADATA_KEY in extra:
        raise ConfigurationError(
            f"metadata key {JOB_METADATA_KEY!r} is reserved for the local job id; rename it"
        )
    return _dump({**extra, JOB_METADATA_KEY: job_id}, "the job's metadata")


# --- the store -----------------------------------------------------------------------


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
        self._db = _open(self.path)

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
            (row.key, row.function, row.model, _dump(row.input, f"the input of item {row.key}"))
            for row in rows
        ]
        with self._write() as cur:
            now = self._clock()
            cur.executemany(
                "INSERT OR IGNORE INTO items (key, function, model, input, state, attempts,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', 0, ?, ?)",
                [(*value, now, now) for value in values],
            )
            return [key for key in dict.fromkeys(r.key for r in rows) if _needs_work(cur, key)]

    def get(self, key: str) -> StoredItem | None:
        """The item with this key, or ``None``."""
        with self._read() as cur:
            row = cur.execute("SELECT * FROM items WHERE key = ?", (key,)).fetchone()
        return None if row is None else _item(row)

    def pending_items(
        self, function: str | None = None, *, include_failed: bool = False
    ) -> list[StoredItem]:
        """Items waiting for a line (``pending``, and ``failed`` if asked), oldest first."""
        states = ("pending", "failed") if include_failed else ("pending",)
        query = f"SELECT * FROM items WHERE state IN ({_among(states)})"
        params: tuple[str, ...] = ()
        if function is not None:
            query, params = query + " AND function = ?", (function,)
        with self._read() as cur:
            rows = cur.execute(query + " ORDER BY rowid", params).fetchall()
        return [_item(row) for row in rows]

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
        requests = [_dump(line.request, f"the request of line {line.custom_id}") for line in lines]
        job_id = uuid.uuid4().hex
        meta = _job_metadata(job_id, metadata)
        with self._write() as cur:
            now = self._clock()
            cur.execute(
                "INSERT INTO jobs (id, provider, model, state, metadata, lane, created_at,"
                " updated_at) VALUES (?, ?, ?, 'planned', ?, ?, ?, ?)",
                (job_id, provider, model, meta, lane, now, now),
            )
            for line, request in zip(lines, requests, strict=True):
                self._insert_line(cur, job_id, model, line, request, now)
            return self._require_job(cur, job_id)

    def _insert_line(
        self,
        cur: sqlite3.Cursor,
        job_id: str,
        model: str,
        line: PlannedLine,
        request: str,
        now: float,
    ) -> None:
        if not line.item_keys:
            raise ConfigurationError(f"line {line.custom_id!r} carries no items")
        try:
            cur.execute(
                "INSERT INTO lines (custom_id, job_id, request, state, attempt)"
                " VALUES (?, ?, ?, 'planned', 0)",
                (line.custom_id, job_id, request),
            )
        except sqlite3.IntegrityError as exc:
            raise ConfigurationError(
                f"custom_id {line.custom_id!r} already exists in the job store {self.path};"
                f" a custom_id is never reused: make each one with new_custom_id()"
            ) from exc
        for position, key in enumerate(line.item_keys):
            _assign(cur, line.custom_id, position, key, model, now)
        cur.execute(
            "UPDATE lines SET attempt = (SELECT MAX(attempts) FROM items WHERE line = ?)"
            " WHERE custom_id = ?",
            (line.custom_id, line.custom_id),
        )

    def mark_uploaded(self, job_id: str, file_id: str) -> None:
        """Record the uploaded input file (``planned``/``uploaded`` → ``uploaded``).

        Uploading again before submitting replaces the file id. Durable when it returns.

        Raises:
            ConfigurationError: no such job, or it is already submitted or finished.
        """
        with self._write() as cur:
            job = self._require_job(cur, job_id)
            if job.state not in ("planned", "uploaded"):
                raise ConfigurationError(
                    f"job {job_id} is already {job.state} (batch {job.provider_batch_id});"
                    f" its file cannot change: attach to that batch instead"
                )
            _touch_job(cur, job_id, self._clock(), state="uploaded", input_file_id=file_id)

    def mark_submitted(self, job_id: str, provider_batch_id: str) -> None:
        """Record the provider's batch id: the job and its planned lines become ``submitted``.

        Calling it again with the same batch id changes nothing. Durable when it returns.

        Raises:
            ConfigurationError: no such job; it is already submitted as another batch
                or finished; or another job already has this batch id.
        """
        with self._write() as cur:
            job = self._require_job(cur, job_id)
            if job.state == "submitted" and job.provider_batch_id == provider_batch_id:
                return
            if job.state not in ("planned", "uploaded"):
                raise ConfigurationError(
                    f"job {job_id} is already {job.state} (batch {job.provider_batch_id});"
                    f" it cannot also be batch {provider_batch_id}"
                )
            self._set_batch_id(cur, job_id, provider_batch_id)
            cur.execute(
                "UPDATE lines SET state = 'submitted' WHERE job_id = ? AND state = 'planned'",
                (job_id,),
            )

    def _set_batch_id(self, cur: sqlite3.Cursor, job_id: str, provider_batch_id: str) -> None:
        try:
            _touch_job(
                cur,
                job_id,
                self._clock(),
                state="submitted",
                provider_batch_id=provider_batch_id,
            )
        except sqlite3.IntegrityError as exc:
            other = cur.execute(
                "SELECT id FROM jobs WHERE provider_batch_id = ?", (provider_batch_id,)
            ).fetchone()
            raise ConfigurationError(
                f"batch {provider_batch_id} is already recorded for job {other['id']};"
                f" it cannot also be job {job_id}'s"
            ) from exc

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
            job = self._require_job(cur, job_id)
            if job.state in FINISHED_JOB_STATES and job.state != state:
                raise ConfigurationError(
                    f"job {job_id} already finished as {job.state}; it cannot become {state}"
                )
            now = self._clock()
            leftover: LineState = "expired" if state in ("expired", "cancelled") else "failed"
            for (custom_id,) in cur.execute(
                f"SELECT custom_id FROM lines WHERE job_id = ?"
                f" AND state IN ({_among(UNFINISHED_LINE_STATES)})",
                (job_id,),
            ).fetchall():
                _release_line(cur, custom_id, leftover, now)
            _touch_job(cur, job_id, now, state=state)
            if cost_usd is not None:
                cur.execute("UPDATE jobs SET cost_usd = ? WHERE id = ?", (cost_usd, job_id))

    def _require_job(self, cur: sqlite3.Cursor, job_id: str) -> Job:
        row = cur.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise ConfigurationError(f"no job {job_id!r} in the job store {self.path}")
        return _job(row)

    def get_job(self, job_id: str) -> Job | None:
        """The job with this local id, or ``None``."""
        with self._read() as cur:
            row = cur.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def job_for_batch(self, provider_batch_id: str) -> Job | None:
        """The job submitted as this provider batch, or ``None``."""
        with self._read() as cur:
            row = cur.execute(
                "SELECT * FROM jobs WHERE provider_batch_id = ?", (provider_batch_id,)
            ).fetchone()
        return None if row is None else _job(row)

    def list_jobs(self) -> list[Job]:
        """Every job, oldest first."""
        return self._jobs("SELECT * FROM jobs ORDER BY created_at, rowid")

    def unfinished_jobs(self) -> list[Job]:
        """Jobs planned, uploaded or submitted: those a restarted process must finish
        submitting or attach to, oldest first."""
        return self._jobs(
            f"SELECT * FROM jobs WHERE state IN ({_among(UNFINISHED_JOB_STATES)})"
            " ORDER BY created_at, rowid"
        )

    def _jobs(self, query: str) -> list[Job]:
        with self._read() as cur:
            return [_job(row) for row in cur.execute(query).fetchall()]

    def job_lines(self, job_id: str) -> list[StoredLine]:
        """A job's lines, in the order planned, each with the request body to upload."""
        with self._read() as cur:
            rows = cur.execute(
                "SELECT * FROM lines WHERE job_id = ? ORDER BY rowid", (job_id,)
            ).fetchall()
            return [_line(row, _carried(cur, row["custom_id"])) for row in rows]

    def job_summary(self, job_id: str) -> JobSummary:
        """Counts of a job's lines and items by state, and its cost (see :class:`JobSummary`).

        Raises:
            ConfigurationError: no such job.
        """
        with self._read() as cur:
            job = self._require_job(cur, job_id)
            return JobSummary(
                job=job,
                lines=_line_counts(cur, job_id),
                items=_item_counts(cur, job_id),
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
        both = results.keys() & failures.keys()
        if both:
            raise ConfigurationError(f"items {sorted(both)} have both a result and a failure")
        encoded = {key: _dump(value, f"the result of item {key}") for key, value in results.items()}
        with self._write() as cur:
            carried = self._require_carried(cur, custom_id)
            strangers = (encoded.keys() | failures.keys()) - set(carried)
            if strangers:
                raise ConfigurationError(
                    f"line {custom_id} does not carry items {sorted(strangers)}; record each"
                    f" item's answer under the line that carried it"
                )
            now = self._clock()
            for key in carried:
                _settle(cur, custom_id, key, encoded.get(key), failures.get(key), now)
            state = "done" if results else "failed"
            cur.execute("UPDATE lines SET state = ? WHERE custom_id = ?", (state, custom_id))

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
            self._require_carried(cur, custom_id)
            return _release_line(cur, custom_id, "expired", self._clock())

    def _require_carried(self, cur: sqlite3.Cursor, custom_id: str) -> tuple[str, ...]:
        if cur.execute("SELECT 1 FROM lines WHERE custom_id = ?", (custom_id,)).fetchone() is None:
            raise ConfigurationError(f"no line {custom_id!r} in the job store {self.path}")
        return _carried(cur, custom_id)


# --- statements shared by the methods ---------------------------------------------------


def _needs_work(cur: sqlite3.Cursor, key: str) -> bool:
    row = cur.execute("SELECT state FROM items WHERE key = ?", (key,)).fetchone()
    return row is not None and row["state"] in ("pending", "failed")


def _assign(
    cur: sqlite3.Cursor, custom_id: str, position: int, key: str, model: str, now: float
) -> None:
    cur.execute(
        "UPDATE items SET state = 'assigned', line = ?, attempts = attempts + 1, updated_at = ?"
        " WHERE key = ? AND model = ? AND state IN ('pending', 'failed')",
        (custom_id, now, key, model),
    )
    if cur.rowcount != 1:
        raise _unassignable(cur, custom_id, key, model)
    cur.execute(
        "INSERT INTO line_items (custom_id, position, item_key) VALUES (?, ?, ?)",
        (custom_id, position, key),
    )


def _unassignable(cur: sqlite3.Cursor, custom_id: str, key: str, model: str) -> ConfigurationError:
    row = cur.execute("SELECT state, line, model FROM items WHERE key = ?", (key,)).fetchone()
    if row is None:
        why = "is not in the store; add it with add_items() first"
    elif row["state"] == "assigned":
        why = f"is already assigned to the unfinished line {row['line']}; expire or record that line first"
    elif row["state"] == "done":
        why = f"already has its result (from line {row['line']}); it needs no line"
    else:
        why = f"is for model {row['model']!r}, not this job's {model!r}"
    return ConfigurationError(f"item {key} cannot go in line {custom_id}: it {why}")


def _touch_job(cur: sqlite3.Cursor, job_id: str, now: float, **columns: str) -> None:
    assignments = "".join(f"{name} = ?, " for name in columns)
    cur.execute(
        f"UPDATE jobs SET {assignments}updated_at = ? WHERE id = ?",
        (*columns.values(), now, job_id),
    )


def _carried(cur: sqlite3.Cursor, custom_id: str) -> tuple[str, ...]:
    rows = cur.execute(
        "SELECT item_key FROM line_items WHERE custom_id = ? ORDER BY position", (custom_id,)
    ).fetchall()
    return tuple(row["item_key"] for row in rows)


def _line(row: sqlite3.Row, item_keys: tuple[str, ...]) -> StoredLine:
    return StoredLine(
        custom_id=row["custom_id"],
        job_id=row["job_id"],
        request=MappingProxyType(json.loads(row["request"])),
        state=row["state"],
        attempt=row["attempt"],
        item_keys=item_keys,
    )


def _settle(
    cur: sqlite3.Cursor,
    custom_id: str,
    key: str,
    result: str | None,
    error: str | None,
    now: float,
) -> None:
    """One carried item's outcome: a result wins unless the item is done already; a
    failure or silence only touches an item no newer line holds."""
    if result is not None:
        cur.execute(
            "UPDATE items SET state = 'done', result = ?, error = NULL, line = ?, updated_at = ?"
            " WHERE key = ? AND state != 'done'",
            (result, custom_id, now, key),
        )
    elif error is not None:
        cur.execute(
            "UPDATE items SET state = 'failed', error = ?, line = ?, updated_at = ?"
            " WHERE key = ? AND state != 'done' AND (state != 'assigned' OR line = ?)",
            (error, custom_id, now, key, custom_id),
        )
    else:
        cur.execute(
            "UPDATE items SET state = 'pending', line = NULL, error = ?, updated_at = ?"
            " WHERE key = ? AND state = 'assigned' AND line = ?",
            (f"line {custom_id} gave no output for this item", now, key, custom_id),
        )


def _release_line(cur: sqlite3.Cursor, custom_id: str, state: LineState, now: float) -> list[str]:
    """Put the items a line still holds back to ``pending``; end the line if unfinished."""
    rows = cur.execute(
        "SELECT key FROM items WHERE line = ? AND state = 'assigned' ORDER BY rowid", (custom_id,)
    ).fetchall()
    cur.execute(
        "UPDATE items SET state = 'pending', line = NULL, updated_at = ?"
        " WHERE line = ? AND state = 'assigned'",
        (now, custom_id),
    )
    cur.execute(
        f"UPDATE lines SET state = ? WHERE custom_id = ?"
        f" AND state IN ({_among(UNFINISHED_LINE_STATES)})",
        (state, custom_id),
    )
    return [row["key"] for row in rows]


def _line_counts(cur: sqlite3.Cursor, job_id: str) -> Mapping[LineState, int]:
    counts: dict[LineState, int] = dict.fromkeys(get_args(LineState), 0)
    for row in cur.execute(
        "SELECT state, COUNT(*) AS n FROM lines WHERE job_id = ? GROUP BY state", (job_id,)
    ):
        counts[row["state"]] = row["n"]
    return MappingProxyType(counts)


def _item_counts(cur: sqlite3.Cursor, job_id: str) -> Mapping[str, int]:
    counts = dict.fromkeys(("assigned", "done", "failed", "released"), 0)
    for row in cur.execute(
        "SELECT CASE WHEN holder.job_id = ? THEN items.state ELSE 'released' END AS bucket,"
        " COUNT(*) AS n FROM line_items"
        " JOIN lines AS carrier ON carrier.custom_id = line_items.custom_id"
        " JOIN items ON items.key = line_items.item_key"
        " LEFT JOIN lines AS holder ON holder.custom_id = items.line"
        " WHERE carrier.job_id = ? GROUP BY bucket",
        (job_id, job_id),
    ):
        counts[row["bucket"]] = row["n"]
    return MappingProxyType(counts)
