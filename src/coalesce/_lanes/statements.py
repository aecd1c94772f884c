"""The SQL statements :class:`~coalesce._lanes.store.JobStore`'s methods share, each run
on the cursor of a transaction the store has already opened."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import get_args

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.records import UNFINISHED_LINE_STATES, BatchJob, LineState, PlannedLine
from coalesce._lanes.schema import among, job_from_row

__all__ = [
    "assign",
    "carried_keys",
    "insert_line",
    "item_counts",
    "line_counts",
    "needs_work",
    "record_item_outcome",
    "release_line",
    "require_carried",
    "require_job",
    "set_batch_id",
    "touch_job",
]


def require_job(cur: sqlite3.Cursor, job_id: str, path: Path) -> BatchJob:
    """The job with this id; refuse, naming the store at ``path``, when there is none."""
    row = cur.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise ConfigurationError(f"no job {job_id!r} in the job store {path}")
    return job_from_row(row)


def require_carried(cur: sqlite3.Cursor, custom_id: str, path: Path) -> tuple[str, ...]:
    """The keys a line carries; refuse, naming the store at ``path``, when there is no line."""
    if cur.execute("SELECT 1 FROM lines WHERE custom_id = ?", (custom_id,)).fetchone() is None:
        raise ConfigurationError(f"no line {custom_id!r} in the job store {path}")
    return carried_keys(cur, custom_id)


def insert_line(
    cur: sqlite3.Cursor,
    job_id: str,
    model: str,
    line: PlannedLine,
    request: str,
    now: float,
    *,
    path: Path,
) -> None:
    """Write one planned line and assign its items to it; ``path`` names the store."""
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
            f"custom_id {line.custom_id!r} already exists in the job store {path};"
            f" a custom_id is never reused: make each one with new_custom_id()"
        ) from exc
    for position, key in enumerate(line.item_keys):
        assign(cur, line.custom_id, position, key, model, now)
    cur.execute(
        "UPDATE lines SET attempt = (SELECT MAX(attempts) FROM items WHERE line = ?)"
        " WHERE custom_id = ?",
        (line.custom_id, line.custom_id),
    )


def set_batch_id(cur: sqlite3.Cursor, job_id: str, provider_batch_id: str, now: float) -> None:
    """Mark a job ``submitted`` as this provider batch; refuse a batch id another job has."""
    try:
        touch_job(cur, job_id, now, state="submitted", provider_batch_id=provider_batch_id)
    except sqlite3.IntegrityError as exc:
        other = cur.execute(
            "SELECT id FROM jobs WHERE provider_batch_id = ?", (provider_batch_id,)
        ).fetchone()
        raise ConfigurationError(
            f"batch {provider_batch_id} is already recorded for job {other['id']};"
            f" it cannot also be job {job_id}'s"
        ) from exc


def needs_work(cur: sqlite3.Cursor, key: str) -> bool:
    """Whether the item is stored and waits for a line (``pending`` or ``failed``)."""
    row = cur.execute("SELECT state FROM items WHERE key = ?", (key,)).fetchone()
    return row is not None and row["state"] in ("pending", "failed")


def assign(
    cur: sqlite3.Cursor, custom_id: str, position: int, key: str, model: str, now: float
) -> None:
    """Give a pending or failed item of ``model`` to a line at ``position``; refuse any other."""
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


def touch_job(cur: sqlite3.Cursor, job_id: str, now: float, **columns: str) -> None:
    """Set a job's ``columns`` and its ``updated_at``."""
    assignments = "".join(f"{name} = ?, " for name in columns)
    cur.execute(
        f"UPDATE jobs SET {assignments}updated_at = ? WHERE id = ?",
        (*columns.values(), now, job_id),
    )


def carried_keys(cur: sqlite3.Cursor, custom_id: str) -> tuple[str, ...]:
    """The keys of the items a line carries, in the line's order."""
    rows = cur.execute(
        "SELECT item_key FROM line_items WHERE custom_id = ? ORDER BY position", (custom_id,)
    ).fetchall()
    return tuple(row["item_key"] for row in rows)


def record_item_outcome(
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


def release_line(cur: sqlite3.Cursor, custom_id: str, state: LineState, now: float) -> list[str]:
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
        f" AND state IN ({among(UNFINISHED_LINE_STATES)})",
        (state, custom_id),
    )
    return [row["key"] for row in rows]


def line_counts(cur: sqlite3.Cursor, job_id: str) -> Mapping[LineState, int]:
    """A job's lines counted by state, every state present."""
    counts: dict[LineState, int] = dict.fromkeys(get_args(LineState), 0)
    for row in cur.execute(
        "SELECT state, COUNT(*) AS n FROM lines WHERE job_id = ? GROUP BY state", (job_id,)
    ):
        counts[row["state"]] = row["n"]
    return MappingProxyType(counts)


def item_counts(cur: sqlite3.Cursor, job_id: str) -> Mapping[str, int]:
    """The items a job's lines carried, bucketed as ``JobSummary.items`` describes."""
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
