"""The group runner's listeners: statistics, and each call's share of the usage.

Both read :class:`~coalesce._calls.RequestReport`s; neither re-parses the wire. (The
planner, :class:`~coalesce._planning.state.Planning`, is the third listener.) Neither
writes on a call: each keeps its own table, keyed by the call's
:class:`~coalesce._calls.Job`. The statistics listener names the requests that carry
each call it follows (so a call's event says which requests answered it) and labels
each request (:class:`~coalesce.RequestEvent`); the usage shares keep each call's
share and the reply that carried it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._calls import Job, NoObserver, RequestReport, Retry
from .._planning.footprint import Footprint
from .._planning.tokens import estimator_for
from .._wire.outcomes import ItemFailure
from ..providers import Usage
from .dispatch import DispatchListener
from .events import RequestLabel
from .recorder import PromptRecorder

__all__ = ["StatisticsListener", "UsageShare", "UsageShares", "apportion", "split_usage"]

#: ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``, one encoder for all.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class _Sent:
    """What a request was sent as: its local number, group and predicted seconds."""

    name: str
    group: int
    predicted: float | None


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
        dispatch: What was noted of each call's group when it was dispatched (its
            number and the planner's predictor), for each request's label.
    """

    def __init__(
        self,
        recorder: PromptRecorder,
        footprint: Footprint,
        cache: Callable[[int], int] | None = None,
        unpinned: Footprint | None = None,
        lane: str = "realtime",
        dispatch: DispatchListener | None = None,
    ) -> None:
        self.recorder = recorder
        self.lane = lane
        self.footprint = footprint
        self.cache = cache
        self.unpinned = unpinned or footprint
        self.dispatch = dispatch
        # Per call followed: its requests (none yet: an empty tuple, made a list on the
        # first, so that a call waiting for its first request holds no list).
        self._requests: dict[Job, Sequence[str]] = {}
        self._sent: dict[Job, _Sent] = {}  # per request in flight, by its first call

    def follow(self, job: Job) -> None:
        """Name the requests that carry ``job`` until :meth:`requests_of` hands them over."""
        self._requests[job] = ()

    def requests_of(self, job: Job) -> list[str]:
        """The requests that carried ``job`` so far, in order; it is no longer followed
        (its caller has finished: a later request does not name it)."""
        return list(self._requests.pop(job, ()))

    def request_sent(self, slots: Mapping[str, Sequence[Job]], reask: bool) -> None:
        """Count a request as it is sent (so counts are exact while replies stream);
        note its local number and the planner's prediction for it."""
        number = self.recorder.request_sent(len(slots), reask=reask)
        name = f"#{number}"
        self._sent[_first(slots)] = _Sent(name, *self._dispatched(slots))
        requests = self._requests
        for jobs in slots.values():
            for job in jobs:
                names = requests.get(job)
                if names is not None:
                    requests[job] = [*names, name]

    def request_done(self, report: RequestReport) -> None:
        """Record one request: its tokens and cost, or its failure."""
        label = self._name_request(report)
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

    def line_done(self, items: int, usage: Usage, *, line: str = "", attempt: int = 0) -> float:
        """Record one batch line's reply, counted as sent now (a line of one item is a
        plain request); its cost at the lane's price. ``line`` (its ``custom_id``) and
        ``attempt`` (how many lines have carried its items) name it in its event."""
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
            label=RequestLabel(line, 0, attempt, None, plain=plain),
            lane=self.lane,
        )

    def retrying(self, retry: Retry) -> None:
        """Count a retry."""
        self.recorder.retried(retry.attempt, retry.delay, retry.error)

    def group_done(self, jobs: Sequence[Job]) -> None:
        """Drop what is left of the group's requests (one cancelled before its report)."""
        for job in jobs:
            self._sent.pop(job, None)

    def _dispatched(self, slots: Mapping[str, Sequence[Job]]) -> tuple[int, float | None]:
        """The number of the group a request's calls were dispatched in (0: not known),
        and the planner's prediction for the request, if it plans them."""
        dispatched = None
        if self.dispatch is not None:  # any of its calls: they share their group
            noted = (self.dispatch.of(job) for jobs in slots.values() for job in jobs)
            dispatched = next((d for d in noted if d is not None), None)
        if dispatched is None:
            return 0, None
        plans = [jobs[0].plan for jobs in slots.values()]
        # The prediction labels the request's event: made only when someone listens.
        if dispatched.predict is None or None in plans or not self.recorder.events.watched():
            return dispatched.group, None
        return dispatched.group, dispatched.predict([plan for plan in plans if plan is not None])

    def _name_request(self, report: RequestReport) -> RequestLabel:
        """Which request ``report`` is about; the calls it carried learn its final id
        (the provider's reply id, when it gave one)."""
        sent = self._sent.pop(_first(report.slots), None)
        request_id = report.request_id or ("" if sent is None else sent.name)
        requests = self._requests
        for jobs in report.slots.values():
            for job in jobs:
                names = requests.get(job)
                if names:
                    requests[job] = [*names[:-1], request_id]
        group, predicted = (0, None) if sent is None else (sent.group, sent.predicted)
        return RequestLabel(request_id, group, report.attempt, predicted, plain=report.plain)


def _first(slots: Mapping[str, Sequence[Job]]) -> Job:
    """The first call of a request: it names the request in the listener's tables."""
    return next(jobs[0] for jobs in slots.values())


@dataclass
class UsageShare:
    """One call's share of the usage of the requests that carried it.

    Attributes:
        prompt_tokens: Its share of their prompt tokens.
        completion_tokens: Its share of their completion tokens.
        reply: What the provider said about the last reply that carried it (id, model).
        reply_id: Its id in that request.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reply: Mapping[str, Any] = field(default_factory=dict)
    reply_id: str = ""
    _final: bool = field(default=False, repr=False)
    _finished: anyio.Event | None = field(default=None, repr=False)

    @property
    def finished(self) -> anyio.Event:
        """Set once its group is done and the share final (made when first asked for:
        only a streamed caller waits for it)."""
        if self._finished is None:
            self._finished = anyio.Event()
            if self._final:
                self._finished.set()
        return self._finished

    def finish(self) -> None:
        """The share is final: set :attr:`finished`."""
        self._final = True
        if self._finished is not None:
            self._finished.set()


class UsageShares(NoObserver):
    """Charges each reply's usage to the calls it carried (the drop-in client's usage).

    The prompt's shared part is split evenly, each item's own input is its own, and
    completion tokens go by the size of each answer; the shares add up to what the
    provider reported. Only calls handed to :meth:`track` are charged; a share is
    dropped from the table once final (its :attr:`UsageShare.finished` set when the
    call's group is done: a streamed caller reports its share at the end of its
    stream) or when its call leaves early (:meth:`forget`).
    """

    def __init__(self) -> None:
        self._estimator = estimator_for(None)  # weights only: no model-specific warning
        # Its encoding loads now, not on the event loop at the first reply (0.2-0.3 s
        # of CPU there held a cold burst's calls past the time their groups needed).
        self._estimator.count("")
        self._shares: dict[Job, UsageShare] = {}

    def track(self, job: Job) -> UsageShare:
        """Charge ``job`` its share from now on: the share, filled as replies come."""
        share = self._shares[job] = UsageShare()
        return share

    def forget(self, job: Job) -> None:
        """``job`` left before its group was done (cancelled, or failed): charge it no more."""
        self._shares.pop(job, None)

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
                share = self._shares.get(job)
                if share is not None:
                    share.prompt_tokens += p_part
                    share.completion_tokens += c_part
                    share.reply, share.reply_id = completion.reply, item_id

    def group_done(self, jobs: Sequence[Job]) -> None:
        """The shares of ``jobs`` are final: drop them, and tell whoever waits."""
        for job in jobs:
            share = self._shares.pop(job, None)
            if share is not None:
                share.finish()

    def _count(self, value: Any) -> int:
        return self._estimator.count(_COMPACT.encode(value))

    def _answer_tokens(self, outcome: Any) -> int:
        if isinstance(outcome, ItemFailure):
            return 0 if outcome.raw is None else self._count(outcome.raw)
        return 0 if outcome is None else self._count(outcome)


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` (non-negative) in proportion to ``weights``; the parts sum to
    ``total`` exactly: the largest remainders get the leftover units, and zero or
    negative weights everywhere split evenly."""
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

    The prompt's shared part (what is not any item's estimated input, ``own_inputs``)
    is split evenly, each item's own input is its own; completion tokens go by each
    answer's estimated size (``own_outputs``, 0 for none). Both sum to the request's
    totals.
    """
    count = len(own_inputs)
    shared = max(0, prompt_tokens - sum(own_inputs))
    prompts = apportion(prompt_tokens, [own * count + shared for own in own_inputs])
    completions = apportion(completion_tokens, [own + 1 for own in own_outputs])
    return list(zip(prompts, completions, strict=True))
