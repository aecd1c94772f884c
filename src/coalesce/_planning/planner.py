"""Sizing groups of LLM calls against a latency budget. Pure: no clock, no I/O.

Each call has a *deadline*, ``arrival + latency_budget``. The batcher keeps one open
window per partition and asks these functions, with explicit state and ``now``:

* :func:`admit`: before a new item joins, must the window go first (the group with it
  would be predicted to finish after its most urgent member's deadline, or would break a
  token limit), or must the new item go alone at once (its own prediction already
  exceeds its budget)?
* :func:`full_after_add`: after it joined, is the window full (items or tokens)?
* :func:`due_at`: the latest time the window may wait so that every member still meets
  its deadline (and no item waits longer than its wait for company, :func:`wait_of`);
  the timer sleeps until it. :func:`due` also says which of the two it is (``WINDOW``
  or ``DEADLINE``).
* :func:`streaming_order`: short expected answers first, so the streaming split hands
  them back early.
* :func:`cold_start`: before any reply was measured, when the prior admits no group that
  pays for its packing but the budget leaves room beyond one call, the first call goes
  alone at once (a *probe*) and later ones are held until its reply or until they could
  only just leave alone.
* :func:`can_pay`: whether a window smaller than the smallest paying group could still
  grow to it on time (if not, it goes now: it will be sent as plain calls anyway).

Predictions are a :data:`Predict` callable, ``(input_tokens, output_tokens) -> seconds``
of one request (a p99), usually ``lambda i, o: model.predict(i, o).total`` over a
:class:`~coalesce._planning.latency.LatencyModel`.

Rate limits (the providers parse their headers into a
:class:`~coalesce.providers.RateLimitState`): :func:`binding_limit` says which quota
runs out first at the current :class:`Pace`; :func:`pack_more` waits longer (within
deadlines) when requests bind; :func:`allow_reask` refuses re-asks a deadline will not
allow when tokens bind.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from .._batching.policy import DispatchReason, Due
from .._exceptions import ConfigurationError
from ..providers._ratelimit import Quota, RateLimitState

__all__ = [
    "HOLD_GUARD",
    "Admission",
    "ColdStart",
    "Due",
    "Pace",
    "PlanItem",
    "PlanLimits",
    "Predict",
    "admit",
    "allow_reask",
    "binding_limit",
    "can_pay",
    "cold_start",
    "due",
    "due_at",
    "full_after_add",
    "group_tokens",
    "latest_start",
    "pack_more",
    "streaming_order",
    "wait_of",
]

Predict = Callable[[int, int], float]
"""``(input_tokens, output_tokens) -> predicted seconds`` (a p99) of one request."""

Binding = Literal["requests", "tokens"]

# A quota without a reset time is assumed to refill within a minute: provider limits
# are per minute (RPM, TPM), so this is the longest it can take.
DEFAULT_RESET_HORIZON = 60.0

#: Seconds before the last moment a held call could still leave alone at which its hold
#: ends: a timer wakes a little late, and a call released late would count as a budget
#: that could not be met.
HOLD_GUARD = 0.01


@dataclass(frozen=True, slots=True)
class PlanItem:
    """What the planner knows about one call.

    Attributes:
        input_tokens: Tokens of the item's input as packed (without the id wrapper).
        output_tokens: Output tokens expected for the item (without the id wrapper).
        deadline: Absolute time (same clock as ``now``) its answer is due;
            ``math.inf`` for no budget.
        arrival: When the call arrived (same clock).
    """

    input_tokens: int
    output_tokens: int
    deadline: float
    arrival: float


@dataclass(frozen=True, slots=True)
class PlanLimits:
    """The limits every group obeys.

    Attributes:
        max_items: Most items in one request.
        max_wait: Longest an item waits in an open window, in seconds (with
            ``budget_share``: an item without a budget; see :func:`wait_of`).
        shared_tokens: Input tokens paid once per request: instructions and the
            reply-format description.
        context_window: The model's context (input plus output tokens), or ``None``.
        max_output_tokens: Most output tokens one request may produce, or ``None``.
        per_item_overhead_tokens: Input tokens each item costs besides its own input:
            its ``{"id": "7", "input": ...}`` wrapper in the prompt and, with a pinned
            reply schema, its entry there (``"7": {"$ref": ...}``); about 20 with
            OpenAI's tokenizers (ids are short decimal strings).
        per_item_output_overhead_tokens: Output tokens each answer costs besides its
            own output: its key in the reply (``"7":`` and a comma), about 3.
        streaming: Whether the reply is streamed and split as it arrives, so that
            each member is answered as soon as its own output is complete: a member's
            finish is then predicted from the outputs written up to and including its
            own, in the order :func:`streaming_order` gives. Without streaming every
            member waits for the whole reply.
        budget_share: The share of its own budget an item with one may wait in an open
            window, when longer than ``max_wait`` (``None``: every item waits at most
            ``max_wait``, as when ``max_wait`` was given).

    Raises:
        ConfigurationError: If a limit is out of range.
    """

    max_items: int = 64
    max_wait: float = 0.05
    shared_tokens: int = 0
    context_window: int | None = None
    max_output_tokens: int | None = None
    per_item_overhead_tokens: int = 20
    streaming: bool = False
    per_item_output_overhead_tokens: int = 3
    budget_share: float | None = None

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ConfigurationError(f"max_items must be >= 1, got {self.max_items!r}")
        if not self.max_wait >= 0:  # also rejects NaN
            raise ConfigurationError(f"max_wait must be >= 0 seconds, got {self.max_wait!r}")
        share = self.budget_share
        if share is not None and not 0 <= share <= 1:
            raise ConfigurationError(f"budget_share must be from 0 to 1 or None, got {share!r}")
        for name in (
            "shared_tokens",
            "per_item_overhead_tokens",
            "per_item_output_overhead_tokens",
        ):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("context_window", "max_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be >= 1 or None, got {value!r}")


class Admission(NamedTuple):
    """What to do when a new item arrives at an open window.

    ``dispatch_first`` and ``solo`` are independent: a solo item leaves the window as it
    is; otherwise the item joins the window (a fresh one if the old one was dispatched).
    """

    dispatch_first: DispatchReason | None
    """Dispatch the current window before the item joins, and why (``None``: don't)."""
    solo: bool
    """Send the new item at once, alone (reason :attr:`DispatchReason.SOLO`); count it."""


# -- groups ------------------------------------------------------------------------


def group_tokens(items: Iterable[PlanItem], limits: PlanLimits) -> tuple[int, int]:
    """Return the ``(input_tokens, output_tokens)`` of one request packing ``items``.

    Args:
        items: The members of the request.
        limits: Gives the shared and per-item overhead tokens.
    """
    count = inputs = outputs = 0
    for item in items:
        count += 1
        inputs += item.input_tokens
        outputs += item.output_tokens
    framed_inputs = inputs + count * limits.per_item_overhead_tokens
    framed_outputs = outputs + count * limits.per_item_output_overhead_tokens
    return limits.shared_tokens + framed_inputs, framed_outputs


def _over_tokens(tokens: tuple[int, int], limits: PlanLimits, *, reached: bool) -> bool:
    """Whether a request of ``tokens`` exceeds (or, with ``reached``, meets) a limit."""
    inputs, outputs = tokens
    checks = (
        (outputs, limits.max_output_tokens),
        (inputs + outputs, limits.context_window),
    )
    return any(
        limit is not None and (used >= limit if reached else used > limit) for used, limit in checks
    )


def _finish(items: Sequence[PlanItem], limits: PlanLimits, predict: Predict) -> float:
    """Predicted duration of the request packing ``items``."""
    return predict(*group_tokens(items, limits))


def latest_start(items: Sequence[PlanItem], limits: PlanLimits, predict: Predict) -> float:
    """Return the latest time the request packing ``items`` may start so that every
    member is predicted to be answered by its deadline (``math.inf`` if none has one).

    Without streaming every member waits for the whole reply:
    ``min(deadlines) - predict(group)``. With streaming, a member is answered when its
    own output is complete; ordering the members by deadline (earliest first) gives the
    latest start of any order, ``min_j(deadline_j - predict(inputs, outputs up to j))``,
    and :func:`streaming_order` finds an order that meets it.

    Args:
        items: The members of one request.
        limits: The group limits.
        predict: Predicted duration of one request.
    """
    if not items:
        return math.inf
    earliest = min(item.deadline for item in items)
    if math.isinf(earliest):
        return math.inf
    if not limits.streaming:
        return earliest - _finish(items, limits, predict)
    inputs, _ = group_tokens(items, limits)
    written = 0
    latest = math.inf
    for item in sorted(items, key=_by_deadline):
        written += item.output_tokens + limits.per_item_output_overhead_tokens
        if math.isinf(item.deadline):
            break  # the rest have no deadline either
        latest = min(latest, item.deadline - predict(inputs, written))
    return latest


def _by_deadline(item: PlanItem) -> tuple[float, int]:
    return item.deadline, item.output_tokens


def admit(
    window: Sequence[PlanItem],
    new: PlanItem,
    limits: PlanLimits,
    predict: Predict,
    now: float,
) -> Admission:
    """Decide what happens to the window and to ``new`` before ``new`` joins.

    ``new`` goes alone at once (``solo``) if even alone it is predicted to miss its
    deadline: waiting for company could only make it later. Otherwise the non-empty
    window is dispatched first if it is full, if adding ``new`` would break a token
    limit (:attr:`DispatchReason.TOKENS`), or if, sent now with ``new``, some member
    would be predicted to be answered after its deadline (:attr:`DispatchReason.DEADLINE`;
    see :func:`latest_start`). An empty window always takes the item.

    Args:
        window: The items already in the open window.
        new: The arriving item.
        limits: The group limits.
        predict: Predicted duration of one request.
        now: The current time (same clock as deadlines).
    """
    late = math.isfinite(new.deadline) and now + _finish((new,), limits, predict) > new.deadline
    if late:
        return Admission(None, solo=True)
    if not window:
        return Admission(None, solo=False)
    if len(window) >= limits.max_items:
        return Admission(DispatchReason.FULL, solo=False)
    group = [*window, new]
    if _over_tokens(group_tokens(group, limits), limits, reached=False):
        return Admission(DispatchReason.TOKENS, solo=False)
    if latest_start(group, limits, predict) < now:
        return Admission(DispatchReason.DEADLINE, solo=False)
    return Admission(None, solo=False)


def full_after_add(window: Sequence[PlanItem], limits: PlanLimits) -> DispatchReason | None:
    """Must the window, now holding ``window``, be dispatched at once?

    Yes when it holds ``max_items`` items (:attr:`DispatchReason.FULL`) or its request
    reaches the context window or the output-token limit (:attr:`DispatchReason.TOKENS`;
    a single item over a limit travels alone).

    Args:
        window: The items in the window, the new one included.
        limits: The group limits.
    """
    if len(window) >= limits.max_items:
        return DispatchReason.FULL
    if window and _over_tokens(group_tokens(window, limits), limits, reached=True):
        return DispatchReason.TOKENS
    return None


def wait_of(item: PlanItem, limits: PlanLimits) -> float:
    """Return the longest ``item`` waits in an open window for company, in seconds.

    Each call's own budget sizes its wait, however it was given: with a
    ``budget_share``, an item with a deadline waits up to that share of its budget
    (``deadline - arrival``), never less than ``max_wait``; an item without one, or
    every item when ``max_wait`` was given (no share), waits ``max_wait``.

    Args:
        item: A member of the window.
        limits: The group limits.
    """
    share = limits.budget_share
    if share is None or math.isinf(item.deadline):
        return limits.max_wait
    return max(limits.max_wait, share * (item.deadline - item.arrival))


def due(window: Sequence[PlanItem], limits: PlanLimits, predict: Predict) -> Due:
    """Return the latest time the window may be dispatched, and why then.

    ``min(arrival + wait, latest_start(group))`` over its members, where ``wait`` is each
    member's wait for company (:func:`wait_of`): later, either an item would have waited
    longer than that or some member would be predicted to be answered after its
    deadline (see :func:`latest_start`). An empty window is never due (``math.inf``).

    Args:
        window: The items in the window.
        limits: The group limits.
        predict: Predicted duration of one request.
    """
    if not window:
        return Due(math.inf, DispatchReason.WINDOW)
    waited = min(item.arrival + wait_of(item, limits) for item in window)
    latest = latest_start(window, limits, predict)
    if waited <= latest:
        return Due(waited, DispatchReason.WINDOW)
    return Due(latest, DispatchReason.DEADLINE)


def due_at(window: Sequence[PlanItem], limits: PlanLimits, predict: Predict) -> float:
    """Return :func:`due`'s time alone: what the batcher's timer sleeps until.

    Args:
        window: The items in the window.
        limits: The group limits.
        predict: Predicted duration of one request.
    """
    return due(window, limits, predict).at


def streaming_order(
    items: Sequence[PlanItem],
    limits: PlanLimits | None = None,
    predict: Predict | None = None,
    start: float = 0.0,
) -> list[int]:
    """Return the indices of ``items`` in the order the model should write them.

    Short expected outputs first, so the streaming split hands them back before the long
    ones are written, as far as deadlines allow: a long item whose deadline is near goes
    before shorter ones that can wait. The order is built from the back: the last place
    goes to the longest item that would still be on time there, finishing with
    everything before it written (Smith's rule); if none would, to the item with the
    latest deadline. If any order meets every deadline, this one does, and among those
    it answers the members soonest on average. Without deadlines (or without ``limits``
    and ``predict``) it is a stable sort by expected output.

    Args:
        items: The members of one request.
        limits: The group limits (for the per-item overhead and the shared tokens).
        predict: Predicted duration of one request.
        start: When the request starts (same clock as the deadlines).
    """
    order = sorted(range(len(items)), key=lambda index: items[index].output_tokens)
    if limits is None or predict is None or all(math.isinf(item.deadline) for item in items):
        return order
    inputs, _ = group_tokens(items, limits)
    overhead = limits.per_item_output_overhead_tokens
    written = sum(item.output_tokens + overhead for item in items)
    # Latest deadline first; an item becomes a candidate for the current last place once
    # it would be on time there (later places finish later, so it stays one).
    by_deadline = sorted(range(len(items)), key=lambda index: _by_deadline(items[index]))
    rank = {index: position for position, index in enumerate(order)}
    candidates: list[tuple[int, int]] = []  # (-rank, index): the longest first
    placed: list[int] = []
    while by_deadline or candidates:
        finish = start + predict(inputs, written)
        while by_deadline and items[by_deadline[-1]].deadline >= finish:
            index = by_deadline.pop()
            heapq.heappush(candidates, (-rank[index], index))
        if candidates:
            _, index = heapq.heappop(candidates)
        else:  # nobody is on time here: the latest deadline misses least
            index = by_deadline.pop()
        placed.append(index)
        written -= items[index].output_tokens + overhead
    placed.reverse()
    return placed


# -- the cold start ----------------------------------------------------------------


class ColdStart(NamedTuple):
    """What :func:`cold_start` decides for an arriving call."""

    probe: bool
    """Send it alone at once (:attr:`DispatchReason.PROBE`): its reply teaches the model."""
    hold_until: float
    """Otherwise hold it until then (or until a reply arrives), then plan it again."""


def cold_start(
    new: PlanItem,
    limits: PlanLimits,
    predict: Predict,
    now: float,
    *,
    probing: bool,
    central: Predict | None = None,
    least: float = 2,
) -> ColdStart | None:
    """Decide a call's fate while no reply of its function has been measured yet.

    ``predict`` is then the prior's. When it admits no group worth packing (``least``
    calls like ``new``, the smallest group that pays for its packing, sent now, would be
    predicted to miss its deadline: smaller groups would be sent as plain calls, and a
    cold burst would go out one call per request) but the budget leaves room beyond
    one call (``new`` could wait and still leave alone in time), the prior may be too
    slow: the first such call goes alone at once (a probe), and while it is in flight
    (``probing``) the others are held until ``hold_until`` or until the probe's reply
    has taught the model, whichever comes first.

    How long to hold: a held call can leave alone in time until its deadline less one
    call's duration. The prior's p99 of that duration (``predict``) is its worst case,
    above what most providers take; holding only that long would often end the hold
    before the probe's reply. With ``central`` (a typical duration, between the prior's
    mean and its p99), the hold lasts until the deadline less that duration, but never
    past the midpoint between ``now`` and the deadline: a probe that replies within the
    hold took at most that long, so a held call sent alone when it replies, taking as
    long, is still in time. On a provider as slow as the prior's mean, the probe's
    reply comes after the hold, the held calls leave alone when it ends and are
    answered by their deadline: nothing changes but the wait. Without ``central``, the
    hold ends when a call could only just leave alone by the p99. Never earlier than
    that, either way; :data:`HOLD_GUARD` before each limit.

    Returns ``None`` when this does not apply and the call is planned as usual: groups
    of one only, the prior admitting a pair, or no time to wait (a call predicted late
    even alone goes alone as usual, see :func:`admit`).

    Args:
        new: The arriving call.
        limits: The group limits.
        predict: Predicted duration of one request, as the prior says.
        now: The current time.
        probing: Whether a probe was sent and no reply has come yet.
        central: Typical duration of one request, as the prior says.
        least: The smallest group that pays for its packing (2: any pair;
            ``math.inf``: none, and calls are sent plain at once, unheld).
    """
    if math.isinf(least) or limits.max_items < max(2, least) or math.isinf(new.deadline):
        return None
    hold_until = new.deadline - _finish((new,), limits, predict) - HOLD_GUARD
    group = (new,) * max(2, int(least))
    if hold_until <= now or latest_start(group, limits, predict) >= now:
        return None
    if central is not None:
        typical = new.deadline - _finish((new,), limits, central)
        midpoint = now + (new.deadline - now) / 2
        hold_until = max(hold_until, min(typical, midpoint) - HOLD_GUARD)
    return ColdStart(probe=not probing, hold_until=hold_until)


def can_pay(
    window: Sequence[PlanItem], least: float, limits: PlanLimits, predict: Predict, now: float
) -> bool:
    """Whether ``window`` could still become a group of ``least`` items (the smallest
    that pays for its packing) that is on time: sent now with enough company like its
    newest member, every member would be answered by its deadline.

    A window that cannot is sent as plain calls whatever it waits for (more company
    only makes the group later), so waiting only adds latency. ``True`` for a window
    already that large, or when nothing limits it (no deadline).

    Args:
        window: The items in the window.
        least: The smallest group packing pays for (``math.inf``: none).
        limits: The group limits.
        predict: Predicted duration of one request.
        now: The current time.
    """
    if not window or len(window) >= least:
        return True
    if math.isinf(least) or least > limits.max_items:
        return False
    newest = max(window, key=lambda item: item.arrival)
    group = [*window, *[newest] * (int(least) - len(window))]
    if _over_tokens(group_tokens(group, limits), limits, reached=False):
        return False
    return latest_start(group, limits, predict) >= now


# -- rate limits -------------------------------------------------------------------


class Pace(NamedTuple):
    """The current sending pace of a client."""

    request_rate: float
    """Requests sent per second."""
    tokens_per_request: float
    """Tokens (input plus output) one request spends on average."""


# Go writes microseconds with the micro sign (U+00B5) or, in older versions, Greek mu.


def _horizon(quota: Quota, now: float) -> float:
    """Seconds until ``quota`` is full again."""
    if quota.reset_at is None:
        return DEFAULT_RESET_HORIZON
    return max(0.0, quota.reset_at - now)


def _exhausted_in(quota: Quota | None, rate: float, now: float) -> float:
    """Seconds until ``quota`` runs out at ``rate`` units/s; ``inf`` if it refills first."""
    if quota is None or (quota.remaining > 0 and rate <= 0):
        return math.inf
    seconds = quota.remaining / rate if quota.remaining > 0 else 0.0
    return seconds if seconds < _horizon(quota, now) else math.inf


def binding_limit(state: RateLimitState, pace: Pace, now: float) -> Binding | None:
    """Return which quota runs out first at ``pace``, or ``None`` if neither runs out.

    A quota runs out if, at the current pace, its ``remaining`` is spent before its reset
    (a quota without a reset time is assumed to reset within a minute). If both run out,
    the earlier binds; on a tie, requests.

    Args:
        state: The last reported quotas.
        pace: Requests per second and tokens per request now.
        now: The current time, on the clock of ``state``'s reset times.
    """
    requests = _exhausted_in(state.requests, pace.request_rate, now)
    tokens = _exhausted_in(state.tokens, pace.request_rate * pace.tokens_per_request, now)
    if math.isinf(requests) and math.isinf(tokens):
        return None
    return "requests" if requests <= tokens else "tokens"


def pack_more(state: RateLimitState, limits: PlanLimits, pace: Pace, now: float) -> PlanLimits:
    """Return ``limits`` with a longer ``max_wait`` when the request quota binds.

    The rule: with ``remaining`` requests left until the reset ``horizon`` seconds away,
    requests must be spaced at least ``horizon / remaining`` apart (the whole horizon if
    none is left), so a window may wait that long and gather what arrives meanwhile:
    ``max_wait`` becomes ``max(max_wait, horizon / remaining)``. Budgets still hold,
    because :func:`admit` and :func:`due_at` dispatch before any member's deadline
    regardless of ``max_wait``. The spacing is per window; a client sending from several
    partitions at once should divide ``remaining`` among them before calling this.

    Args:
        state: The last reported quotas.
        limits: The configured limits.
        pace: Requests per second and tokens per request now.
        now: The current time.
    """
    quota = state.requests
    if quota is None or binding_limit(state, pace, now) != "requests":
        return limits
    spacing = _horizon(quota, now) / max(quota.remaining, 1)
    return replace(limits, max_wait=max(limits.max_wait, spacing))


def allow_reask(
    state: RateLimitState,
    pace: Pace,
    now: float,
    *,
    input_tokens: int,
    output_tokens: int,
    deadline: float,
    predict: Predict,
) -> bool:
    """May a re-ask of this size be sent, given the token quota and the deadline?

    Only when the token quota binds does this refuse anything: then a re-ask is allowed
    only if it is predicted to finish by ``deadline``, starting now if the quota still
    holds its tokens, or else at the quota's reset. Tokens spent on an answer that comes
    too late are tokens the on-time requests lack.

    Args:
        state: The last reported quotas.
        pace: Requests per second and tokens per request now.
        now: The current time.
        input_tokens: Input tokens of the re-ask request.
        output_tokens: Output tokens it is expected to produce.
        deadline: The earliest deadline among the items re-asked.
        predict: Predicted duration of one request.
    """
    quota = state.tokens
    if quota is None or binding_limit(state, pace, now) != "tokens":
        return True
    start = now
    if quota.remaining < input_tokens + output_tokens:
        start = now + _horizon(quota, now)
    return start + predict(input_tokens, output_tokens) <= deadline
