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

    item  pending ──plan_job──▶ assigned ──record_line_results──▶ done | failed
             ▲                     │   (an item the line did not answer: pending)
             └──expire_line────────┘   (failed items may be planned again)

    line  planned ──mark_submitted──▶ submitted ──▶ done | failed | expired
    job   planned ──▶ uploaded ──▶ submitted ──finish_job──▶ completed | expired
                                                            | cancelled | failed | ended

An item belongs to at most one unfinished line at a time, a line to one job, and a
``custom_id`` is never used twice in a store.
"""

from __future__ import annotations

from coalesce._lanes.item_table import ItemTable
from coalesce._lanes.job_queries import JobQueries
from coalesce._lanes.job_writes import JobWrites
from coalesce._lanes.line_writes import LineWrites

__all__ = ["JobStore"]


class JobStore(JobWrites, LineWrites, JobQueries, ItemTable):
    """The durable store of the deferred lanes, one SQLite file (see the module docstring).

    One connection per store, shared by threads under a lock; the runner calls these
    methods through ``anyio.to_thread``. Several processes may open the same file: SQLite
    serialises their writes. Its methods live by concern in its bases.

    Args:
        path: The store file; :func:`~coalesce._paths.default_store_path` when
            omitted. Parent directories are created.
        clock: Wall-clock seconds for ``created_at``/``updated_at`` (``time.time``).

    Raises:
        ConfigurationError: the file is not a coalesce job store, or a newer coalesce wrote it.
    """
