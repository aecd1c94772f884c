"""One group of calls: build → send → judge → settle, then ask again for the failures.

:func:`run_group` runs inside one batch. Each request goes through four steps, each a
few lines:

1. :func:`build`: the calls still waiting, in writing order, as one packed request (or
   a plain call, for a group of one);
2. :func:`send`: through the provider with retries; a streamed reply is split as it
   arrives and each caller answered as soon as its own output is complete;
3. :func:`judge`: every id's validated output or failure, once the reply is complete;
4. :func:`~coalesce._engine.settle.settle` (pure): who gets a value, who an error, who is asked
   again, in a smaller group, then alone; an item's last attempt is always a plain
   call of its own (:func:`last_attempts`).

After each request the runner writes a :class:`~coalesce._calls.RequestReport` for its
observer (statistics, the planner, usage shares); it never learns or counts itself.
It is the one writer of each call's :class:`~coalesce._calls.Progress` (attempts,
done, company, when its group started); a call's own data is frozen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._accuracy.trust import SchemaTrust, schema_broken
from .._batching.batcher import Resolve
from .._batching.runtime import current_time
from .._calls import GroupObserver, Job, RequestReport
from .._exceptions import InvalidInputError, RequestTimeoutError
from .._options import REQUEST_TIMEOUT
from .._planning.context import is_context_error, is_limit_error
from .._planning.cost import PackingCost
from .._planning.planner import streaming_order
from .._planning.state import Planning
from .._wire.jsonstream import Resolved, StreamSplitter
from .._wire.outcomes import FailureKind, ItemFailure, Split, failure_error
from .._wire.packing import PackedRequest, pack_request, split_reply
from .._wire.plain import plain_request, split_plain, text_output, wrapped_output
from ..providers import Completion, CompletionRequest
from .retry import complete_with_retries
from .settle import give_up_error, settle
from .spec import FunctionSpec, Options, keyed_replies

__all__ = ["Asked", "Group", "Sent", "build", "judge", "last_attempts", "run_group", "send"]


@dataclass(frozen=True)
class Group:
    """What every request of one engine's groups shares.

    ``trust`` says whether streamed answers may be handed over before their reply
    ends (see :mod:`coalesce._accuracy.trust`); without one, they are held. A group smaller than
    ``cost.pays_from`` is sent as plain calls, concurrently: packed, it would cost more
    (see :mod:`coalesce._planning.cost`), unless the provider's request quota is what
    binds. Every request carries ``cache_key``, the name of its function's prefix for
    the provider's prompt cache.
    """

    spec: FunctionSpec
    options: Options
    observer: GroupObserver
    planning: Planning | None = None
    trust: SchemaTrust = field(default_factory=lambda: SchemaTrust(False))
    cost: PackingCost | None = None  # None: packing always pays
    cache_key: str | None = None
    reverse: bool = False  # write each request's items in the reverse of the usual order
    # The max_tokens of a request carrying these jobs (one per item); None: the option's.
    output_cap: Callable[[Sequence[Job]], int | None] | None = None

    @property
    def pays_from(self) -> float:
        """The smallest group packing pays for (``math.inf``: none)."""
        return 2 if self.cost is None else self.cost.pays_from


@dataclass
class Asked:
    """One request being asked: which calls it carries, by id, and what it sends."""

    jobs: list[Job]
    slots: dict[str, list[int]]  # id -> indexes of the jobs it answers
    request: CompletionRequest
    plain: bool  # a plain call of one item
    text: bool  # ... answered in text
    reask: bool
    deadline: float
    pinned: bool = True  # its reply schema names every id


@dataclass
class Sent:
    """What came back: the reply (or what arrived of it) and what the stream decided."""

    completion: Completion
    streamed: bool = False
    error: BaseException | None = None
    error_headers: Mapping[str, str] = field(default_factory=dict)
    early: dict[str, Any] = field(default_factory=dict)  # per id, delivered while streaming
    splitter: StreamSplitter[Any] | None = None
    parts: list[str] = field(default_factory=list)  # the text that arrived, streamed
    abandoned: bool = False  # every caller was freed at its deadline; the request stopped


async def run_group(group: Group, jobs: list[Job], resolve: Resolve) -> None:
    """Ask for every job's output; re-ask failures in smaller groups, then alone."""
    _started(jobs)
    if len(jobs) > 1 and not packs(group, len(jobs)):
        await run_plain(group, jobs, resolve)
        return
    try:
        pending = list(range(len(jobs)))
        size = len(pending)
        while pending:
            alone, packed = last_attempts(group, jobs, pending)
            if alone:
                failed = await _ask_with_last_attempts(group, jobs, alone, packed, size, resolve)
            else:  # no plain call to make beside them: no task group either
                failed = await _ask_in_turn(group, jobs, packed, size, resolve)
            pending = failed
            size = max(1, math.ceil(len(failed) / 2)) if size > 1 else 1
        for index, job in enumerate(jobs):
            if not job.done:  # never expected: no caller may be left with nothing
                failure = ItemFailure(FailureKind.MISSING, None, "no outcome was decided for it")
                error = failure_error(str(index + 1), failure, attempts=job.attempts)
                _give(jobs, index, error, resolve)
    finally:
        group.observer.group_done(jobs)


async def _ask_in_turn(
    group: Group, jobs: list[Job], packed: list[int], size: int, resolve: Resolve
) -> list[int]:
    """Ask for ``packed`` in requests of ``size``, one after the other; what to re-ask."""
    failed: list[int] = []
    for start in range(0, len(packed), size):
        failed += await ask(group, jobs, packed[start : start + size], resolve)
    return failed


async def _ask_with_last_attempts(
    group: Group,
    jobs: list[Job],
    alone: list[list[int]],
    packed: list[int],
    size: int,
    resolve: Resolve,
) -> list[int]:
    """The last attempts in ``alone``, each a plain call, at once, beside ``packed``
    asked in turn; what to re-ask (never one of the last attempts)."""
    async with anyio.create_task_group() as tg:
        for members in alone:
            tg.start_soon(ask, group, jobs, members, resolve)
        failed = await _ask_in_turn(group, jobs, packed, size, resolve)
    return failed


def last_attempts(
    group: Group, jobs: list[Job], pending: list[int]
) -> tuple[list[list[int]], list[int]]:
    """``pending`` split into the re-asks whose next request is their last, each to be
    asked alone (its job indexes: several with ``dedupe``), and the rest.

    A packed reply's fault (an item dropped, duplicated, the ids shuffled) can strike
    a packed re-ask again; a plain call of one item cannot suffer it. So an item's last
    attempt is a plain call, whatever the group it came in.
    """
    last = group.options.max_attempts
    alone: dict[str, list[int]] = {}
    packed: list[int] = []
    for index in pending:
        job = jobs[index]
        if job.attempts > 0 and job.attempts + 1 >= last:
            key = job.key if group.options.dedupe else str(index)
            alone.setdefault(key, []).append(index)
        else:
            packed.append(index)
    return list(alone.values()), packed


def _started(jobs: Sequence[Job]) -> None:
    """Note when each job's group started to be asked (the first group that asks it)."""
    now = current_time()
    for job in jobs:
        if job.progress.dispatched_at is None:
            job.progress.dispatched_at = now


def packs(group: Group, size: int) -> bool:
    """Whether :func:`run_group` asks for ``size`` calls in packed requests."""
    return size > 1 and (size >= group.pays_from or _requests_bind(group))


def _requests_bind(group: Group) -> bool:
    planning = group.planning
    return planning is not None and planning.requests_bind(current_time())


async def run_plain(group: Group, jobs: list[Job], resolve: Resolve) -> None:
    """Each job as a plain call of its own, all at once (packing would cost more)."""

    async def alone(index: int) -> None:
        def own(_: int, outcome: Any) -> None:
            resolve(index, outcome)

        await run_group(group, [jobs[index]], own)

    async with anyio.create_task_group() as tg:
        for index in range(len(jobs)):
            tg.start_soon(alone, index)


async def ask(group: Group, jobs: list[Job], indexes: list[int], resolve: Resolve) -> list[int]:
    """Send one request for ``indexes``; settle what it answers; return what to re-ask."""
    asked = build(group, jobs, indexes)
    for index in indexes:
        jobs[index].progress.company = len(asked.slots)
    group.observer.request_sent(
        {i: [jobs[index] for index in members] for i, members in asked.slots.items()},
        asked.reask,
    )
    sent = await send(group, asked, resolve)
    if sent.error is not None and not sent.streamed:
        _report(group, asked, sent, {})
        error = sent.error
        if is_limit_error(error) and len(asked.slots) > 1:
            return indexes  # too long for the model together: asked again in halves
        if is_context_error(error):
            error = _too_long(error)
        for index in indexes:  # the provider's own error, to this request's callers only
            if not jobs[index].done:
                _give(jobs, index, error, resolve)
        return []
    outcomes, split = judge(group, asked, sent)
    _report(group, asked, sent, outcomes, split)
    return _apply(group, asked, sent, outcomes, resolve)


def build(group: Group, jobs: list[Job], indexes: list[int]) -> Asked:
    """The request for the calls at ``indexes``: deduplicated, in writing order."""
    spec, options = group.spec, group.options
    slots: dict[str, list[int]] = {}
    for index in indexes:
        slots.setdefault(jobs[index].key if options.dedupe else str(index), []).append(index)
    members = _writing_order(group, jobs, list(slots.values()))
    if group.reverse:
        members.reverse()
    pin = pinned(group)
    packed, plain = _request_for(group, [jobs[member[0]].item for member in members], pin)
    reask = any(jobs[index].attempts > 0 for index in indexes)
    for index in indexes:
        jobs[index].progress.attempts += 1
    request = CompletionRequest(
        model=spec.model,
        system=packed.system,
        user=packed.user,
        reply_schema=(packed.reply_schema or None) if spec.provider.structured else None,
        max_output_tokens=_output_cap(group, [jobs[member[0]] for member in members]),
        stream=options.stream,
        options=spec.request_options,
        cache_key=group.cache_key,
    )
    return Asked(
        jobs=jobs,
        slots=dict(zip(packed.ids, members, strict=False)),
        request=request,
        plain=plain,
        text=plain and text_output(spec.output_schema),
        reask=reask,
        deadline=min(jobs[index].deadline for index in indexes),
        pinned=pin,
    )


async def send(group: Group, asked: Asked, resolve: Resolve) -> Sent:
    """Send ``asked`` with retries, freeing each caller still waiting at its deadline
    (unless an explicit ``timeout`` bounds the request instead).

    While the reply streams from a provider trusted to enforce the reply schema, each
    caller whose output is complete is answered at once; otherwise answers wait for
    the reply's end (see :mod:`coalesce._accuracy.trust`). A failure after some text arrived
    keeps what arrived (a cut reply).
    """
    early = not asked.plain and group.trust.enforced
    splitter = StreamSplitter(tuple(asked.slots), group.spec.validate) if early else None
    sent = Sent(Completion(text="", finish_reason="length"), splitter=splitter)
    started = current_time()
    if math.isfinite(asked.deadline) and group.options.timeout is None:
        async with anyio.create_task_group() as watch:
            watch.start_soon(_free_at_deadlines, asked, sent, resolve, watch.cancel_scope)
            await _request(group, asked, sent, resolve)
            watch.cancel_scope.cancel()
    else:  # nobody to free before the request ends: nothing to watch
        await _request(group, asked, sent, resolve)
    if sent.abandoned:
        waited = current_time() - started
        sent.error = RequestTimeoutError(
            f"no reply {waited:.2f} s after the request was sent; every caller's latency"
            " budget ran out, so the request was abandoned",
            seconds=waited,
        )
        sent.completion = dataclasses.replace(sent.completion, seconds=waited)
    return sent


async def _request(group: Group, asked: Asked, sent: Sent, resolve: Resolve) -> None:
    """The provider call of :func:`send`, with retries; fills in ``sent``."""
    provider, options = group.spec.provider, group.options

    def on_text(delta: str) -> None:
        sent.streamed = True
        sent.parts.append(delta)
        for event in () if sent.splitter is None else sent.splitter.feed(delta):
            if isinstance(event, Resolved):
                sent.early[event.id] = event.value
                _deliver(asked, event.id, event.value, resolve)

    started = current_time()
    try:
        sent.completion = await complete_with_retries(
            provider,
            asked.request,
            on_text=on_text if options.stream else None,
            deadline=asked.deadline,
            attempt_timeout=_attempt_timeout(options, asked.deadline, provider),
            max_attempts=options.max_retries + 1,
            on_retry=group.observer.retrying,
        )
    except Exception as exc:
        sent.error = exc
        sent.error_headers = getattr(provider.advise(exc), "headers", {})
        sent.completion = Completion(
            text="".join(sent.parts),
            finish_reason="length",
            seconds=current_time() - started,
        )


def _output_cap(group: Group, jobs: list[Job]) -> int | None:
    """The ``max_tokens`` of the request carrying ``jobs``."""
    if group.output_cap is None:
        return group.options.max_output_tokens
    return group.output_cap(jobs)


def _attempt_timeout(options: Options, deadline: float, provider: Any) -> float | None:
    """How long one attempt may run: the ``timeout`` option; without one, a budget's
    deadline bounds it (callers are freed then); else an SDK client with a timeout of
    its own enforces it (``None`` here: never undercut, and its timeout error is
    retried like any other), else :data:`~coalesce._options.REQUEST_TIMEOUT`."""
    if options.timeout is not None:
        return options.timeout
    if math.isfinite(deadline) or getattr(provider, "default_timeout", None):
        return None
    return REQUEST_TIMEOUT


async def _free_at_deadlines(
    asked: Asked, sent: Sent, resolve: Resolve, request: anyio.CancelScope
) -> None:
    """Free each caller still waiting when its budget runs out; once none waits, stop
    the request."""
    jobs = [asked.jobs[index] for members in asked.slots.values() for index in members]
    sent_at = current_time()
    for deadline in sorted({job.deadline for job in jobs}):
        await anyio.sleep_until(deadline)
        now = current_time()  # a clock may round: compare deadlines, not times
        for members in asked.slots.values():
            for index in members:
                job = asked.jobs[index]
                if not job.done and job.deadline <= deadline:
                    _give(asked.jobs, index, _timeout_error(job, now, sent_at), resolve)
        if all(job.done for job in jobs):
            sent.abandoned = True
            request.cancel()
            return


def _too_long(error: BaseException) -> InvalidInputError:
    """A lone item the provider refused as too long for the model's context window."""
    refused = InvalidInputError(
        "the item is too large for the model's context window, with the instructions and"
        f" room for its output (the provider said: {error}); shorten or split it, or lower"
        " max_output_tokens"
    )
    refused.__cause__ = error
    return refused


def _timeout_error(job: Job, now: float, sent_at: float) -> RequestTimeoutError:
    """The error of a caller whose budget ran out while its request was at the provider:
    where the time went, coalesce's own queue (windows, retries, a ``max_concurrency``
    slot) before its first request was sent, or the provider after (a re-ask's earlier
    requests count as the provider's)."""
    waited = now - job.arrival
    earlier = job.dispatched_at if job.attempts > 1 else None  # a re-ask's first request
    again = earlier is not None
    first = sent_at if earlier is None else min(sent_at, earlier)
    queued, provider = max(0.0, first - job.arrival), max(0.0, now - first)
    sent = "its first request was" if again else "its request was"
    split = f"{queued:.2f} s in coalesce's queue before {sent} sent, {provider:.2f} s"
    if again:
        split += f" over {job.attempts} requests"
    if queued > provider:
        why = (
            "most of it waiting in coalesce's own queue: allow more requests in flight"
            " (max_concurrency=), send fewer calls at once (f.map), or raise latency_budget="
        )
    else:
        why = "the provider is slower than the budget allows: raise latency_budget=, or check"
        why += " the provider"
    return RequestTimeoutError(
        f"no answer within the call's {job.budget:g} s latency budget (waited {waited:.2f} s:"
        f" {split} at the provider); {why}",
        seconds=waited,
    )


def judge(group: Group, asked: Asked, sent: Sent) -> tuple[dict[str, Any], Split[Any] | None]:
    """Per id, the validated output or an :class:`ItemFailure`, once the reply is complete;
    and the split of the complete reply (``None`` for a plain call)."""
    completion, validate = sent.completion, group.spec.validate
    if asked.plain:
        plain = split_plain(
            completion.text,
            validate,
            truncated=completion.truncated,
            as_text=asked.text,
            wrapped=wrapped_output(group.spec.output_schema),
        )
        return {**plain.values, **plain.failures}, None
    split = split_reply(
        completion.text, tuple(asked.slots), validate, truncated=completion.truncated
    )
    # An answer already handed over stands; the complete reply only judges the rest.
    return {**split.values, **split.failures, **sent.early}, split


def _apply(
    group: Group, asked: Asked, sent: Sent, outcomes: Mapping[str, Any], resolve: Resolve
) -> list[int]:
    """Settle the ids whose callers still wait; hand out values and errors; return the
    indexes to ask again."""
    jobs, max_attempts = asked.jobs, group.options.max_attempts
    waiting = {i: o for i, o in outcomes.items() if _undone(asked, i)}
    attempts = {i: jobs[_undone(asked, i)[0]].attempts for i in waiting}
    now = current_time()

    def may_reask(ids: Sequence[str]) -> bool:
        plans = [jobs[index].plan for i in ids for index in _undone(asked, i)]
        if group.planning is None or any(plan is None for plan in plans):
            return True
        return group.planning.may_reask(plans, asked.deadline, now)  # type: ignore[arg-type]

    decided = settle(
        waiting,
        attempts,
        max_attempts=max_attempts,
        took=sent.completion.seconds or 0.0,
        time_left=asked.deadline - now,
        may_reask=may_reask,
    )
    for item_id, value in decided.values.items():
        _deliver(asked, item_id, value, resolve)
    for item_id, failure in decided.give_up.items():
        error = give_up_error(item_id, failure, attempts[item_id], max_attempts)
        _deliver(asked, item_id, error, resolve)
    return sorted(index for i in decided.reask for index in _undone(asked, i))


def _report(
    group: Group,
    asked: Asked,
    sent: Sent,
    outcomes: Mapping[str, Any],
    split: Split[Any] | None = None,
) -> None:
    jobs = asked.jobs
    completion = None if sent.error is not None and not sent.streamed else sent.completion
    slots = {i: [jobs[index] for index in indexes] for i, indexes in asked.slots.items()}
    report = RequestReport(
        slots=slots,
        plain=asked.plain,
        text=asked.text,
        reask=asked.reask,
        completion=completion,
        error=sent.error,
        error_headers=sent.error_headers,
        outcomes=outcomes,
        streamed=sent.streamed,
        seconds=sent.completion.seconds or 0.0,
        now=current_time(),
        schema_broken=split is not None and schema_broken(split),
        contradicted=_contradicted(sent, split),
        pinned=asked.pinned,
        attempt=max((job.attempts for members in slots.values() for job in members), default=0),
    )
    group.observer.request_done(report)


def _contradicted(sent: Sent, split: Split[Any] | None) -> tuple[str, ...]:
    """Ids answered while streaming to which the complete reply gave another output."""
    if split is None:
        return ()
    failures = split.failures
    return tuple(
        i for i in sent.early if i in failures and failures[i].kind is FailureKind.DUPLICATE
    )


def _undone(asked: Asked, item_id: str) -> list[int]:
    return [index for index in asked.slots.get(item_id, ()) if not asked.jobs[index].done]


def _deliver(asked: Asked, item_id: str, outcome: Any, resolve: Resolve) -> None:
    for index in _undone(asked, item_id):
        _give(asked.jobs, index, outcome, resolve)


def _give(jobs: list[Job], index: int, outcome: Any, resolve: Resolve) -> None:
    jobs[index].progress.done = True
    resolve(index, outcome)


def _request_for(group: Group, items: list[Any], pin: bool) -> tuple[PackedRequest, bool]:
    """The request asking for ``items``, and whether it is a plain call of one item.

    A group of one gains nothing from packing: it is asked as a plain call would ask it
    (see :mod:`coalesce._wire.plain`).
    """
    spec = group.spec
    structured = spec.provider.structured
    if len(items) == 1:
        instructions = spec.instructions
        if spec.plain_instructions is not None:
            instructions = spec.plain_instructions
        plain = plain_request(instructions, items[0], spec.output_schema, structured=structured)
        return plain, True
    packed = pack_request(
        spec.instructions,
        items,
        spec.output_schema,
        structured=structured,
        pin=pin,
        keyed=keyed_replies(spec, group.options),
    )
    return packed, False


def pinned(group: Group) -> bool:
    """Whether to pin the ids in the reply schema (see docs/protocol.md).

    A pinned schema differs between group sizes, and providers cache it before the
    instructions (OpenAI puts the schema first, Anthropic its tools): where the prompt
    cache would keep the shared prefix, an unpinned schema keeps it the same for every
    request, so every request reads the instructions from the cache. A provider trusted
    to enforce the schema keeps it pinned: answers handed over while the reply streams
    rely on the schema's forbidding a repeated id.
    """
    cost = group.cost
    if group.trust.enforced or cost is None or cost.cache is None:
        return True
    return cost.footprint.shared < cost.cache.min_tokens


def _writing_order(group: Group, jobs: list[Job], slots: list[list[int]]) -> list[list[int]]:
    """The order to ask for ``slots`` (job indexes sharing one item) in.

    Short answers first, so that with streaming the split hands them back before the
    model writes the long ones; when planning, as far as deadlines allow (see
    :func:`~coalesce._planning.planner.streaming_order`). Without a planner, or without
    a budget, short inputs first: their answers are usually short too.
    """
    planning = group.planning
    plans = [jobs[slot[0]].plan for slot in slots]
    unplanned = any(plan is None for plan in plans) or all(math.isinf(j.deadline) for j in jobs)
    if planning is None or unplanned:
        return sorted(slots, key=lambda slot: len(jobs[slot[0]].key))
    items = [
        dataclasses.replace(plan, deadline=min(jobs[index].deadline for index in slot))
        for plan, slot in zip(plans, slots, strict=True)
        if plan is not None
    ]
    order = streaming_order(items, planning.limits, planning.predict, current_time())
    return [slots[index] for index in order]
