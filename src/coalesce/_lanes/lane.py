"""The batch lane of one LLM function: calls nobody waits on, through a batch API.

A call routed here (see :mod:`coalesce._lanes.choose`) is keyed and written to the job
store, then waits for the lane's window (``batch_window``) with the others. The window's
items are packed up to ``per_line`` to a line where packing pays for the function (a
line of one item is a plain request, as in real time: see :func:`line_sizes`), all
lines in one job (chunked to the provider's limits), and the job is submitted, polled
and read back
(:mod:`coalesce._lanes.openai_jobs`, :mod:`coalesce._lanes.anthropic_jobs`). Items a job
released (expiry, a 5xx) go to a follow-up job, up to ``max_attempts`` jobs per item.

A call whose item the store already answered returns that answer at once, in this
process or the next; a call whose item sits in an unfinished job (a process that
stopped while it waited) attaches to that job instead of submitting it again.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from types import ModuleType
from typing import Any, Protocol

import anyio

from .._batching.batcher import Batcher, Resolve
from .._engine.spec import FunctionSpec
from .._exceptions import ItemError
from .._observe.events import logger
from .._observe.recorder import PromptRecorder
from .._wire.packing import pack_request
from .._wire.plain import plain_request
from ..providers import CompletionRequest, Usage
from . import anthropic_jobs, openai_jobs
from .lines import ANTHROPIC_LIMITS, OPENAI_LIMITS, anthropic_request, chunk, openai_line
from .records import BatchJob, ItemRow, PlannedLine, StoredItem
from .results import JobOutcome, LineUsage, Poll, plain_custom_id, poll_until
from .resume import Owns
from .store import JobStore

__all__ = ["BatchLane", "RecordLine", "finish_jobs", "line_sizes"]


class RecordLine(Protocol):
    """Records one batch line's reply in the statistics; returns its cost (NaN: no
    price). See :meth:`~coalesce._observe.listeners.StatisticsListener.line_done`."""

    def __call__(self, items: int, usage: Usage, *, line: str, attempt: int) -> float: ...


def _log(message: str) -> None:
    """One line about the batch lane on the ``"coalesce"`` logger, at ``INFO``."""
    logger.log(logging.INFO, "%s", message)


#: Lines whose usage a lane remembers for its callers' usage shares (the latest).
_REMEMBERED = 100_000

#: Most lines one window sends, as one job or several (the providers' own caps).
_MAX_WINDOW_ITEMS = 1_000_000


def line_sizes(items: int, per_line: int, pays_from: int | None) -> list[int]:
    """How many items each line of a window of ``items`` carries. Pure.

    As few lines as ``per_line`` allows, their sizes even (23 items at 10 a line are
    8, 8 and 7, not 10, 10 and 3); lines smaller than ``pays_from``, the smallest group
    packing pays for, are plain requests of one item instead (all of them when
    ``pays_from`` is ``None``).
    """
    if items <= 0:
        return []
    if pays_from is None or per_line < max(2, pays_from):
        return [1] * items
    lines = math.ceil(items / per_line)
    base, extra = divmod(items, lines)
    if base < pays_from:
        return [1] * items
    return [base + 1] * extra + [base] * (lines - extra)


async def finish_jobs(
    provider: Any, store: JobStore, owns: Owns, poll: Poll | None = None
) -> dict[str, JobOutcome]:
    """Finish the unfinished jobs of ``store`` that ``owns`` names, through
    ``provider``'s batch API, whatever function asked them: answers are recorded as
    their JSON, and each caller's lane validates its own when it reads it (an invalid
    one is asked again). Per local job id, its outcome."""
    runner: ModuleType = openai_jobs if provider.batch_api == "openai" else anthropic_jobs
    outcomes: dict[str, JobOutcome] = await runner.resume(
        store, provider.client, _as_is, poll, owns
    )
    for job_id, outcome in outcomes.items():
        _log(f"adopted batch job {job_id} {outcome}")
    return outcomes


def _as_is(value: Any) -> Any:
    return value


class BatchLane:
    """The batch lane of the function ``spec`` (see the module doc).

    Args:
        spec: The function; its provider must have a batch API (``batch_api``).
        store: Where jobs and items are kept.
        window: Seconds a call waits for others before the window's job is sent.
        per_line: Most items packed into one batch line.
        max_attempts: Jobs one item may be sent in, follow-ups included.
        poll: How often a job is polled.
        pays_from: The smallest line packing pays for (``None``: none, every line is a
            plain request); called when a window is planned, as it is learned.
        recorder: Where its calls and lines are counted (at the batch price), and the
            jobs it adopts from an earlier process (apart: ``adopted_*``).
        record_line: Records one line's reply in ``recorder`` (see
            :meth:`~coalesce._observe.listeners.StatisticsListener.line_done`); returns
            its cost in dollars (NaN when the model has no price).
        adopts: Which unfinished jobs of the store it finishes when it opens
            (default: those carrying only its own function's items, so functions
            sharing a store never finish, nor validate, each other's jobs).
        screen: Whether an item must be asked alone (the function's ``screen=``): such
            an item gets a line of its own, as in real time it gets a request of its
            own. A screen that raises sends its item alone too.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        store: JobStore,
        *,
        window: float,
        per_line: int,
        max_attempts: int = 3,
        poll: Poll | None = None,
        pays_from: Callable[[], int | None] = lambda: 2,
        recorder: PromptRecorder | None = None,
        record_line: RecordLine | None = None,
        adopts: Owns | None = None,
        screen: Callable[[Any], bool] | None = None,
    ) -> None:
        self.spec, self.store, self.per_line = spec, store, per_line
        self.adopts: Owns = adopts if adopts is not None else self._carries_only_mine
        self.max_attempts, self.poll, self.pays_from = max_attempts, poll, pays_from
        self.recorder, self.record_line, self.screen = recorder, record_line, screen
        self.kind = str(getattr(spec.provider, "batch_api", ""))
        self.client: Any = getattr(spec.provider, "client", None)
        self.runner: ModuleType = openai_jobs if self.kind == "openai" else anthropic_jobs
        #: How much one job may carry (a window with more is sent as several jobs).
        self.limits = OPENAI_LIMITS if self.kind == "openai" else ANTHROPIC_LIMITS
        self._attaching = anyio.Lock()
        self._attached = False
        #: The usage of this process's latest lines, by ``custom_id`` (see :meth:`line_of`).
        self._lines: OrderedDict[str, LineUsage] = OrderedDict()
        self.batcher: Batcher[ItemRow, Any] = Batcher(
            self._run,
            max_wait=window,
            max_items=_MAX_WINDOW_ITEMS,
            name=f"{spec.name} (batch lane)",
            resolve_early=True,
        )

    async def submit(self, item: Any) -> Any:
        """``item``'s answer through the batch lane (at once if the store has it)."""
        started, ok = anyio.current_time(), False
        try:
            result = await self._submit(item)
            ok = True
            return result
        finally:
            if self.recorder is not None:
                self.recorder.call_finished(anyio.current_time() - started, ok=ok, lane="batch")

    async def _submit(self, item: Any) -> Any:
        spec = self.spec
        row = ItemRow.for_call(spec.name, spec.model, spec.instructions, spec.output_schema, item)
        # A point read by primary key (microseconds): on the loop, so that calls made
        # together reach the window together.
        stored = self.store.get(row.key)
        if stored is not None and stored.state == "done":
            try:
                return spec.validate(stored.result)
            except Exception:  # collected without the output type (``coalesce jobs``)
                self.store.release(row.key)  # asked again, below
        return await self.batcher(row)

    async def line_of(self, item: Any) -> tuple[LineUsage | None, int]:
        """The line that answered ``item`` (``None``: an earlier process's, or one this
        lane no longer remembers) and how many items that line carried (1 if unknown)."""
        spec = self.spec
        row = ItemRow.for_call(spec.name, spec.model, spec.instructions, spec.output_schema, item)
        stored = await anyio.to_thread.run_sync(self.store.get, row.key)
        line = None if stored is None or stored.line is None else self._lines.get(stored.line)
        return line, 1 if line is None else line.items

    async def aclose(self) -> None:
        """Send the window now and wait for its jobs."""
        await self.batcher.aclose()

    async def _run(self, rows: list[ItemRow], resolve: Resolve) -> None:
        await anyio.to_thread.run_sync(self.store.add_items, rows)
        await self._attach()
        for attempt in range(1, self.max_attempts + 1):
            pending = await self._pending(rows)
            if attempt > 1 and not pending:
                break
            again = f" again (attempt {attempt} of {self.max_attempts})" if attempt > 1 else ""
            _log(
                f"{self.spec.name} (batch lane): a window of {len(rows)} calls,"
                f" {len(pending)} items to ask{again}"
            )
            if not pending:
                break
            jobs = await anyio.to_thread.run_sync(self._plan, pending)
            for job in jobs:
                _log(f"{self.spec.name} (batch lane): batch job {job.id} planned")
            async with anyio.create_task_group() as tg:  # chunks of one window run together
                for job in jobs:
                    tg.start_soon(self._finish, job, attempt < self.max_attempts)
        await self._answer(rows, resolve)

    async def _attach(self) -> None:
        """Once per lane: finish the jobs an earlier process left unfinished. Their
        figures are the earlier process's: counted as adopted, not as this run's."""
        async with self._attaching:
            if not self._attached:
                outcomes = await self.runner.resume(
                    self.store, self.client, self.spec.validate, self.poll, self.adopts
                )
                for job_id, outcome in outcomes.items():
                    await self._account(job_id, outcome, adopted=True)
                self._attached = True

    def _carries_only_mine(self, job: BatchJob) -> bool:  # in a worker thread
        return self.store.job_functions(job.id) == {self.spec.name}

    async def _finish(self, job: BatchJob, again: bool) -> None:
        """Submit ``job``, wait for it, record its results; with ``again``, items its
        replies answered invalidly (or not at all) go to the follow-up job."""
        batch_id = await self.runner.submit(self.store, self.client, job, self.poll)
        batch = await self.runner.wait(self.client, batch_id, self.poll)
        outcome = await self.runner.collect(self.store, self.client, job, batch, self.spec.validate)
        await self._account(job.id, outcome)
        if again and outcome.invalid:
            await anyio.to_thread.run_sync(self.store.retry_items, outcome.invalid)

    async def _account(self, job_id: str, outcome: JobOutcome, *, adopted: bool = False) -> None:
        """Count a collected job's lines in the statistics (an ``adopted`` job's apart);
        record its cost in the store."""
        spent = math.nan
        if adopted and self.recorder is not None:
            spent = self.recorder.adopted([line.usage for line in outcome.usage])
        if not adopted:
            self._remember(outcome.usage)
        if not adopted and self.record_line is not None:
            record = self.record_line
            spent = sum(
                (record(n, usage, line=cid, attempt=k) for cid, n, usage, k in outcome.usage), 0.0
            )
        _log(
            f"{self.spec.name} (batch lane): {'adopted ' if adopted else ''}batch job {job_id}"
            f" {outcome}" + ("" if math.isnan(spent) else f", ${spent:.6f}")
        )
        if not math.isnan(spent):
            await anyio.to_thread.run_sync(
                lambda: self.store.finish_job(job_id, outcome.state, cost_usd=spent)  # type: ignore[arg-type]
            )

    def _remember(self, lines: Sequence[LineUsage]) -> None:
        """Keep the usage of the latest :data:`_REMEMBERED` lines, for :meth:`line_of`."""
        for line in lines:
            self._lines[line.custom_id] = line
        while len(self._lines) > _REMEMBERED:
            self._lines.popitem(last=False)

    async def _pending(self, rows: Sequence[ItemRow]) -> list[ItemRow]:
        """The window's items still needing a job (not done, not failed for good)."""
        keys = {row.key for row in rows}
        pending = await anyio.to_thread.run_sync(self.store.pending_items)
        waiting = {item.key for item in pending} & keys
        return [row for row in {row.key: row for row in rows}.values() if row.key in waiting]

    def _plan(self, rows: Sequence[ItemRow]) -> list[BatchJob]:  # in a worker thread
        """Write the job(s) asking for ``rows``, packed as :func:`line_sizes` says (an
        item the screen flags on a line of its own)."""
        flags = [self._alone(row) for row in rows]
        alone = [row for row, flagged in zip(rows, flags, strict=True) if flagged]
        rows = [row for row, flagged in zip(rows, flags, strict=True) if not flagged]
        lines, start = [self._line([row]) for row in alone], 0
        for size in line_sizes(len(rows), self.per_line, self.pays_from()):
            lines.append(self._line(rows[start : start + size]))
            start += size
        by_id = {line.custom_id: line for line in lines}
        jobs = []
        for part in chunk([line.request for line in lines], self.limits):
            job = self.store.plan_job(
                "openai" if self.kind == "openai" else "anthropic",
                self.spec.model,
                "batch",
                [by_id[str(body["custom_id"])] for body in part],
            )
            jobs.append(job)
        return jobs

    def _alone(self, row: ItemRow) -> bool:
        if self.screen is None:
            return False
        try:
            return bool(self.screen(row.input))
        except Exception:  # the real-time call fails alone; here it is asked alone
            return True

    def _line(self, rows: Sequence[ItemRow]) -> PlannedLine:
        spec, structured = self.spec, self.spec.provider.structured
        custom_id = self.store.new_custom_id()
        if len(rows) == 1:  # a plain request, as a plain call would ask it
            packed = plain_request(
                spec.instructions, rows[0].input, spec.output_schema, structured=structured
            )
            custom_id = plain_custom_id(custom_id, spec.output_schema)
        else:
            inputs = [row.input for row in rows]
            packed = pack_request(
                spec.instructions, inputs, spec.output_schema, structured=structured
            )
        request = CompletionRequest(
            model=spec.model,
            system=packed.system,
            user=packed.user,
            reply_schema=(packed.reply_schema or None) if structured else None,
            options=spec.request_options,
        )
        arguments = spec.provider.arguments(request)  # type: ignore[attr-defined]
        build: Callable[[str, Any], dict[str, Any]] = (
            openai_line if self.kind == "openai" else anthropic_request
        )
        return PlannedLine(custom_id, build(custom_id, arguments), [row.key for row in rows])

    async def _answer(self, rows: Sequence[ItemRow], resolve: Resolve) -> None:
        poll = self.poll or Poll()
        # One read for the window's items (one worker-thread hop, not one per item).
        found = await anyio.to_thread.run_sync(self.store.get_many, [row.key for row in rows])
        for index, (row, stored) in enumerate(zip(rows, found, strict=True)):
            if _assigned(stored):  # in another window's job: read again until it is not
                read = partial(anyio.to_thread.run_sync, self.store.get, row.key)
                stored = await poll_until(read, _unassigned, poll)
            if stored is not None and stored.state == "done":
                resolve(index, self.spec.validate(stored.result))
            else:
                why = "no answer" if stored is None else stored.error or stored.state
                resolve(
                    index,
                    ItemError(
                        f"{self.spec.name}: the batch lane gave no answer for this item after"
                        f" {self.max_attempts} jobs ({why})",
                        item_id=row.key,
                        raw=None if stored is None else stored.result,
                        attempts=self.max_attempts,
                    ),
                )


def _assigned(stored: StoredItem | None) -> bool:
    return stored is not None and stored.state == "assigned"


def _unassigned(stored: StoredItem | None) -> bool:
    return not _assigned(stored)
