"""The job store's line writes: a line's answers recorded item by item, or the line
released when it got none (see :mod:`coalesce._lanes.store` for the states)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coalesce._exceptions import ConfigurationError
from coalesce._lanes.connection import StoreConnection
from coalesce._lanes.schema import dump_json
from coalesce._lanes.statements import record_item_outcome, release_line, require_carried

__all__ = ["LineWrites"]


class LineWrites(StoreConnection):
    """The line writes of :class:`~coalesce._lanes.store.JobStore`."""

    def record_line_results(
        self, answers: Sequence[tuple[str, Mapping[str, Any], Mapping[str, str]]]
    ) -> None:
        """Record each line's answers, ``(custom_id, results, failures)``: ``results``
        (item key → JSON) and ``failures`` (→ error), in one transaction: one commit (one
        fsync) for a job's thousands of lines. All or none are recorded.

        Items with a result become ``done`` (a result is kept even from an expired line;
        an item already done keeps its first result); items with a failure become
        ``failed`` unless a newer line holds them; items the line carried that neither
        mapping names go back to ``pending``. The line becomes ``done``, or ``failed``
        when it gave no result at all. Safe to repeat. Durable when it returns.

        Raises:
            ConfigurationError: no such line, a key the line does not carry, a key in
                both mappings, or a result that is not JSON.
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
    """One line's answers, inside the caller's transaction (see ``record_line_results``)."""
    carried = require_carried(cur, custom_id, path)
    strangers = (encoded.keys() | failures.keys()) - set(carried)
    if strangers:
        raise ConfigurationError(
            f"line {custom_id} does not carry items {sorted(strangers)}; record each"
            f" item's answer under the line that carried it"
        )
    for key in carried:
        record_item_outcome(cur, custom_id, key, encoded.get(key), failures.get(key), now)
    state = "done" if encoded else "failed"
    cur.execute("UPDATE lines SET state = ? WHERE custom_id = ?", (state, custom_id))
