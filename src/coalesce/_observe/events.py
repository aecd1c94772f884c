"""What happened, as events: what the ``on_event`` hook receives and the ``coalesce``
logger writes.

Each event is a small frozen dataclass, and ``str(event)`` is one line saying what
happened and why: the line an :class:`EventSink` writes on the ``"coalesce"`` logger
at ``DEBUG`` before passing the event to the hook. The recorder builds an event only
when :meth:`EventSink.watched` says a hook or that logger is listening, so an
unwatched function pays one ``logger.isEnabledFor`` per event.

The ids that tie the lines together: a group is numbered as it leaves its window
(``group 5``); a request is named by the provider's reply id when it gave one
(``chatcmpl-...``, ``msg_...``), else by its local number (``#12``, counted per
function as requests are sent); a call names the requests that carried it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..providers import Usage

__all__ = [
    "CallEvent",
    "ContradictionEvent",
    "DisagreementAlarm",
    "DispatchEvent",
    "Event",
    "EventHook",
    "EventSink",
    "RequestEvent",
    "RequestLabel",
    "RetryEvent",
    "ShadowEvent",
    "UnmeetableEvent",
    "logger",
    "option_changes",
    "plural",
]

logger = logging.getLogger("coalesce")

#: Longest error message quoted in a line.
_ERROR_CHARS = 200


@dataclass(frozen=True)
class CallEvent:
    """One call of the function finished, with its own result or exception.

    Attributes:
        function: The decorated function's (or wrapped client's) name.
        model: The model name.
        latency: Seconds from the call to its result or exception.
        wait: Seconds it waited for company before its first request was sent, if known.
        budget: Its latency budget in seconds, or ``None`` without one.
        ok: Whether it got a result (``False``: an exception).
        requests: The requests that carried it, in order (see :attr:`request_id`);
            more than one when it was asked again. Empty if it never reached one.
        attempts: How many requests carried it.
    """

    function: str
    model: str
    latency: float
    wait: float | None
    budget: float | None
    ok: bool
    requests: tuple[str, ...] = ()
    attempts: int = 0

    @property
    def missed_budget(self) -> bool:
        """Whether it finished after its budget ran out."""
        return self.budget is not None and self.latency > self.budget

    @property
    def request_id(self) -> str:
        """The request that answered it (or failed it): the provider's reply id when it
        gave one, else the request's local number (``"#12"``); ``""`` if none did."""
        return self.requests[-1] if self.requests else ""

    def __str__(self) -> str:
        outcome = "answered" if self.ok else "failed"
        line = f"{self.function}: call {outcome} in {_seconds(self.latency)}"
        if self.budget is not None:
            line += f" (budget {_seconds(self.budget)}{', missed' if self.missed_budget else ''})"
        if self.wait is not None:
            line += f", waited {_seconds(self.wait)} for company"
        if self.requests:
            noun = "request" if len(self.requests) == 1 else "requests"
            line += f"; {noun} {', '.join(self.requests)}, {plural(self.attempts, 'attempt')}"
        return line


@dataclass(frozen=True)
class DispatchEvent:
    """A group of calls left its window to become a request.

    Attributes:
        function: The decorated function's name.
        model: The model name.
        reason: Why (a :class:`~coalesce.DispatchReason` value: ``"full"``,
            ``"size"``, ``"window"``, ``"close"``, or a planner's own reason).
        items: Calls in the group.
        group: Its number, counted per function from 1 (0: not numbered).
        predicted: The planner's predicted seconds (a p99) of a request carrying the
            whole group, when a latency budget is planned; else ``None``.
        time_left: Seconds left of the tightest budget in the group as it left, or
            ``None`` if no call in it had a budget.
    """

    function: str
    model: str
    reason: str
    items: int
    group: int = 0
    predicted: float | None = None
    time_left: float | None = None

    def __str__(self) -> str:
        line = f"{self.function}: {_group(self.group)} dispatched ({self.reason}):"
        line += f" {plural(self.items, 'call')}"
        if self.predicted is not None:
            line += f", predicted {_seconds(self.predicted)}"
        if self.time_left is not None:
            line += f", {_seconds(self.time_left)} left of the tightest budget"
        return line


@dataclass(frozen=True)
class RequestEvent:
    """One request to the provider finished (after its retries), or failed.

    Attributes:
        function: The decorated function's name.
        model: The model name.
        items: Items in the request's prompt.
        usage: Tokens the provider reported, or ``None`` if it reported none.
        ttft: Seconds to the first reply text when streamed, else ``None``.
        seconds: Seconds from sending to the end of the reply (or the failure).
        cost: Estimated dollars (NaN when the model has no price or no usage).
        cost_one_per_item: Estimated dollars for the same items sent one per request
            (0 for a re-ask, whose items were counted when first asked).
        reask: Whether it asked again for items an earlier reply failed.
        error: The exception that failed it, or ``None`` if a reply arrived.
        request_id: The provider's reply id (``"chatcmpl-..."``) when it gave one,
            else the request's local number (``"#12"``); ``""`` if not known.
        group: The number of the group its calls were dispatched in (0: not known).
        attempt: How many requests have carried its items, this one included: 1 for
            the first, 2 or more for a re-ask (0: not known).
        predicted: The planner's predicted seconds (a p99) for it, made as it was
            sent; ``None`` without a latency budget.
        plain: It was a plain call of one item, without the packing format.
        input_tokens_one_per_item: Prompt tokens the same items would have used as
            plain calls, one per request (0 for a re-ask, or without usage).
    """

    function: str
    model: str
    items: int
    usage: Usage | None
    ttft: float | None
    seconds: float | None
    cost: float
    cost_one_per_item: float
    reask: bool = False
    error: BaseException | None = None
    request_id: str = ""
    group: int = 0
    attempt: int = 0
    predicted: float | None = None
    plain: bool = False
    input_tokens_one_per_item: int = 0

    def __str__(self) -> str:
        head = f"{self.function}: request {self.request_id or '?'} ({self._context()}):"
        took = "" if self.seconds is None else f" after {_seconds(self.seconds)}"
        if self.error is not None:
            return f"{head} {plural(self.items, 'item')} failed{took}: {_error(self.error)}"
        line = f"{head} {plural(self.items, 'item')}"
        if self.seconds is not None:
            line += f" in {_seconds(self.seconds)}"
        if self.predicted is not None:
            line += f" (predicted {_seconds(self.predicted)})"
        return line + self._spent()

    def _context(self) -> str:
        parts = [_group(self.group)] if self.group else []
        if self.attempt:
            parts.append(f"attempt {self.attempt}")
        if self.reask:
            parts.append("re-ask")
        if self.plain:
            parts.append("plain")
        return ", ".join(parts) or "no group"

    def _spent(self) -> str:
        """The tokens and cost, next to what plain calls would have spent."""
        usage = self.usage
        if usage is None:
            return "; no usage reported"
        compare = not self.reask and self.input_tokens_one_per_item > 0
        line = f"; {usage.input_tokens:,} prompt tokens"
        if usage.cached_input_tokens:
            line += f" ({usage.cached_input_tokens:,} cached)"
        if compare:
            line += f" (plain calls ~{self.input_tokens_one_per_item:,})"
        line += f", {usage.output_tokens:,} output"
        if not math.isnan(self.cost):
            line += f"; ${self.cost:.6f}"
            if compare and not math.isnan(self.cost_one_per_item):
                line += f" (plain calls ~${self.cost_one_per_item:.6f})"
        return line


class RequestLabel(NamedTuple):
    """Which request a :class:`RequestEvent` is about (the fields of the same names)."""

    request_id: str = ""
    group: int = 0
    attempt: int = 0
    predicted: float | None = None
    plain: bool = False


@dataclass(frozen=True)
class RetryEvent:
    """A request failed as a whole and will be sent again.

    Attributes:
        function: The decorated function's name.
        model: The model name.
        attempt: The attempt that failed (1 for the first).
        delay: Seconds until it is sent again.
        error: What failed it.
    """

    function: str
    model: str
    attempt: int
    delay: float
    error: BaseException | None

    def __str__(self) -> str:
        error = "" if self.error is None else f": {_error(self.error)}"
        return (
            f"{self.function}: a request failed (attempt {self.attempt}{error});"
            f" sending it again in {_seconds(self.delay)}"
        )


@dataclass(frozen=True)
class UnmeetableEvent:
    """A call's budget was shorter than the predicted latency of asking for it alone.

    Attributes:
        function: The decorated function's name.
        model: The model name.
        predicted: Predicted seconds for a request carrying only this item.
        budget: The call's budget in seconds.
    """

    function: str
    model: str
    predicted: float
    budget: float

    def __str__(self) -> str:
        return (
            f"{self.function}: a call's budget ({_seconds(self.budget)}) is shorter than"
            f" the predicted {_seconds(self.predicted)} of asking for it alone; sent alone,"
            " at once (counted in unmeetable_budgets)"
        )


@dataclass(frozen=True)
class ContradictionEvent:
    """A streamed reply contradicted answers already handed to their callers.

    Answers are streamed to callers only from providers that enforce the reply schema;
    a reply that nevertheless wrote an id again with another output lands here, and
    from then on the function holds each answer until its reply ends.

    Attributes:
        function: The decorated function's name.
        model: The model name.
        ids: The request's ids whose delivered answer the reply contradicted.
    """

    function: str
    model: str
    ids: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"{self.function}: a streamed reply contradicted {len(self.ids)} answer(s)"
            f" already delivered (ids {', '.join(self.ids)}); answers are now held until"
            " each reply ends"
        )


@dataclass(frozen=True)
class ShadowEvent:
    """A packed answer was compared with the answer of the same item asked alone
    (``shadow=``; the caller keeps the packed one).

    Attributes:
        function: The decorated function's name.
        model: The model name.
        size: Items in the packed request that answered it.
        agreed: Whether the two answers agreed.
        cap: The function's group cap after this verdict.
    """

    function: str
    model: str
    size: int
    agreed: bool
    cap: int

    def __str__(self) -> str:
        verdict = "agreed with" if self.agreed else "DIFFERED from"
        return (
            f"{self.function}: a packed answer (group of {self.size}) {verdict} the same"
            f" item asked alone; group cap {self.cap}"
        )


@dataclass(frozen=True)
class DisagreementAlarm:
    """The shadow guard lowered a function's group cap: packed answers disagreed with
    the same items asked alone more often than ``min_agreement`` allows.

    Logged at ``WARNING``: packed answers of this function were wrong more often than
    they should be, because the model loses track in larger groups or because an item
    steers its neighbours' answers (text written as instructions to the model; see
    ``docs/isolation.md``). Requests carry fewer items from now on.

    Attributes:
        function: The decorated function's name.
        model: The model name.
        old_cap: The group cap before.
        cap: The group cap now.
        reason: Why the guard moved it (the agreement it measured, at which size or
            position).
    """

    function: str
    model: str
    old_cap: int
    cap: int
    reason: str

    def __str__(self) -> str:
        return (
            f"{self.function}: packed answers disagreed with the same items asked alone"
            f" ({self.reason}); group cap {self.old_cap} -> {self.cap}. The model may lose"
            " track in larger groups, or an item may be steering its neighbours"
            " (docs/isolation.md)"
        )


#: Anything passed to an ``on_event`` hook.
Event = (
    CallEvent
    | DispatchEvent
    | RequestEvent
    | RetryEvent
    | UnmeetableEvent
    | ContradictionEvent
    | ShadowEvent
    | DisagreementAlarm
)
#: An ``on_event`` hook: called synchronously; its exceptions are logged and ignored.
EventHook = Callable[[Event], None]


class EventSink:
    """Where one function's events go: a line on the ``"coalesce"`` logger, then the
    user's ``on_event`` hook, whose exceptions are counted, logged and ignored.

    Args:
        function: The decorated function's (or wrapped client's) name, for the log
            line about a failing hook.
        on_event: Called synchronously with each event, or ``None``.
    """

    def __init__(self, function: str, on_event: EventHook | None = None) -> None:
        self.function = function
        self.on_event = on_event
        #: Exceptions the hook raised so far.
        self.hook_errors = 0

    def watched(self, level: int = logging.DEBUG) -> bool:
        """Whether anyone listens for an event at ``level``: the hook, or the logger.

        Callers ask before building an event, so an unwatched function builds none.
        """
        return self.on_event is not None or logger.isEnabledFor(level)

    def emit(self, event: Event, level: int = logging.DEBUG) -> None:
        """Log ``event`` as one line at ``level``, then pass it to the hook, if any."""
        if logger.isEnabledFor(level):
            logger.log(level, "%s", event)
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:
            # A broken hook must not break the calls it watches.
            self.hook_errors += 1
            first = self.hook_errors == 1
            logger.log(
                logging.ERROR if first else logging.DEBUG,
                "the on_event hook of %s raised on %s; ignored%s",
                self.function,
                type(event).__name__,
                " (further hook errors are logged at DEBUG)" if first else "",
                exc_info=True,
            )

    def __repr__(self) -> str:
        hook = "a hook" if self.on_event is not None else "no hook"
        return f"<EventSink {self.function} with {hook}, {self.hook_errors} hook errors>"


def option_changes(options: object) -> str:
    """The fields of a dataclass of options that differ from their defaults, as
    ``" budget=2s max_items=20"`` (the latency budget first; empty if none differ)."""
    if not dataclasses.is_dataclass(options) or isinstance(options, type):
        return ""
    fields = sorted(dataclasses.fields(options), key=lambda f: f.name != "latency_budget")
    parts = []
    for option in fields:
        value = getattr(options, option.name)
        if option.default is not dataclasses.MISSING and _same(value, option.default):
            continue
        parts.append(_option(option.name, value))
    return "".join(f" {part}" for part in parts)


def _same(value: Any, default: Any) -> bool:
    return value is default or bool(value == default)


def _option(name: str, value: Any) -> str:
    if name == "latency_budget" and isinstance(value, (int, float)):
        return f"budget={value:g}s"
    if name in ("max_wait", "timeout") and isinstance(value, (int, float)):
        return f"{name}={value:g}s"
    if value is None or isinstance(value, (bool, int, float, str)):
        return f"{name}={value!r}"
    return f"{name}={getattr(value, '__qualname__', type(value).__name__)}"


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def plural(n: int, noun: str) -> str:
    """``"1 call"``, ``"2 calls"``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _group(number: int) -> str:
    return f"group {number}" if number else "a group"


def _error(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > _ERROR_CHARS:
        text = text[: _ERROR_CHARS - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
