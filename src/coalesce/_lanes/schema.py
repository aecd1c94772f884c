"""The job store's file format: the SQLite schema, opening (and migrating) a store file,
and turning rows into records and values into JSON columns."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, get_args

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.records import (
    JOB_METADATA_KEY,
    BatchJob,
    DeferredLane,
    ItemState,
    JobState,
    LineState,
    Provider,
    StoredItem,
    StoredLine,
)

__all__ = [
    "SCHEMA_VERSION",
    "among",
    "connect",
    "dump_json",
    "item_from_row",
    "job_from_row",
    "job_metadata_json",
    "line_from_row",
]

SCHEMA_VERSION = 1
"""Stored in ``PRAGMA user_version``; a store written by a newer coalesce is refused."""


def among(values: tuple[str, ...]) -> str:
    """``values`` as the inside of an SQL ``IN (...)``: quoted, comma-separated."""
    return ", ".join(f"'{value}'" for value in values)


_SCHEMA = f"""
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    provider TEXT NOT NULL CHECK (provider IN ({among(get_args(Provider))})),
    model TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({among(get_args(JobState))})),
    input_file_id TEXT,
    provider_batch_id TEXT UNIQUE,
    metadata TEXT NOT NULL,
    lane TEXT NOT NULL CHECK (lane IN ({among(get_args(DeferredLane))})),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    cost_usd REAL NOT NULL DEFAULT 0
);
CREATE TABLE lines (
    custom_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL REFERENCES jobs (id),
    request TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({among(get_args(LineState))})),
    attempt INTEGER NOT NULL
);
CREATE INDEX lines_by_job ON lines (job_id);
CREATE TABLE items (
    key TEXT PRIMARY KEY,
    function TEXT NOT NULL,
    model TEXT NOT NULL,
    input TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ({among(get_args(ItemState))})),
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


# --- opening -------------------------------------------------------------------------


def connect(path: Path) -> sqlite3.Connection:
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


def dump_json(value: Any, what: str) -> str:
    """A value as a compact JSON column; ``what`` names it in the error."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{what} is not JSON ({exc}); store only JSON values") from exc


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def item_from_row(row: sqlite3.Row) -> StoredItem:
    """An ``items`` row as a record (its columns are the record's fields)."""
    return StoredItem(**{**dict(row), "input": _load(row["input"]), "result": _load(row["result"])})


def job_from_row(row: sqlite3.Row) -> BatchJob:
    """A ``jobs`` row as a record (its columns are the record's fields)."""
    return BatchJob(**{**dict(row), "metadata": MappingProxyType(json.loads(row["metadata"]))})


def job_metadata_json(job_id: str, metadata: Mapping[str, str] | None) -> str:
    """A job's metadata column: the caller's ``metadata`` plus :data:`JOB_METADATA_KEY`."""
    extra = dict(metadata or {})
    if JOB_METADATA_KEY in extra:
        raise ConfigurationError(
            f"metadata key {JOB_METADATA_KEY!r} is reserved for the local job id; rename it"
        )
    return dump_json({**extra, JOB_METADATA_KEY: job_id}, "the job's metadata")


def line_from_row(row: sqlite3.Row, item_keys: tuple[str, ...]) -> StoredLine:
    """A ``lines`` row, and the keys it carries, as a record."""
    request = MappingProxyType(json.loads(row["request"]))
    return StoredLine(**{**dict(row), "request": request}, item_keys=item_keys)
