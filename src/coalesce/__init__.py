"""coalesce: many concurrent per-item LLM calls, one multi-item prompt, each caller its own answer.

The public surface is re-exported here; everything else lives in private modules.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._batching.batch import BatchMethod, batch
from ._batching.batcher import Batcher
from ._batching.policy import DispatchPolicy, DispatchReason, Due
from ._batching.stats import BatcherStatistics
from ._engine.budget import latency_budget
from ._exceptions import (
    BatcherClosedError,
    BatchError,
    CoalesceError,
    CoalesceWarning,
    ConfigurationError,
    InvalidInputError,
    InvalidOutputError,
    ItemError,
    MissingOutputError,
    QueueFull,
    RequestTimeoutError,
    ResultCountError,
    TruncatedOutputError,
    UnknownOptionError,
)
from ._gateway import sidecar as _sidecar  # noqa: F401  # fleet= on wrap and prompt
from ._observe.agreement import Agreement, CapLearning
from ._observe.recorder import (
    CallEvent,
    ContradictionEvent,
    DisagreementAlarm,
    DispatchEvent,
    Event,
    EventHook,
    PromptStatistics,
    RequestEvent,
    RetryEvent,
    ShadowEvent,
    UnmeetableEvent,
)
from ._options import NOT_GIVEN, NotGiven
from ._planning.latency import LatencyPrior
from ._planning.tokens import CharacterEstimator, TiktokenEstimator, TokenEstimator
from ._pricing import DEFAULT_PRICES, LANE_PRICE, Price, PromptCache, price_for
from ._prompt import PromptFunction, prompt
from ._wrap import CoalescedClient, wrap

try:
    __version__ = version("coalesce-llm")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_PRICES",
    "LANE_PRICE",
    "NOT_GIVEN",
    "Agreement",
    "BatchError",
    "BatchMethod",
    "Batcher",
    "BatcherClosedError",
    "BatcherStatistics",
    "CallEvent",
    "CapLearning",
    "CharacterEstimator",
    "CoalesceError",
    "CoalesceWarning",
    "CoalescedClient",
    "ConfigurationError",
    "ContradictionEvent",
    "DisagreementAlarm",
    "DispatchEvent",
    "DispatchPolicy",
    "DispatchReason",
    "Due",
    "Event",
    "EventHook",
    "InvalidInputError",
    "InvalidOutputError",
    "ItemError",
    "LatencyPrior",
    "MissingOutputError",
    "NotGiven",
    "Price",
    "PromptCache",
    "PromptFunction",
    "PromptStatistics",
    "QueueFull",
    "RequestEvent",
    "RequestTimeoutError",
    "ResultCountError",
    "RetryEvent",
    "ShadowEvent",
    "TiktokenEstimator",
    "TokenEstimator",
    "TruncatedOutputError",
    "UnknownOptionError",
    "UnmeetableEvent",
    "__version__",
    "batch",
    "latency_budget",
    "price_for",
    "prompt",
    "wrap",
]
