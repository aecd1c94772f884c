"""The batch lane of one LLM function: calls nobody waits on, through a batch API.

A call routed here (see :mod:`coalesce._lanes.choose`) is keyed and written to the job
store, then waits for the lane's window (``batch_window``) with the others. The window's
items are packed ``per_line`` to a line, all lines in one job (chunked to the
provider's limits), and the job is submitted, polled and read back
(:mod:`coalesce._lanes.openai_jobs`, :mod:`coalesce._lanes.anthropic_jobs`). Items a job
released (expiry, a 5xx) go to a follow-up job, up to ``max_attempts`` jobs per item.

A call whose item the store already answered returns that answer at once, in this
process or the next; a call whose item sits in an unfinished job (a process that
stopped while it waited) attaches to that job instead of submitting it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import anyio

from .._batcher import Batcher, Resolve
from .._exceptions import ItemError
from .._spec import FunctionSpec
from .._wire.packing import pack_request
from ..providers import CompletionRequest
from . import anthropic_jobs, openai_jobs
from .lines import ANTHROPIC_LIMITS, OPENAI_LIMITS, anthropic_request, chunk, openai_line
from .records import ItemRow, Job, PlannedLine
from .results import Poll
from .store import JobStore

__all__ = ["BatchLane"]

#: Most lines one window sends, as one job or several (the providers' own caps).
_MAX_WINDOW_ITEMS = 1_000_000


class BatchLane:
    """The batch lane of the function ``spec`` (see the module doc).

    Args:
        spec: The function; its provider must have a batch API (``batch_api``).
        store: Where jobs and items are kept.
        window: Seconds a call waits for others before the window's job is sent.
        per_line: Items packed into one batch line.
        max_attempts: Jobs one item may be sent in, follow-ups included.
        poll: How often a job is polled.
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
    ) -> None:
        self.spec, self.store, self.per_line = spec, store, per_line
        self.max_attempts, self.poll = max_attempts, poll
        self.kind = str(getattr(spec.provider, "batch_api", ""))
        self.client: Any = getattr(spec.provider, "client", None)
        self.runner: ModuleType = openai_jobs if self.kind == "openai" else anthropic_jobs
        self._attaching = anyio.Lock()
        self._attached = False
        self.batcher: Batcher[ItemRow, Any] = Batcher(
            self._run,
            max_wait=window,
            max_items=_MAX_WINDOW_ITEMS,
            name=f"{spec.name} (batch lane)",
            resolve_early=True,
        )

    async def submit(self, item: Any) -> Any:
        """``item``'s answer through the batch lane (at once if the store has it)."""
        spec = self.spec
        row = ItemRow.for_call(spec.name, spec.model, spec.instructions, spec.output_schema, item)
        # A point read by primary key (microseconds): on the loop, so that calls made
        # together reach the window together.
        stored = self.store.get(row.key)
        if stored is not None and stored.state == "done":
            return spec.validate(stored.result)
        return await self.batcher(row)

    async def aclose(self) -> None:
        """Send the window now and wait for its jobs."""
        await self.batcher.aclose()

    async def _run(self, rows: list[ItemRow], resolve: Resolve) -> None:
        await anyio.to_thread.run_sync(self.store.add_items, rows)
        await self._attach()
        for _ in range(self.max_attempts):
            pending = await self._pending(rows)
            if not pending:
                break
            for job in await anyio.to_thread.run_sync(self._plan, pending):
                await self._finish(job)
        await self._answer(rows, resolve)

    async def _attach(self) -> None:
        """Once per lane: finish the jobs an earlier process left unfinished."""
        async with self._attaching:
            if not self._attached:
                await self.runner.resume(self.store, self.client, self.spec.validate, self.poll)
                self._attached = True

    async def _finish(self, job: Job) -> None:
        """Submit ``job``, wait for it, record its results."""
        batch_id = await self.runner.submit(self.store, self.client, job)
        batch = await self.runner.wait(self.client, batch_id, self.poll)
        await self.runner.collect(self.store, self.client, job, batch, self.spec.validate)

    async def _pending(self, rows: Sequence[ItemRow]) -> list[ItemRow]:
        """The window's items still needing a job (not done, not failed for good)."""
        keys = {row.key for row in rows}
        pending = await anyio.to_thread.run_sync(self.store.pending_items)
        waiting = {item.key for item in pending} & keys
        return [row for row in {row.key: row for row in rows}.values() if row.key in waiting]

    def _plan(self, rows: Sequence[ItemRow]) -> list[Job]:  # in a worker thread
        """Write the job(s) asking for ``rows``, packed ``per_line`` to a line."""
        lines = [
            self._line(rows[i : i + self.per_line]) for i in range(0, len(rows), self.per_line)
        ]
        limits = OPENAI_LIMITS if self.kind == "openai" else ANTHROPIC_LIMITS
        by_id = {line.custom_id: line for line in lines}
        return [
            self.store.plan_job(
                "openai" if self.kind == "openai" else "anthropic",
                self.spec.model,
                "batch",
                [by_id[str(body["custom_id"])] for body in part],
            )
            for part in chunk([line.request for line in lines], limits)
        ]

    def _line(self, rows: Sequence[ItemRow]) -> PlannedLine:
        spec = self.spec
        packed = pack_request(spec.instructions, [row.input for row in rows], spec.output_schema)
        request = CompletionRequest(
            model=spec.model,
            system=packed.system,
            user=packed.user,
            reply_schema=packed.reply_schema,
            options=spec.request_options,
        )
        custom_id = self.store.new_custom_id()
        arguments = spec.provider.arguments(request)  # type: ignore[attr-defined]
        build: Callable[[str, Any], dict[str, Any]] = (
            openai_line if self.kind == "openai" else anthropic_request
        )
        return PlannedLine(custom_id, build(custom_id, arguments), [row.key for row in rows])

    async def _answer(self, rows: Sequence[ItemRow], resolve: Resolve) -> None:
        delays = (self.poll or Poll()).delays()
        for index, row in enumerate(rows):
            stored = await anyio.to_thread.run_sync(self.store.get, row.key)
            while stored is not None and stored.state == "assigned":  # in another window's job
                await anyio.sleep(delays())
                stored = await anyio.to_thread.run_sync(self.store.get, row.key)
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
