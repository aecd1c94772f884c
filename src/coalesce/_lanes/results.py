"""What a batch job's lines gave, whatever the provider: split, validated, recorded.

A packed line's reply is split by id (``"1"`` .. ``"n"`` in the order of the items the
line carries) and each output validated; the store then records each item's result
or failure. A line with no reply that may come on a second asking (expiry,
cancellation, 429/5xx) releases its items for a follow-up job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._wire.outcomes import Split
from .._wire.packing import make_ids, split_reply
from .lines import LineOutcome
from .records import JobState, StoredLine
from .store import JobStore

__all__ = ["JobOutcome", "Poll", "final_state", "settle_line", "split_line"]


@dataclass(frozen=True)
class Poll:
    """How often to ask about a batch: from ``first`` seconds, times ``factor`` after
    each answer that is not final, up to ``longest``."""

    first: float = 10.0
    factor: float = 1.5
    longest: float = 600.0

    def delays(self) -> Callable[[], float]:
        """A fresh sequence of delays."""
        state = [self.first]

        def next_delay() -> float:
            delay = state[0]
            state[0] = min(self.longest, delay * self.factor)
            return delay

        return next_delay


@dataclass
class JobOutcome:
    """What one job gave: per item key, a result or an error, and what was released."""

    state: str
    results: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)


def final_state(status: str, answered: bool) -> JobState:
    """The job's end: a "completed" batch in which no line was answered is a failure."""
    if status == "completed":
        return "completed" if answered else "failed"
    return "expired" if status == "expired" else "cancelled" if status == "cancelled" else "failed"


async def settle_line(
    store: JobStore,
    line: StoredLine,
    outcome: LineOutcome | None,
    validate: Callable[[Any], Any],
    into: JobOutcome,
) -> None:
    if outcome is None or outcome.status == "retry":
        into.released += await anyio.to_thread.run_sync(store.expire_line, line.custom_id)
        return
    if outcome.status == "failed":
        failures = dict.fromkeys(line.item_keys, outcome.error)
        await anyio.to_thread.run_sync(store.record_line_result, line.custom_id, {}, failures)
        into.failures.update(failures)
        return
    results, failures = split_line(line.item_keys, outcome.text, validate)
    await anyio.to_thread.run_sync(store.record_line_result, line.custom_id, results, failures)
    into.results.update(results)
    into.failures.update(failures)


def split_line(
    keys: Sequence[str], text: str, validate: Callable[[Any], Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Per item key, the validated output (as JSON) or why there is none."""
    ids = make_ids(len(keys))
    split: Split[Any] = split_reply(text, ids, validate)
    by_id: Mapping[str, str] = dict(zip(ids, keys, strict=True))
    results = {by_id[i]: _jsonable(value) for i, value in split.values.items()}
    failures = {by_id[i]: str(failure) for i, failure in split.failures.items()}
    return results, failures


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value
