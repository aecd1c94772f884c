"""One group of calls: build → send → judge → settle, then ask again for the failures.

:func:`run_group` runs inside one batch. Each request goes through four steps, each a
few lines:

1. :func:`build`: the calls still waiting, in writing order, as one packed request (or
   a plain call, for a group of one);
2. :func:`send`: through the provider with retries; a streamed reply is split as it
   arrives and each caller answered as soon as its own output is complete;
3. :func:`judge`: every id's validated output or failure, once the reply is complete;
4. :func:`~coalesce._settle.settle` (pure): who gets a value, who an error, who is asked
   again, in a smaller group, then alone.

After each request the runner writes a :class:`~coalesce._report.RequestReport` for its
observer (statistics, the planner, usage shares); it never learns or counts itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ._batcher import Resolve
from ._planning.planner import streaming_order
from ._planning.state import Planning
from ._report import GroupObserver, Job, RequestReport
from ._retry import complete_with_retries
from ._settle import give_up_error, settle
from ._spec import FunctionSpec, Options, keyed_replies
from ._wire.jsonstream import Failed, Resolved, StreamSplitter
from ._wire.outcomes import FailureKind, ItemFailure, failure_error
from ._wire.packing import PackedRequest, pack_request, split_reply
from ._wire.plain import has_plain_form, plain_request, split_plain, text_output
from .providers import Completion, CompletionRequest

__all__ = ["Asked", "Group", "Sent", "build", "judge", "run_group", "send"]


@dataclass(frozen=True)
class Group:
    """What every request of one engine's groups shares."""

    spec: FunctionSpec
    options: Options
    observer: GroupObserver
    planning: Planning | None = None


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


@dataclass
class Sent:
    """What came back: the reply (or what arrived of it) and what the stream decided."""

    completion: Completion
    streamed: bool = False
    error: BaseException | None = None
    error_headers: Mapping[str, str] = field(default_factory=dict)
    early: dict[str, Any] = field(default_factory=dict)  # per id, decided while streaming
    splitter: StreamSplitter[Any] | None = None


async def run_group(group: Group, jobs: list[Job], resolve: Resolve) -> None:
    """Ask for every job's output; re-ask failures in smaller groups, then alone."""
    try:
        pending = list(range(len(jobs)))
        size = len(pending)
        while pending:
            failed: list[int] = []
            for start in range(0, len(pending), size):
                failed += await ask(group, jobs, pending[start : start + size], resolve)
            pending = failed
            size = max(1, math.ceil(len(failed) / 2)) if size > 1 else 1
        for index, job in enumerate(jobs):
            if not job.done:  # never expected: no caller may be left with nothing
                failure = ItemFailure(FailureKind.MISSING, None, "no outcome was decided for it")
                error = failure_error(str(index + 1), failure, attempts=job.attempts)
                _give(jobs, index, error, resolve)
    finally:
        group.observer.group_done(jobs)


async def ask(group: Group, jobs: list[Job], indexes: list[int], resolve: Resolve) -> list[int]:
    """Send one request for ``indexes``; settle what it answers; return what to re-ask."""
    asked = build(group, jobs, indexes)
    sent = await send(group, asked, resolve)
    if sent.error is not None and not sent.streamed:
        _report(group, asked, sent, {})
        raise sent.error  # nobody was answered: every caller gets the provider's own error
    outcomes = judge(group, asked, sent)
    _report(group, asked, sent, outcomes)
    return _apply(group, asked, sent, outcomes, resolve)


def build(group: Group, jobs: list[Job], indexes: list[int]) -> Asked:
    """The request for the calls at ``indexes``: deduplicated, in writing order."""
    spec, options = group.spec, group.options
    slots: dict[str, list[int]] = {}
    for index in indexes:
        slots.setdefault(jobs[index].key if options.dedupe else str(index), []).append(index)
    members = _writing_order(group, jobs, list(slots.values()))
    packed, plain = _request_for(group, [jobs[member[0]].item for member in members])
    reask = any(jobs[index].attempts > 0 for index in indexes)
    for index in indexes:
        jobs[index].attempts += 1
    request = CompletionRequest(
        model=spec.model,
        system=packed.system,
        user=packed.user,
        reply_schema=(packed.reply_schema or None) if spec.provider.structured else None,
        max_output_tokens=options.max_output_tokens,
        stream=options.stream,
        options=spec.request_options,
    )
    return Asked(
        jobs=jobs,
        slots=dict(zip(packed.ids, members, strict=False)),
        request=request,
        plain=plain,
        text=plain and text_output(spec.output_schema),
        reask=reask,
        deadline=min(jobs[index].deadline for index in indexes),
    )


async def send(group: Group, asked: Asked, resolve: Resolve) -> Sent:
    """Send ``asked`` with retries; while it streams, answer each caller whose output is
    complete. A failure after some text arrived keeps what arrived (a cut reply)."""
    provider = group.spec.provider
    splitter = None if asked.plain else StreamSplitter(tuple(asked.slots), group.spec.validate)
    sent = Sent(Completion(text="", finish_reason="length"), splitter=splitter)

    def on_text(delta: str) -> None:
        sent.streamed = True
        for event in () if splitter is None else splitter.feed(delta):
            if isinstance(event, Resolved):
                sent.early[event.id] = event.value
                _deliver(asked, event.id, event.value, resolve)
            elif isinstance(event, Failed):
                sent.early[event.id] = event.failure

    started = anyio.current_time()
    try:
        sent.completion = await complete_with_retries(
            provider,
            asked.request,
            on_text=on_text if group.options.stream else None,
            deadline=asked.deadline,
            max_attempts=group.options.max_retries + 1,
            on_retry=group.observer.retrying,
        )
    except Exception as exc:
        sent.error = exc
        sent.error_headers = getattr(provider.advise(exc), "headers", {})
        sent.completion = dataclasses.replace(
            sent.completion, seconds=anyio.current_time() - started
        )
    return sent


def judge(group: Group, asked: Asked, sent: Sent) -> dict[str, Any]:
    """Per id, the validated output or an :class:`ItemFailure`, once the reply is complete."""
    completion, validate = sent.completion, group.spec.validate
    if asked.plain:
        split = split_plain(
            completion.text, validate, truncated=completion.truncated, as_text=asked.text
        )
        return {**split.values, **split.failures}
    if not sent.streamed or sent.splitter is None:
        split = split_reply(
            completion.text, tuple(asked.slots), validate, truncated=completion.truncated
        )
        return {**split.values, **split.failures}
    outcomes = dict(sent.early)
    for event in sent.splitter.close(truncated=completion.truncated):
        if isinstance(event, Failed):  # what the stream decided first stands
            outcomes.setdefault(event.id, event.failure)
    return outcomes


def _apply(
    group: Group, asked: Asked, sent: Sent, outcomes: Mapping[str, Any], resolve: Resolve
) -> list[int]:
    """Settle the ids whose callers still wait; hand out values and errors; return the
    indexes to ask again."""
    jobs, max_attempts = asked.jobs, group.options.max_attempts
    waiting = {i: o for i, o in outcomes.items() if _undone(asked, i)}
    attempts = {i: jobs[_undone(asked, i)[0]].attempts for i in waiting}
    now = anyio.current_time()

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


def _report(group: Group, asked: Asked, sent: Sent, outcomes: Mapping[str, Any]) -> None:
    jobs = asked.jobs
    completion = None if sent.error is not None and not sent.streamed else sent.completion
    report = RequestReport(
        slots={i: [jobs[index] for index in indexes] for i, indexes in asked.slots.items()},
        plain=asked.plain,
        text=asked.text,
        reask=asked.reask,
        completion=completion,
        error=sent.error,
        error_headers=sent.error_headers,
        outcomes=outcomes,
        streamed=sent.streamed,
        seconds=sent.completion.seconds or 0.0,
        now=anyio.current_time(),
    )
    group.observer.request_done(report)


def _undone(asked: Asked, item_id: str) -> list[int]:
    return [index for index in asked.slots.get(item_id, ()) if not asked.jobs[index].done]


def _deliver(asked: Asked, item_id: str, outcome: Any, resolve: Resolve) -> None:
    for index in _undone(asked, item_id):
        _give(asked.jobs, index, outcome, resolve)


def _give(jobs: list[Job], index: int, outcome: Any, resolve: Resolve) -> None:
    jobs[index].done = True
    resolve(index, outcome)


def _request_for(group: Group, items: list[Any]) -> tuple[PackedRequest, bool]:
    """The request asking for ``items``, and whether it is a plain call of one item.

    A group of one gains nothing from packing: when its output can be asked for on its
    own (an object, or text), it is asked as a plain call would ask it.
    """
    spec = group.spec
    structured = spec.provider.structured
    if len(items) == 1 and has_plain_form(spec.output_schema):
        plain = plain_request(
            spec.instructions, items[0], spec.output_schema, structured=structured
        )
        return plain, True
    packed = pack_request(
        spec.instructions,
        items,
        spec.output_schema,
        structured=structured,
        keyed=keyed_replies(spec, group.options),
    )
    return packed, False


def _writing_order(group: Group, jobs: list[Job], slots: list[list[int]]) -> list[list[int]]:
    """The order to ask for ``slots`` (job indexes sharing one item) in.

    Short answers first, so that with streaming the split hands them back before the
    model writes the long ones; when planning, as far as deadlines allow (see
    :func:`~coalesce._planning.planner.streaming_order`). Without a planner, short
    inputs first: their answers are usually short too.
    """
    planning = group.planning
    plans = [jobs[slot[0]].plan for slot in slots]
    if planning is None or any(plan is None for plan in plans):
        return sorted(slots, key=lambda slot: len(jobs[slot[0]].key))
    items = [
        dataclasses.replace(plan, deadline=min(jobs[index].deadline for index in slot))
        for plan, slot in zip(plans, slots, strict=True)
        if plan is not None
    ]
    order = streaming_order(items, planning.limits, planning.predict, anyio.current_time())
    return [slots[index] for index in order]
