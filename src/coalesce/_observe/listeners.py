"""The group runner's listeners: statistics, and each call's share of the usage.

Both read :class:`~coalesce._calls.RequestReport`s; neither re-parses the wire. (The
planner, :class:`~coalesce._planning.state.Planning`, is the third listener.) The
statistics listener also names each request on the calls it carried
(:attr:`~coalesce._calls.Job.requests`), so a call's event says which requests
answered it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from .._calls import Job, RequestReport, Retry
from .._planning.footprint import Footprint
from .._planning.planner import PlanItem, group_tokens
from .._planning.state import Planning
from .._planning.tokens import estimator_for
from .._wire.outcomes import ItemFailure
from ..providers import Usage
from .events import RequestLabel
from .recorder import PromptRecorder

__all__ = ["StatisticsListener", "UsageShares", "apportion", "request_predictor", "split_usage"]


class StatisticsListener:
    """Tells a :class:`~coalesce._observe.recorder.PromptRecorder` about each request.

    Args:
        recorder: The function's (or wrapped client's) recorder.
        footprint: The function's token estimates, for the plain-call comparison.
        cache: Told each reply's cached prompt tokens; returns the tokens a plain call
            would read from a warm prompt cache (the best plain alternative). ``None``:
            no cache is assumed.
        unpinned: The footprint of requests whose reply schema does not name every id,
            if they are sent (see :func:`coalesce._engine.group.pinned`).
        lane: The lane the requests go through, for their price.
    """

    def __init__(
        self,
        recorder: PromptRecorder,
        footprint: Footprint,
        cache: Callable[[int], int] | None = None,
        unpinned: Footprint | None = None,
        lane: str = "realtime",
    ) -> None:
        self.recorder = recorder
        self.lane = lane
        self.footprint = footprint
        self.cache = cache
        self.unpinned = unpinned or footprint

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """Count a request as it is sent (so counts are exact while replies stream); tell
        the calls it carries its local number and the planner's prediction for it."""
        number = self.recorder.request_sent(len(slots), reask=reask)
        predicted = _predicted(slots)
        for jobs in slots.values():
            for job in jobs:
                job.requests.append(f"#{number}")
                job.predicted = predicted

    def request_done(self, report: RequestReport) -> None:
        """Record one request: its tokens and cost, or its failure."""
        label = _name_request(report)
        if report.contradicted:
            self.recorder.contradicted(report.contradicted)
        if report.error is not None or report.completion is None:
            error = report.error or RuntimeError("no reply")
            self.recorder.request_failed(
                report.items, error, seconds=report.seconds, reask=report.reask, label=label
            )
            return
        completion, plain = report.completion, report.plain
        footprint = self.footprint if report.pinned else self.unpinned
        cached = 0 if completion.usage is None else completion.usage.cached_input_tokens
        plain_cached = 0 if self.cache is None else self.cache(cached)
        self.recorder.request_finished(
            report.items,
            completion.usage,
            shared_input_tokens=footprint.plain_shared if plain else footprint.shared,
            plain_shared_input_tokens=footprint.plain_shared,
            frame_tokens=0 if plain else footprint.item_frame,
            answer_frame_tokens=0 if plain else footprint.answer_frame,
            plain_cached_input_tokens=plain_cached,
            ttft=completion.ttft,
            seconds=completion.seconds,
            reask=report.reask,
            label=label,
            lane=self.lane,
        )

    def line_done(self, items: int, usage: Usage) -> float:
        """Record one batch line's reply, counted as sent now (a line of one item is a
        plain request); its cost at the lane's price."""
        plain = items == 1
        footprint = self.footprint
        self.recorder.request_sent(items)
        return self.recorder.request_finished(
            items,
            usage,
            shared_input_tokens=footprint.plain_shared if plain else footprint.shared,
            plain_shared_input_tokens=footprint.plain_shared,
            frame_tokens=0 if plain else footprint.item_frame,
            answer_frame_tokens=0 if plain else footprint.answer_frame,
            lane=self.lane,
        )

    def retrying(self, retry: Retry) -> None:
        """Count a retry."""
        self.recorder.retried(retry.attempt, retry.delay, retry.error)

    def group_done(self, jobs: Sequence[Job]) -> None:
        """Nothing to count when a group is done."""


def request_predictor(planning: Planning) -> Callable[[Sequence[PlanItem]], float]:
    """The planner's predicted seconds (a p95) of one request carrying given members."""

    def predict(members: Sequence[PlanItem]) -> float:
        return planning.predict(*group_tokens(members, planning.limits))

    return predict


def _predicted(slots: Mapping[str, Sequence[Job]]) -> float | None:
    """The planner's prediction for a request carrying ``slots``, if it plans them."""
    first = next(jobs[0] for jobs in slots.values())
    plans = [jobs[0].plan for jobs in slots.values()]
    if first.predictor is None or None in plans:
        return None
    return first.predictor([plan for plan in plans if plan is not None])


def _name_request(report: RequestReport) -> RequestLabel:
    """Which request ``report`` is about; its calls learn its final id (the provider's
    reply id, when it gave one) and, with a reply, their own id in it."""
    request_id = report.request_id
    completion = report.completion
    for item_id, jobs in report.slots.items():
        for job in jobs:
            if job.requests:
                job.requests[-1] = request_id
            if completion is not None:
                job.reply, job.reply_id = completion.reply, item_id
    return RequestLabel(
        request_id, report.group, report.attempt, report.predicted, plain=report.plain
    )


class UsageShares:
    """Charges each reply's usage to the calls it carried (the drop-in client's usage).

    The prompt's shared part is split evenly, each item's own input is its own, and
    completion tokens go by the size of each answer; the shares add up to what the
    provider reported. :meth:`finished` gives an event set when a call's group is done
    (a streamed caller reports its share at the end of its stream).
    """

    def __init__(self) -> None:
        self._estimator = estimator_for(None)  # weights only: no model-specific warning
        self._finished: dict[Job, anyio.Event] = {}

    def finished(self, job: Job) -> anyio.Event:
        """An event set once ``job``'s group is done and its share final."""
        event = self._finished.get(job)
        if event is None:
            event = self._finished[job] = anyio.Event()
        return event

    def forget(self, job: Job) -> None:
        """``job`` left before its group ran (cancelled, or refused): drop its event."""
        self._finished.pop(job, None)

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """Nothing to charge before the reply."""

    def request_done(self, report: RequestReport) -> None:
        """Charge one reply to the calls it carried."""
        completion = report.completion
        if completion is None:
            return
        ids = list(report.slots)
        own_in = [self._count(report.slots[i][0].item) for i in ids]
        own_out = [self._answer_tokens(report.outcomes.get(i)) for i in ids]
        usage = completion.usage
        totals = (usage.input_tokens, usage.output_tokens) if usage is not None else (0, 0)
        for item_id, (p, c) in zip(ids, split_usage(*totals, own_in, own_out), strict=True):
            jobs = report.slots[item_id]
            for job, p_part, c_part in zip(
                jobs, apportion(p, [1] * len(jobs)), apportion(c, [1] * len(jobs)), strict=True
            ):
                job.prompt_tokens += p_part
                job.completion_tokens += c_part
                job.reply, job.reply_id = completion.reply, item_id

    def retrying(self, retry: Retry) -> None:
        """A retry charges nothing by itself."""

    def group_done(self, jobs: Sequence[Job]) -> None:
        """The shares of ``jobs`` are final."""
        for job in jobs:
            event = self._finished.pop(job, None)
            if event is not None:
                event.set()

    def _count(self, value: Any) -> int:
        return self._estimator.count(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    def _answer_tokens(self, outcome: Any) -> int:
        if isinstance(outcome, ItemFailure):
            return 0 if outcome.raw is None else self._count(outcome.raw)
        return 0 if outcome is None else self._count(outcome)


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` in proportion to ``weights``; the parts sum to ``total`` exactly.

    Largest remainders get the leftover units; zero or negative weights everywhere
    split evenly.

    Args:
        total: What to split (non-negative).
        weights: One weight per part.
    """
    if not weights:
        return []
    positive = [max(0.0, w) for w in weights]
    scale = sum(positive)
    if scale <= 0:
        positive, scale = [1.0] * len(weights), float(len(weights))
    exact = [total * w / scale for w in positive]
    parts = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: parts[i] - exact[i])
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def split_usage(
    prompt_tokens: int,
    completion_tokens: int,
    own_inputs: Sequence[int],
    own_outputs: Sequence[int],
) -> list[tuple[int, int]]:
    """Each item's (prompt, completion) tokens of one packed request.

    The prompt's shared part (what is not any item's own input) is split evenly, each
    item's own input is its own; completion tokens go by each answer's size. Both sum
    to the request's totals.

    Args:
        prompt_tokens: The request's prompt tokens.
        completion_tokens: The request's completion tokens.
        own_inputs: Estimated tokens of each item's input.
        own_outputs: Estimated tokens of each item's answer (0 if it had none).
    """
    count = len(own_inputs)
    shared = max(0, prompt_tokens - sum(own_inputs))
    prompts = apportion(prompt_tokens, [own * count + shared for own in own_inputs])
    completions = apportion(completion_tokens, [own + 1 for own in own_outputs])
    return list(zip(prompts, completions, strict=True))
