"""The engines behind a wrapped client: one per kind of call, one recorder per model.

Calls of one kind (equal :attr:`~.call.SdkCall.key`: same model, instructions,
schema and options) sent with the same credentials share an
:class:`~coalesce._engine.engine.Engine`, so only they are packed together; their
usage shares are charged by one :class:`~coalesce._observe.listeners.UsageShares`
listener. A copy of the wrapped client with other credentials or another base URL
(:func:`~.credentials.credentials_key`) sends through a provider of its own
(:meth:`Engines.add_sender`); its statistics are the same recorders'.

Each engine has a :class:`~coalesce._lanes.router.LaneRouter` in front of it: a call
goes in real time, through flex or through the batch lane, as its ``x-coalesce-lane``
header (else ``wrap(lane=...)``) and its budget say. The batch lane keeps a lane of its
own per kind of call, credentials and partition (:func:`batch_name`), so that items of
different callers never share a line, nor an answer in the job store; each lane finishes
only its own jobs an earlier process left. With ``wrap(store=...)`` given, the jobs of
the client's own credentials an earlier process left are finished as soon as the
client is made inside a running loop (:meth:`Engines.adopt`): that is how a restarted
``coalesce serve`` attaches to them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from .._batching.runtime import running_owner, spawn_task
from .._calls import Job
from .._engine.engine import Engine
from .._engine.spec import FunctionSpec, Lane, Options
from .._lanes.choose import check_lane
from .._lanes.lane import BatchLane, finish_jobs
from .._lanes.records import BatchJob
from .._lanes.results import Poll
from .._lanes.router import LaneRouter, lanes_of
from .._lanes.store import JobStore
from .._observe.events import logger
from .._observe.listeners import UsageShare, UsageShares
from .._observe.recorder import PromptRecorder, PromptStatistics
from .._planning.tokens import estimator_for
from ..providers import Completion, CompletionRequest, Provider, RetryAdvice
from .call import TASK, SdkCall
from .spelled import spelled_output_tokens
from .translator import Answer

__all__ = ["Answered", "Engines", "batch_name"]


@dataclass(frozen=True)
class Answered(Answer):
    """An :class:`~.translator.Answer`, and how many calls shared the request that
    answered it (the ``x-coalesce-group-size`` of its raw response).

    Attributes:
        company: Calls in the last request that carried it (1: it went alone).
        lane: The lane that answered it (``"realtime"``, ``"flex"`` or ``"batch"``).
    """

    company: int = 1
    lane: str = "realtime"


def batch_name(call: SdkCall, sender: str | None, partition: Hashable) -> str:
    """The name of the batch lane of calls like ``call`` from ``sender`` in
    ``partition``: ``wrap:MODEL:DIGEST``, with ``@SENDER`` after it for a copy with
    other credentials (the store keys items by it; nothing secret is in it)."""
    scope = json.dumps([call.key, sender, repr(partition)], sort_keys=True)
    digest = hashlib.sha256(scope.encode()).hexdigest()[:16]
    return f"wrap:{call.model}:{digest}" + (f"@{sender[:16]}" if sender else "")


def _root_job(functions: frozenset[str]) -> bool:
    """Whether a job's items are all the drop-in client's, sent with its own credentials."""
    return bool(functions) and all(f.startswith("wrap:") and "@" not in f for f in functions)


def _validator(schema: Mapping[str, Any] | None) -> Callable[[Any], Any]:
    """A light check: text for no schema, the JSON type the schema names otherwise."""
    kinds: dict[str, tuple[type, ...]] = {
        "object": (dict,),
        "array": (list,),
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "boolean": (bool,),
    }
    expected = kinds.get(str(schema.get("type"))) if schema is not None else (str,)

    def validate(value: Any) -> Any:
        if expected is not None and not isinstance(value, expected):
            raise ValueError(f"expected {expected[0].__name__}, got {type(value).__name__}")
        return value

    return validate


class PromptedFormat:
    """``provider``, taken to have no structured output: for a ``json_object`` call
    (:attr:`~.call.SdkCall.prompted`), the packed reply's frame is spelled out in the
    system message and no reply schema is sent (the call's own ``response_format`` is,
    in its options); the server holds the reply to JSON, not to the frame, so answers
    are held until the reply ends. Everything else is ``provider``'s own."""

    structured = False
    enforces_schema = False

    def __init__(self, provider: Provider) -> None:
        self.inner = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, request: CompletionRequest, on_text: Any = None) -> Completion:
        """Send ``request`` through the wrapped provider."""
        return await self.inner.complete(request, on_text)

    def advise(self, error: BaseException) -> RetryAdvice:
        """The wrapped provider's advice."""
        return self.inner.advise(error)


def _asked_as(call: SdkCall, provider: Provider) -> Provider:
    return PromptedFormat(provider) if call.prompted else provider


class Engines:
    """One engine (and its lane router) per kind of call; one recorder per model; usage
    shares for all; the job store of the batch lanes, opened on first use."""

    def __init__(self, provider: Provider, options: Options) -> None:
        check_lane(options.lane, lanes_of(provider))
        self._provider = provider
        self._options = options
        self._routers: dict[str, LaneRouter] = {}
        self._recorders: dict[str, PromptRecorder] = {}
        self._shares = UsageShares()
        self._senders: dict[str, Provider] = {}
        self._store: JobStore | None = None
        #: The jobs :meth:`adopt` finishes (the batch lanes leave them to it).
        self._adopting: set[str] = set()
        #: The adoption's scope and end, once started (made where a loop runs).
        self._stopping: anyio.CancelScope | None = None
        self._adopted: anyio.Event | None = None

    def add_sender(self, sender: str, provider: Callable[[], Provider]) -> None:
        """Send the calls of ``sender`` (a :func:`~.credentials.credentials_key`) through
        ``provider()``, made now unless that sender already has one.

        Args:
            sender: The credentials key of a copy of the wrapped client.
            provider: Makes the provider over that copy.
        """
        if sender not in self._senders:
            self._senders[sender] = provider()

    def engine(self, call: SdkCall, sender: str | None = None) -> Engine:
        """The engine serving calls like ``call`` sent by ``sender`` (``None``: the
        wrapped client itself, or a copy with its credentials)."""
        return self.router(call, sender).engine

    def router(self, call: SdkCall, sender: str | None = None) -> LaneRouter:
        """The lane router in front of :meth:`engine`."""
        key = call.key if sender is None else f"{sender}:{call.key}"
        router = self._routers.get(key)
        if router is None:
            spec = FunctionSpec(
                name=f"wrap:{call.model}",
                provider=_asked_as(
                    call, self._provider if sender is None else self._senders[sender]
                ),
                model=call.model,
                instructions=call.instructions,
                output_schema=call.output_schema or {"type": "string"},
                validate=_validator(call.output_schema),
                request_options=dict(call.options),
                # Sent alone, a call carries its own system text only, as it would plainly.
                plain_instructions=call.instructions.removesuffix(TASK).rstrip("\n"),
            )
            recorder = self._recorder(call.model)
            engine = Engine(
                spec, self._options_for(call), recorder=recorder, observers=[self._shares]
            )
            # setdefault: threads' loops may build one at once; the first one kept serves all.
            router = self._routers.setdefault(key, LaneRouter(engine, observers=[self._shares]))
        return router

    def lane_of(
        self, call: SdkCall, sender: str | None, asked: str | None, budget: float | None
    ) -> Lane:
        """The lane of ``call`` asking for ``asked`` (its header; ``None``: ``wrap``'s
        ``lane=``) with ``budget``.

        Raises:
            ConfigurationError: ``asked`` is a lane the provider does not offer.
        """
        return self.router(call, sender).lane_for(asked, budget)

    def _options_for(self, call: SdkCall) -> Options:
        # The caller's max_tokens caps its own answer; a packed request asks what its
        # items are expected to need within their caps and the model's output limit
        # (request_output_cap), never each cap times the group.
        # Streamed callers get their answer as the split finds it; the others wait for
        # the whole reply anyway (their usage share needs it).
        options = self._options.replace(item_output_cap=call.item_cap, stream=call.stream)
        if options.expected_output_tokens is None and (call.prompted or call.output_schema is None):
            # The format asked in the prompt: the schema it spells out sizes the first groups.
            estimator = options.token_estimator or estimator_for(call.model)
            fenced = not call.prompted  # a text answer may wrap its JSON in a fence
            expected = spelled_output_tokens(call.instructions, estimator, fenced=fenced)
            if expected is not None:
                options = options.replace(expected_output_tokens=expected)
        return options

    def _recorder(self, model: str) -> PromptRecorder:
        recorder = self._recorders.get(model)
        if recorder is None:
            o = self._options
            recorder = PromptRecorder(f"wrap:{model}", model, prices=o.prices, on_event=o.on_event)
            self._recorders[model] = recorder
        return recorder

    def statistics(self) -> dict[str, PromptStatistics]:
        """A snapshot of each model's recorder."""
        return {model: recorder.snapshot() for model, recorder in self._recorders.items()}

    async def answer(
        self,
        call: SdkCall,
        budget: float | None = None,
        partition: Hashable = None,
        sender: str | None = None,
        lane: Lane = Lane.REALTIME,
    ) -> Answered:
        """Await ``call``'s own answer, with its usage share, the reply that carried it
        (the share's ``finished`` event is set once it is final), how many calls that
        reply answered and the lane that answered it.

        Args:
            call: The call, as its translator read it.
            budget: Seconds this call may wait (its ``x-coalesce-budget`` header).
            partition: Calls of different partitions never share a request.
            sender: Whose credentials the call is sent with (see :meth:`engine`).
            lane: Its lane (see :meth:`lane_of`).
        """
        router = self.router(call, sender)
        if lane is Lane.BATCH:
            return await self._batch(router, call, sender, partition)
        if lane is Lane.FLEX:
            return await self._flex(router, call, budget, partition)
        job = router.engine.new_job(call.item, budget=budget, partition=partition)
        share = self._shares.track(job)
        try:
            value = await router.engine.answer(job)
        except BaseException:
            self._shares.forget(job)
            raise
        return Answered(value, call, share, company=max(job.company, 1), lane="realtime")

    async def _flex(
        self, router: LaneRouter, call: SdkCall, budget: float | None, partition: Hashable
    ) -> Answered:
        """``call`` through flex processing, or real time where flex refuses it: each job
        made for it is charged its share until it is refused."""
        jobs: list[tuple[Job, str, UsageShare]] = []

        def told(job: Job, lane: str) -> None:
            jobs.append((job, lane, self._shares.track(job)))

        try:
            value = await router.flex(call.item, budget=budget, partition=partition, on_job=told)
        except BaseException:
            for job, _, _ in jobs:
                self._shares.forget(job)
            raise
        for job, _, _ in jobs[:-1]:
            self._shares.forget(job)  # refused by flex: its requests were not billed
        job, answered_by, share = jobs[-1]
        return Answered(value, call, share, company=max(job.company, 1), lane=answered_by)

    async def _batch(
        self, router: LaneRouter, call: SdkCall, sender: str | None, partition: Hashable
    ) -> Answered:
        """``call`` through its batch lane (see :func:`batch_name`); its usage share is
        an even split of its line's usage (none for an answer an earlier process got)."""
        name = batch_name(call, sender, partition)

        def owns(job: BatchJob) -> bool:
            store = self.store()
            return job.id not in self._adopting and store.job_functions(job.id) == {name}

        lane: BatchLane = router.batch_lane(name, owns, self.store())
        value = await lane.submit(call.item)
        line, company = await lane.line_of(call.item)
        share = UsageShare()
        if line is not None:
            share.prompt_tokens = round(line.usage.input_tokens / line.items)
            share.completion_tokens = round(line.usage.output_tokens / line.items)
            share.reply, share.reply_id = {"id": line.custom_id}, "batch"
        share.finish()
        return Answered(value, call, share, company=company, lane="batch")

    def store(self) -> JobStore:
        """The batch lanes' job store (``wrap(store=...)``), opened on first use."""
        if self._store is None:
            given = self._options.store
            self._store = given if isinstance(given, JobStore) else JobStore(given)
        return self._store

    def adopt(self) -> None:
        """Finish, in the background, the jobs an earlier process left in the store that
        the wrapped client's own credentials sent (see the module doc). Called where a
        loop runs and ``store=`` was given; the batch lanes leave these jobs to it."""
        if running_owner() is None or self._options.store is None:
            return
        store = self.store()
        jobs = [job.id for job in store.unfinished_jobs() if _root_job(store.job_functions(job.id))]
        if jobs:
            self._adopting.update(jobs)
            self._stopping, self._adopted = scope, done = anyio.CancelScope(), anyio.Event()
            spawn_task(self._adopt, frozenset(jobs), scope, done)

    async def _adopt(
        self, jobs: frozenset[str], scope: anyio.CancelScope, done: anyio.Event
    ) -> None:
        poll = Poll.every(float(self._options.poll_interval))
        with scope:
            try:
                await finish_jobs(self._provider, self.store(), lambda job: job.id in jobs, poll)
            except Exception as exc:  # told, not raised: there is no caller to tell
                logger.log(
                    logging.WARNING,
                    "coalesce: the batch jobs an earlier process left could not be finished"
                    " (%r); they are left unfinished in the store for the next start",
                    exc,
                )
            finally:
                self._adopting.difference_update(jobs)
                done.set()

    async def aclose(self) -> None:
        """Close every engine and lane: pending calls are sent now and awaited; jobs
        still being adopted are left to the next process."""
        if self._stopping is not None and self._adopted is not None:
            self._stopping.cancel()
            await self._adopted.wait()
        for router in list(self._routers.values()):
            await router.aclose()
        if self._store is not None and self._store is not self._options.store:
            self._store.close()
