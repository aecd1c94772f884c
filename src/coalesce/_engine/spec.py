"""What an LLM function is (:class:`FunctionSpec`) and how it coalesces (:class:`Options`).

Both are fixed when ``@coalesce.prompt`` decorates a function or when ``coalesce.wrap``
meets a new kind of call, and are checked then: a bad option fails at decoration,
naming the value and the range it accepts, not at the first call.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._defaults import (
    BATCH_WINDOW,
    LANE,
    MAX_ATTEMPTS,
    MAX_RETRIES,
    MIN_AGREEMENT,
    PACKING,
    POLL_INTERVAL,
    PROMPT_MAX_ITEMS,
    PROMPT_MAX_WAIT,
    SHADOW,
    wait_for_company,
)
from .._exceptions import ConfigurationError
from .._observe.recorder import EventHook
from .._planning.latency import LatencyPrior
from .._planning.tokens import TokenEstimator
from .._pricing import Price
from .._validate import check_callable, check_int, check_seconds
from ..providers import Provider

__all__ = [
    "LANE_CHOICES",
    "FunctionSpec",
    "Lane",
    "LaneChoice",
    "Options",
    "check_lane_choice",
    "keyed_replies",
]


class Lane(str, enum.Enum):
    """Where a call is sent (see :mod:`coalesce._lanes.choose`)."""

    REALTIME = "realtime"
    FLEX = "flex"
    BATCH = "batch"


#: What ``lane=`` accepts: a lane, or ``"auto"`` (the cheapest one each call's budget allows).
LANE_CHOICES: tuple[str, ...] = ("auto", *(lane.value for lane in Lane))
#: The annotation of ``lane=``: :data:`LANE_CHOICES` spelled for type checkers, which
#: cannot read an enum's values (a test keeps the two equal).
LaneChoice = Literal["auto", "realtime", "flex", "batch"]


def check_lane_choice(lane: object) -> str:
    """``lane`` if ``lane=`` accepts it (one of :data:`LANE_CHOICES`).

    Raises:
        ConfigurationError: It names no lane.
    """
    if lane not in LANE_CHOICES:
        raise ConfigurationError(
            f"lane must be one of {', '.join(map(repr, LANE_CHOICES))}, got {lane!r}"
        )
    return str(lane)


@dataclass(frozen=True)
class FunctionSpec:
    """What one LLM function asks: fixed at decoration.

    Attributes:
        name: The function's name, for statistics and messages.
        provider: Sends the requests.
        model: The model name.
        instructions: The shared instructions, sent once per request.
        output_schema: JSON schema of one item's output.
        validate: Turns one raw output into the caller's value (raises if invalid).
        request_options: Passed to the provider unchanged (``temperature=0``...).
        plain_instructions: What a request of one item sends instead of
            ``instructions``, if they differ (the drop-in client's own system text,
            without the sentence that tells a packed request what each item is).
    """

    name: str
    provider: Provider
    model: str
    instructions: str
    output_schema: Mapping[str, Any]
    validate: Callable[[Any], Any]
    request_options: Mapping[str, Any] = field(default_factory=dict)
    plain_instructions: str | None = None


@dataclass(frozen=True)
class Options:
    """How calls coalesce; every field checked on construction.

    Attributes:
        max_wait: Longest a call waits for company, in seconds (left at its default, a
            call with a budget, its function's or its own, waits up to a quarter of it;
            see :attr:`window` and :func:`coalesce._planning.planner.wait_of`).
        max_items: Most items per request.
        max_concurrency: Most requests in flight at once (``None``: no limit).
        latency_budget: Seconds a caller may wait end to end (``None``: none, unless a
            call brings its own; every call's budget is planned, however it was given).
        max_attempts: Requests that may carry one item, re-asks included.
        max_retries: Retries of a request that failed as a whole.
        max_output_tokens: Cap on each reply's tokens (``None``: the provider's).
        item_output_cap: Each call's own cap on its answer (a drop-in call's
            ``max_tokens``): a request of one call asks exactly it, a packed one what
            its items are expected to need within their caps (see
            :func:`coalesce._planning.output.request_output_cap`).
        stream: Stream replies and answer each caller as its own output completes.
        dedupe: Identical items in one group share one slot in the prompt.
        expected_output_tokens: Output tokens per item assumed before any reply.
        latency_prior: What the planner assumes of the provider before measuring it.
        token_estimator: Counts input tokens (default: tiktoken for the model).
        prices: Prices for the statistics' cost estimates.
        on_event: Called with each call, request, dispatch and retry event.
        timeout: Longest one request attempt may run, in seconds (``None``: bounded by
            the callers' budget when there is one, else
            :data:`coalesce._defaults.REQUEST_TIMEOUT`).
        context_window: The model's context window in tokens (``None``: from the table
            of known models, then learned from the provider's context-length errors).
        schema_enforced: Whether the provider holds every reply to the reply schema
            (``None``: as the provider declares). Where it does not, a streamed answer
            is held until the reply can no longer contradict it.
        packing: ``"auto"``: pack a group only when packed it costs less than its
            members as plain calls (see :mod:`coalesce._planning.cost`); when no group
            can, calls go at once, plain. ``"always"``: pack every group of two or more
            (when requests, not tokens, are what the provider limits).
        lane: Where calls go (see :mod:`coalesce._lanes.choose`): ``"realtime"``,
            ``"batch"`` (the provider's batch API), or ``"auto"`` (by each call's budget).
        store: The batch lane's job store: a path, a ``JobStore`` or ``None`` (the
            per-user default).
        batch_window: Seconds a batch-lane call waits for others before their job goes.
        batch_client: The client of the deferred lanes (batch, flex), for example with an
            API key of its own; ``None``: the function's client.
        poll_interval: The longest wait, in seconds, between two polls of a batch-lane
            job (polls start at 5 s and grow by half each time).
        screen: Whether a call whose item reads like instructions to the model goes
            alone instead of sharing a prompt: ``True`` (the default rule,
            :func:`coalesce._wire.screen.looks_like_instructions`), ``False``, or the
            user's own ``screen(item) -> bool``.
        shadow: Fraction of the packed items also asked alone, to check that packing
            keeps the answers (see :mod:`coalesce._accuracy.shadow`); 0: none.
        min_agreement: Agreement between packed and plain answers under which a group
            size is judged too large and the group cap comes down.
        agree: ``agree(packed, plain) -> bool`` for the shadow check and the vote
            (default: equality).
        vote: Ask every packed group twice, the second time in the reverse order, and
            settle each item whose two answers differ with a plain call (see
            :mod:`coalesce._accuracy.vote`).
    """

    max_wait: float = PROMPT_MAX_WAIT
    max_items: int = PROMPT_MAX_ITEMS
    max_concurrency: int | None = None
    latency_budget: float | None = None
    max_attempts: int = MAX_ATTEMPTS
    max_retries: int = MAX_RETRIES
    max_output_tokens: int | None = None
    item_output_cap: int | None = None
    stream: bool = True
    dedupe: bool = False
    expected_output_tokens: int | None = None
    latency_prior: LatencyPrior | None = None
    token_estimator: TokenEstimator | None = None
    prices: Price | Mapping[str, Price] | None = None
    on_event: EventHook | None = None
    timeout: float | None = None
    context_window: int | None = None
    schema_enforced: bool | None = None
    packing: str = PACKING
    lane: str = LANE
    store: Any = None
    batch_window: float = BATCH_WINDOW
    batch_client: Any = None
    poll_interval: float = POLL_INTERVAL
    screen: bool | Callable[[Any], bool] = True
    shadow: float = SHADOW
    min_agreement: float = MIN_AGREEMENT
    agree: Callable[[Any, Any], bool] | None = None
    vote: bool = False

    def __post_init__(self) -> None:
        check_seconds("max_wait", self.max_wait)
        check_int("max_items", self.max_items)
        check_int("max_concurrency", self.max_concurrency, optional=True)
        check_seconds("latency_budget", self.latency_budget, positive=True, optional=True)
        check_int("max_attempts", self.max_attempts)
        check_int("max_retries", self.max_retries, minimum=0)
        check_int("max_output_tokens", self.max_output_tokens, optional=True)
        check_int("item_output_cap", self.item_output_cap, optional=True)
        check_int("expected_output_tokens", self.expected_output_tokens, optional=True)
        check_callable("on_event", self.on_event)
        check_seconds("timeout", self.timeout, positive=True, optional=True)
        check_int("context_window", self.context_window, optional=True)
        check_seconds("batch_window", self.batch_window)
        check_seconds("poll_interval", self.poll_interval, positive=True)
        if not isinstance(self.screen, bool):
            check_callable("screen", self.screen)
        check_callable("agree", self.agree)
        for name in ("shadow", "min_agreement"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 1
            ):
                raise ConfigurationError(
                    f"{name} must be a fraction from 0 to 1, got {value!r}"
                    + (
                        " (shadow=0.02 asks 2% of packed items again alone)"
                        if name == "shadow"
                        else ""
                    )
                )
        _check_kinds(self)

    @property
    def window(self) -> float:
        """Longest a call waits for company: ``max_wait`` as given; left at its
        default, a quarter of ``latency_budget`` when there is one (see
        :func:`coalesce._defaults.wait_for_company`)."""
        return wait_for_company(self.max_wait, self.latency_budget)

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def _check_kinds(options: Options) -> None:
    for name in ("stream", "dedupe", "vote"):
        value = getattr(options, name)
        if not isinstance(value, bool):
            raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    check_lane_choice(options.lane)
    if options.packing not in ("auto", "always"):
        raise ConfigurationError(f"packing must be 'auto' or 'always', got {options.packing!r}")
    if options.schema_enforced is not None and not isinstance(options.schema_enforced, bool):
        raise ConfigurationError(
            f"schema_enforced must be True, False or None, got {options.schema_enforced!r}"
        )
    estimator = options.token_estimator
    if estimator is not None and not callable(getattr(estimator, "count", None)):
        raise ConfigurationError(
            f"token_estimator must have a count(text) -> int method, got {estimator!r}"
        )
    prior = options.latency_prior
    if prior is not None and not isinstance(prior, LatencyPrior):
        raise ConfigurationError(f"latency_prior must be a coalesce.LatencyPrior, got {prior!r}")


def keyed_replies(spec: FunctionSpec, options: Options) -> bool:
    """Whether ``spec``'s requests ask for wire format 2 (outputs keyed by id).

    Not when the reply would reach us parsed and re-encoded (a forced tool's input, not
    streamed): a key the model repeated would be lost unseen there, and one of two
    differing answers handed over, where format 1 keeps both and fails the id.
    """
    return options.stream or not getattr(spec.provider, "parsed_replies", False)
