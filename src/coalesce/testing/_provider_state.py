"""The simulated provider's configuration and state: what its endpoints read and
change (:class:`~coalesce.testing._call.Simulation`), checked and built once."""

from __future__ import annotations

import itertools
import random
import uuid

from coalesce.exceptions import ConfigurationError

from ._accounting import Ledger
from ._batches import BatchStore, BatchTiming
from ._cache import SimulatedPromptCache
from ._cache_store import PromptCacheStore
from ._clock import Clock
from ._context import ContextWindows, check_windows
from ._degradation import PackingDegradation
from ._faults import FaultPlan, FaultSource
from ._flex import FlexProcessing, FlexSource
from ._latency import SimulatedLatency
from ._length import OutputTokens
from ._ratelimit import RateLimit, RateLimiter, RateLimits

__all__ = ["ProviderState"]


class ProviderState:
    """The configuration and state of :class:`~coalesce.testing.SimulatedProvider`,
    whose docstring gives the arguments."""

    def __init__(
        self,
        *,
        latency: SimulatedLatency | None = None,
        rate_limits: RateLimits | RateLimit | None = None,
        faults: FaultPlan | None = None,
        output_tokens: OutputTokens = None,
        batches: BatchTiming | None = None,
        time_scale: float = 1.0,
        seed: int = 0,
        context_window: ContextWindows = None,
        output_limit: ContextWindows = None,
        prompt_cache: SimulatedPromptCache | bool = True,
        flex: FlexProcessing | None = None,
        enqueued_token_limit: ContextWindows = None,
        degradation: PackingDegradation | None = None,
    ) -> None:
        if not time_scale > 0:
            raise ConfigurationError(f"time_scale must be > 0, got {time_scale}")
        if isinstance(rate_limits, RateLimit):
            rate_limits = RateLimits(default=rate_limits)
        self.latency = latency or SimulatedLatency()
        self.rate_limits = rate_limits or RateLimits()
        self.fault_plan = faults or FaultPlan()
        self.output_tokens = output_tokens
        self.batch_timing = batches or BatchTiming()
        self.time_scale = time_scale
        self.seed = seed
        self.context_window = check_windows(context_window)
        self.output_limit = check_windows(output_limit, "output_limit")
        self.prompt_caching = _prompt_caching(prompt_cache)
        self.flex_processing = flex or FlexProcessing()
        self.enqueued_token_limit = check_windows(enqueued_token_limit, "enqueued_token_limit")
        self.degradation = _degradation(degradation)
        self.clock = Clock()
        self.ledger = Ledger()
        self.reset()

    def reset(self) -> None:
        """Start afresh: forget requests, rate-limit usage, batches, consumed faults, flex
        scripts and the prompt cache."""
        self.ledger.clear()
        self.limiter = RateLimiter(self.rate_limits, 60.0 * self.time_scale)
        self.faults = FaultSource(self.fault_plan)
        self.flex = FlexSource(self.flex_processing)
        self.jitter_rng = random.Random(self.seed)
        self.batches = BatchStore(self.batch_timing, self.time_scale)
        self.prompt_cache = PromptCacheStore(self.prompt_caching, self.time_scale, self.clock)
        self._ids = itertools.count(1)
        # Batches and files outlive a client's process, and a client's job store keeps
        # their ids: like a real provider's, they never repeat, across simulators too.
        self._instance = uuid.uuid4().hex[:8]

    def next_id(self, prefix: str) -> str:
        """Return a fresh response id such as ``chatcmpl-sim000001``."""
        return f"{prefix}{next(self._ids):06d}"

    def unique_id(self, prefix: str) -> str:
        """Return a fresh id that no other simulator, nor this one before a
        :meth:`reset`, gives: ``batch_sim3f9c01a2000002``, for batches and files."""
        return self.next_id(f"{prefix}{self._instance}")


def _prompt_caching(value: SimulatedPromptCache | bool) -> SimulatedPromptCache | None:
    """The prompt cache's settings, or ``None`` for no cache."""
    if isinstance(value, SimulatedPromptCache):
        return value
    if isinstance(value, bool):
        return SimulatedPromptCache() if value else None
    raise ConfigurationError(
        f"prompt_cache must be True, False or a SimulatedPromptCache, got {value!r}"
    )


def _degradation(value: PackingDegradation | None) -> PackingDegradation | None:
    if value is None or isinstance(value, PackingDegradation):
        return value
    raise ConfigurationError(
        f"degradation must be a PackingDegradation or None, got {value!r}; e.g."
        " degradation=PackingDegradation(per_extra_item=0.02, free_items=4)"
    )
