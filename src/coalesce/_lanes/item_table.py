"""The job store's items: adding them, reading them, and sending them back to be
asked again (see :mod:`coalesce._lanes.store` for the states an item moves through)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coalesce._lanes.connection import StoreConnection
from coalesce._lanes.records import ItemRow, StoredItem
from coalesce._lanes.schema import among, dump_json, item_from_row
from coalesce._lanes.statements import needs_work

__all__ = ["ItemTable"]


class ItemTable(StoreConnection):
    """The item methods of :class:`~coalesce._lanes.store.JobStore`."""

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
