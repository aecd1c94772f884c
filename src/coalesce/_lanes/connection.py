"""The job store's connection: one SQLite file, one lock, and the transactions every
method of :class:`~coalesce._lanes.store.JobStore` runs in (see that module for why
each write is durable when it returns)."""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from coalesce._lanes.schema import connect
from coalesce._paths import default_store_path

__all__ = ["StoreConnection"]

_Store = TypeVar("_Store", bound="StoreConnection")


class StoreConnection:
    """An open store file, shared by threads under a lock: the base of
    :class:`~coalesce._lanes.store.JobStore`, whose docstring gives the arguments."""

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
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {str(self.path)!r} {state}>"

    def close(self) -> None:
        """Close the connection; everything written is already committed."""
        with self._lock:
            self._closed = True
            self._db.close()

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def new_custom_id(self) -> str:
        """A ``custom_id`` never returned before: a random per-store prefix and a counter.

        It is 1-64 characters of ``[0-9a-f-]``, which both providers accept.
        """
        with self._lock:
            return f"{self._line_prefix}-{next(self._line_numbers)}"

    def _write(self) -> AbstractContextManager[sqlite3.Cursor]:
        """One write transaction, committed on exit, rolled back whole if anything raises."""
        return self._transaction(write=True)

    def _read(self) -> AbstractContextManager[sqlite3.Cursor]:
        """One consistent snapshot for several reads."""
        return self._transaction(write=False)

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[sqlite3.Cursor]:
        # IMMEDIATE takes the write lock up front, so two processes never both read
        # and then fail to write; a read is always rolled back (it changed nothing).
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield cur
                if write:
                    cur.execute("COMMIT")
            finally:
                if self._db.in_transaction:
                    self._db.rollback()
