"""One group of ``coalesce.prompt`` calls: ask, split, re-ask; and what the planner
learns from each reply.

The pieces here run inside one batch (one group of calls): they pack the group into
requests, send them, resolve each caller as its own output arrives, and ask again
for the items whose output was missing or invalid.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ._exceptions import ItemError
from ._jsonstream import Failed, Resolved, StreamSplitter
from ._latency import LatencyModel, LatencyPrior
from ._outcomes import FailureKind, ItemFailure, failure_error
from ._packing import PackedRequest, pack_request, split_reply
from ._plain import answers_alone, plain_request, split_plain, text_output
from ._planner import (
    Pace,
    PlanItem,
    PlanLimits,
    RateLimitState,
    allow_reask,
    group_tokens,
    pack_more,
    parse_rate_limit_headers,
    streaming_order,
)
from ._prompt_stats import PromptRecorder
from ._retry import RetryEvent, complete_with_retries
from ._tokens import OutputTokenRegistry, TokenEstimator, count_json_tokens, estimator_for
from .providers import Completion, CompletionRequest, Provider

__all__ = ["Job", "Planning", "Spec", "keyed_replies", "run_group"]

#: Largest group before the planner has measured any: after that, at most twice the
#: largest measured, so predictions never extrapolate far beyond what was observed.
SLOW_START = 8


@dataclass
class Job:
    """One call in flight: its item, deadline and how many requests carried it."""

    item: Any
    key: str  # canonical JSON of the item, for de-duplication
    deadline: float
    partition: Hashable = None
    plan: PlanItem | None = None  # token estimates and deadline, when planning
    attempts: int = 0
    outcome: Any = None
    done: bool = False
    dispatched_at: float | None = None  # when its group was handed to the provider


@dataclass(frozen=True)
class Spec:
    """Everything fixed at decoration time."""

    name: str
    provider: Provider
    model: str
    instructions: str
    output_schema: Mapping[str, Any]
    validate: Callable[[Any], Any]
    max_attempts: int
    max_retries: int
    max_output_tokens: int | None
    stream: bool
    dedupe: bool
    options: Mapping[str, Any] = field(default_factory=dict)
    planner: Planning | None = None
    recorder: PromptRecorder | None = None
    shared_tokens: int = 0
    plain_shared_tokens: int | None = None  # what a plain call pays besides its item
    frame_tokens: int = 0  # what each item adds to the prompt besides its input
    answer_frame_tokens: int = 0  # what each answer adds to the reply besides its output


class Planning:
    """What the budget planner learns and knows about one decorated function.

    ``limits`` is what the planner applies now: the configured limits, with
    ``max_items`` held back by the slow start and ``max_wait`` stretched while the
    provider's request quota is the binding one (see :func:`~coalesce._planner.pack_more`).
    """

    def __init__(
        self,
        spec_model: str,
        limits: PlanLimits,
        output_prior: int,
        prior: LatencyPrior | None,
        estimator: TokenEstimator | None = None,
    ) -> None:
        self.estimator = estimator or estimator_for(spec_model)
        self.latency = LatencyModel(prior)
        self.configured = limits
        self.outputs = OutputTokenRegistry(default_prior=output_prior)
        # Slow start: a group may be at most twice the largest one measured so far,
        # so a prediction never extrapolates far beyond what the model has seen.
        self.largest = 1
        self.quota = RateLimitState()
        self._sent: deque[tuple[float, int]] = deque(maxlen=64)  # (time, tokens) per request
        self.limits = self._current_limits(0.0)

    def _current_limits(self, now: float) -> PlanLimits:
        allowed = min(max(SLOW_START, 2 * self.largest), self.configured.max_items)
        limits = dataclasses.replace(self.configured, max_items=allowed)
        return pack_more(self.quota, limits, self.pace(now), now)

    def whole_replies(self) -> None:
        """The provider answered a streamed request in one piece: from now on, every
        member of a group is predicted to wait for the whole reply."""
        if self.configured.streaming:
            self.configured = dataclasses.replace(self.configured, streaming=False)
            self.limits = dataclasses.replace(self.limits, streaming=False)

    def pace(self, now: float) -> Pace:
        """Requests per second and tokens per request over the recent requests."""
        if len(self._sent) < 2:
            return Pace(0.0, 0.0)
        span = max(now - self._sent[0][0], 1e-3)
        return Pace(len(self._sent) / span, sum(t for _, t in self._sent) / len(self._sent))

    def predict(self, input_tokens: int, output_tokens: int) -> float:
        return self.latency.predict(input_tokens, output_tokens).total

    def plan_item(self, item: Any, partition: Hashable, deadline: float, now: float) -> PlanItem:
        return PlanItem(
            input_tokens=count_json_tokens(item, self.estimator),
            output_tokens=self.outputs.expected(partition),
            deadline=deadline,
            arrival=now,
        )

    def heard(self, headers: Mapping[str, str], now: float) -> None:
        """Read the provider's rate-limit headers (of a reply or of a 429)."""
        state = parse_rate_limit_headers(headers, now)
        if state.requests is not None or state.tokens is not None:
            self.quota = RateLimitState(
                requests=state.requests or self.quota.requests,
                tokens=state.tokens or self.quota.tokens,
            )
            self.limits = self._current_limits(now)

    def learn(
        self,
        completion: Completion,
        items: int,
        partition: Hashable,
        now: float,
        *,
        packed: bool = True,
        text: str | None = None,
    ) -> None:
        usage = completion.usage
        if usage is not None:
            self._sent.append((now, usage.input_tokens + usage.output_tokens))
        self.heard(completion.headers, now)
        if usage is None or completion.seconds is None or items <= 0:
            return
        self.latency.observe(
            usage.input_tokens, usage.output_tokens, completion.seconds, ttft=completion.ttft
        )
        # The reply's own frame ({"results": {...}}) is small; each item costs its
        # output plus its key ("7":), which the planner adds back. A plain call's reply
        # is the output alone; a text one is written as a JSON string when packed.
        overhead = self.limits.per_item_output_overhead_tokens if packed else 0
        per_item = max(1, round(usage.output_tokens / items) - overhead)
        if text is not None:
            per_item += self.estimator.count(json.dumps(text)) - self.estimator.count(text)
        for _ in range(items):
            self.outputs.observe(partition, per_item)
        if items > self.largest:
            self.largest = items
            self.limits = self._current_limits(now)

    def may_reask(self, items: Sequence[PlanItem], deadline: float, now: float) -> bool:
        """When the token quota binds, spend tokens only on re-asks that can be on time."""
        input_tokens, output_tokens = group_tokens(items, self.limits)
        return allow_reask(
            self.quota,
            self.pace(now),
            now,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            deadline=deadline,
            predict=self.predict,
        )


async def run_group(spec: Spec, jobs: list[Job], settle: Callable[[int, Any], None]) -> None:
    """Ask for every job's output; re-ask failures in smaller groups, then alone."""
    pending = list(range(len(jobs)))
    group_size = len(pending)
    while pending:
        groups = [pending[i : i + group_size] for i in range(0, len(pending), group_size)]
        failed: list[int] = []
        for group in groups:
            failed += await _ask(spec, jobs, group, settle)
        pending = failed
        group_size = max(1, math.ceil(len(failed) / 2)) if group_size > 1 else 1
    for index, job in enumerate(jobs):
        if not job.done:  # never expected: no caller may be left with nothing
            failure = ItemFailure(FailureKind.MISSING, None, "no outcome was decided for it")
            settle(index, failure_error(str(index + 1), failure, attempts=job.attempts))


def keyed_replies(spec: Spec) -> bool:
    """Whether ``spec``'s requests ask for wire format 2 (outputs keyed by id).

    Not when the reply would reach us parsed and re-encoded (a forced tool's input, not
    streamed): a key the model repeated would be lost unseen there, and one of two
    differing answers handed over, where format 1 keeps both and fails the id.
    """
    return spec.stream or not getattr(spec.provider, "parsed_replies", False)


async def _ask(
    spec: Spec, jobs: list[Job], indexes: list[int], settle: Callable[[int, Any], None]
) -> list[int]:
    """Send one request for ``indexes``; settle what it answers; return what to re-ask."""
    # Identical items share one slot when dedupe is on.
    slots: dict[str, list[int]] = {}
    for index in indexes:
        key = jobs[index].key if spec.dedupe else str(index)
        slots.setdefault(key, []).append(index)
    members = _writing_order(spec, jobs, list(slots.values()))
    packed, alone = _request_for(spec, [jobs[group[0]].item for group in members])
    as_text = alone and text_output(spec.output_schema)  # a plain call answered in text
    by_id = dict(zip(packed.ids, members, strict=False))
    for index in indexes:
        jobs[index].attempts += 1

    def resolve(item_id: str, outcome: Any) -> None:
        for index in by_id.get(item_id, ()):
            if not jobs[index].done:
                settle(index, outcome)

    splitter = None if alone else StreamSplitter(packed.ids, spec.validate)
    streamed = False
    failed_early: dict[str, Any] = {}  # decided while streaming: re-asked or failed at the end

    def on_text(delta: str) -> None:
        nonlocal streamed
        streamed = True
        for event in () if splitter is None else splitter.feed(delta):
            if isinstance(event, Resolved):
                resolve(event.id, event.value)
            elif isinstance(event, Failed):
                failed_early[event.id] = event.failure

    request = CompletionRequest(
        model=spec.model,
        system=packed.system,
        user=packed.user,
        reply_schema=(packed.reply_schema or None) if spec.provider.structured else None,
        max_output_tokens=spec.max_output_tokens,
        stream=spec.stream,
        options=spec.options,
    )
    deadline = min(jobs[index].deadline for index in indexes)
    started = anyio.current_time()
    recorder = spec.recorder
    reask = any(jobs[index].attempts > 1 for index in indexes)
    try:
        completion = await complete_with_retries(
            spec.provider,
            request,
            on_text=on_text if spec.stream else None,
            deadline=deadline,
            max_attempts=spec.max_retries + 1,
            on_retry=None if recorder is None else _retry_recorder(recorder),
        )
    except Exception as exc:
        if spec.planner is not None:
            # A 429 carries the quota that refused us; the SDKs keep the response.
            headers = getattr(getattr(exc, "response", None), "headers", None)
            if headers is not None:
                spec.planner.heard({k.lower(): v for k, v in headers.items()}, anyio.current_time())
        if recorder is not None:
            recorder.request_failed(
                len(members), exc, seconds=anyio.current_time() - started, reask=reask
            )
        if not streamed:
            raise  # nobody was answered: every caller gets the provider's own error
        # The reply broke mid-stream: keep what arrived, ask again for the rest.
        completion = Completion(
            text="", finish_reason="length", seconds=anyio.current_time() - started
        )
    else:
        if recorder is not None:
            plain = spec.plain_shared_tokens
            recorder.request_finished(
                len(members),
                completion.usage,
                shared_input_tokens=plain if alone and plain is not None else spec.shared_tokens,
                plain_shared_input_tokens=plain,
                frame_tokens=0 if alone else spec.frame_tokens,
                answer_frame_tokens=0 if alone else spec.answer_frame_tokens,
                ttft=completion.ttft,
                seconds=completion.seconds,
                reask=reask,
            )
    if spec.planner is not None:
        if spec.stream and completion.text and (not streamed or completion.ttft is None):
            spec.planner.whole_replies()  # the reply came in one piece: no streaming here
        spec.planner.learn(
            completion,
            len(members),
            jobs[indexes[0]].partition,
            anyio.current_time(),
            packed=not alone,
            text=completion.text if as_text else None,
        )
    if alone:
        split = split_plain(
            completion.text,
            spec.validate,
            truncated=completion.truncated,
            as_text=as_text,
        )
        failures: dict[str, Any] = {**split.values, **split.failures}
    else:
        failures = _final_outcomes(spec, packed.ids, completion, splitter if streamed else None)
        if streamed:
            failures.update(failed_early)
    return _settle_failures(spec, jobs, by_id, failures, resolve, completion, deadline)


def _request_for(spec: Spec, items: list[Any]) -> tuple[PackedRequest, bool]:
    """The request asking for ``items``, and whether it is a plain call of one item.

    A group of one gains nothing from packing: when its output can be asked for on its
    own (an object, or text), it is asked as a plain call would ask it.
    """
    structured = spec.provider.structured
    if len(items) == 1 and answers_alone(spec.output_schema):
        plain = plain_request(
            spec.instructions, items[0], spec.output_schema, structured=structured
        )
        return plain, True
    packed = pack_request(
        spec.instructions,
        items,
        spec.output_schema,
        structured=structured,
        keyed=keyed_replies(spec),
    )
    return packed, False


def _retry_recorder(recorder: PromptRecorder) -> Callable[[RetryEvent], None]:
    def record(event: RetryEvent) -> None:
        recorder.retried(event.attempt, event.wait, event.error)

    return record


def _writing_order(spec: Spec, jobs: list[Job], slots: list[list[int]]) -> list[list[int]]:
    """The order to ask for ``slots`` (job indexes sharing one item) in.

    Short answers first, so that with streaming the split hands them back before the
    model writes the long ones; when planning, as far as deadlines allow (see
    :func:`~coalesce._planner.streaming_order`). Without a planner, short inputs first:
    their answers are usually short too.
    """
    planning = spec.planner
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


def _final_outcomes(
    spec: Spec,
    ids: Sequence[str],
    completion: Completion,
    splitter: StreamSplitter[Any] | None,
) -> dict[str, Any]:
    """Per id, a validated value or an :class:`ItemFailure`, once the reply is complete."""
    outcomes: dict[str, Any] = {}
    if splitter is not None:
        for event in splitter.close(truncated=completion.truncated):
            if isinstance(event, Failed):
                outcomes[event.id] = event.failure
        return outcomes
    split = split_reply(completion.text, ids, spec.validate, truncated=completion.truncated)
    outcomes.update(split.values)
    outcomes.update(split.failures)
    return outcomes


def _settle_failures(
    spec: Spec,
    jobs: list[Job],
    by_id: Mapping[str, list[int]],
    outcomes: Mapping[str, Any],
    resolve: Callable[[str, Any], None],
    completion: Completion,
    deadline: float,
) -> list[int]:
    """Resolve values, give up on exhausted or late failures, return ids to re-ask."""
    reask: list[int] = []
    now = anyio.current_time()
    # A re-ask takes about as long as this request did; start one only if it fits.
    time_left = deadline - now
    took = completion.seconds or 0.0
    for item_id, outcome in outcomes.items():
        indexes = [i for i in by_id.get(item_id, ()) if not jobs[i].done]
        if not indexes:
            continue
        if not isinstance(outcome, ItemFailure):
            resolve(item_id, outcome)
            continue
        attempts = jobs[indexes[0]].attempts
        if attempts < spec.max_attempts and took <= time_left:
            reask.extend(indexes)
        else:
            resolve(item_id, _error(item_id, outcome, attempts, spec))
    if reask and not _may_reask(spec, [jobs[i].plan for i in reask], deadline, now):
        # Tokens are the binding quota and this re-ask could not be on time.
        for item_id, outcome in outcomes.items():
            for index in by_id.get(item_id, ()):
                if index in reask and not jobs[index].done:
                    resolve(item_id, _error(item_id, outcome, jobs[index].attempts, spec))
        return []
    return sorted(reask)


def _may_reask(spec: Spec, plans: list[PlanItem | None], deadline: float, now: float) -> bool:
    planner = spec.planner
    if planner is None or any(plan is None for plan in plans):
        return True
    return planner.may_reask(plans, deadline, now)  # type: ignore[arg-type]


def _error(item_id: str, failure: ItemFailure, attempts: int, spec: Spec) -> ItemError:
    error = failure_error(item_id, failure, attempts=attempts)
    if failure.kind is FailureKind.INVALID and spec.max_attempts > attempts:
        error.args = (f"{error.args[0]}; no time left in the latency budget to ask again",)
    return error
