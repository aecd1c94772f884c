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
from typing import Any

from .._exceptions import ConfigurationError
from .._observe.recorder import EventHook
from .._options import (
    LANE_CHOICES,
    NOT_GIVEN,
    OPTION,
    PROMPT_MAX_ITEMS,
    SHADOW,
    LaneChoice,
    NotGiven,
    wait_for_company,
)
from .._planning.latency import LatencyPrior
from .._planning.tokens import TokenEstimator
from .._pricing import Price
from .._validate import check_int
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


def check_lane_choice(lane: object) -> str:
    """``lane`` if ``lane=`` accepts it (one of :data:`LANE_CHOICES`).

    Raises:
        ConfigurationError: It names no lane.
    """
    OPTION["lane"].validate(lane)
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
    """How calls coalesce: each field is the option of that name in
    :data:`coalesce._options.OPTIONS` (its default, meaning and check), but
    ``item_output_cap``, a drop-in call's own cap on its answer (its ``max_tokens``: a
    request of one call asks exactly it, a packed one what its items are expected to
    need within their caps, :func:`coalesce._planning.output.request_output_cap`).
    Every field is checked on construction.
    """

    max_wait: float | NotGiven = NOT_GIVEN
    max_items: int | NotGiven = NOT_GIVEN
    max_concurrency: int | None = None
    latency_budget: float | None = None
    max_attempts: int = 4
    max_retries: int = 4
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
    packing: str = "auto"
    lane: str = "auto"
    store: Any = None
    batch_window: float = 60.0
    batch_client: Any = None
    poll_interval: float = 60.0
    screen: bool | Callable[[Any], bool] = True
    shadow: float | NotGiven = NOT_GIVEN
    min_agreement: float = 0.9
    agree: Callable[[Any, Any], bool] | None = None
    vote: bool = False

    def __post_init__(self) -> None:
        for name in (f.name for f in dataclasses.fields(self)):
            if name in OPTION:
                OPTION[name].validate(getattr(self, name))
        check_int("item_output_cap", self.item_output_cap, optional=True)
        estimator = self.token_estimator
        if estimator is not None and not callable(getattr(estimator, "count", None)):
            raise ConfigurationError(
                f"token_estimator must have a count(text) -> int method, got {estimator!r}"
            )
        prior = self.latency_prior
        if prior is not None and not isinstance(prior, LatencyPrior):
            raise ConfigurationError(
                f"latency_prior must be a coalesce.LatencyPrior, got {prior!r}"
            )

    @property
    def window(self) -> float:
        """Longest a call waits for company: ``max_wait`` as given; not given, a quarter
        of ``latency_budget`` when there is one (see
        :func:`coalesce._options.wait_for_company`)."""
        return wait_for_company(self.max_wait, self.latency_budget)

    @property
    def most_items(self) -> int:
        """The most items a request may carry: ``max_items`` as given, else where a
        learned cap starts (:data:`~coalesce._options.PROMPT_MAX_ITEMS`)."""
        return PROMPT_MAX_ITEMS if isinstance(self.max_items, NotGiven) else self.max_items

    @property
    def shadow_rate(self) -> float:
        """``shadow`` as given, else :data:`~coalesce._options.SHADOW` (which applies
        only where the cap is learned)."""
        return SHADOW if isinstance(self.shadow, NotGiven) else self.shadow

    @classmethod
    def of(cls, given: Mapping[str, Any], **changes: Any) -> Options:
        """The options among ``given`` (an entry point's keywords), with ``changes``."""
        fields = cls.__dataclass_fields__
        return cls(**{name: given[name] for name in fields if name in given}, **changes)

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def keyed_replies(spec: FunctionSpec, options: Options) -> bool:
    """Whether ``spec``'s requests ask for wire format 2 (outputs keyed by id).

    Not when the reply would reach us parsed and re-encoded (a forced tool's input, not
    streamed): a key the model repeated would be lost unseen there, and one of two
    differing answers handed over, where format 1 keeps both and fails the id.
    """
    return options.stream or not getattr(spec.provider, "parsed_replies", False)
