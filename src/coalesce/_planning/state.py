"""What the budget planner knows and learns about one function's provider.

:class:`Planning` holds the learned latency model, the expected output sizes, the
rate-limit quotas and the limits the planner applies now. It listens to the group
runner (:meth:`Planning.request_done`) and answers the pure planner functions'
questions (:meth:`Planning.predict`, :meth:`Planning.plan_item`), and whether the
function is still *cold* (no request of it has been reported) or a probe is in flight
(see :func:`~coalesce._planning.planner.cold_start`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..providers._ratelimit import RateLimitState, parse_rate_limit_headers
from .latency import LatencyModel, LatencyPrior
from .output import OutputTokenRegistry, OutputTokenTracker
from .planner import (
    Pace,
    PlanItem,
    PlanLimits,
    allow_reask,
    binding_limit,
    group_tokens,
    pack_more,
)
from .tokens import TokenEstimator, count_json_tokens

if TYPE_CHECKING:
    from ..providers import Completion

from .reports import Planned, Report

__all__ = ["PLANNING_QUANTILE", "Planning"]

#: The quantile of a request's duration that the planner holds to its members'
#: deadlines. A group is late for every member at once, and the planner sends groups
#: at the last moment their prediction allows, so the share of late calls is about
#: the share of requests slower than the prediction: a p95 would let 5% of calls miss
#: their budget. Measured (bench_cap, 3,000 calls at 100/s, 2 s budget, groups bound
#: by the deadline): p95 planning, 98.9% of the first 2,000 calls within budget, down
#: to 94% in the stretch where the cap was rising; p99, 99.97% over all 3,000, and the
#: same groups and tokens once learned (0.250x against 0.248x of plain calls' prompt
#: tokens).
PLANNING_QUANTILE = 0.99


class Planning:
    """What the budget planner learns and knows about one decorated function.

    ``limits`` is what the planner applies now: the configured limits, with
    ``max_wait`` stretched while the provider's request quota is the binding one (see :func:`~coalesce._planning.planner.pack_more`).

    Args:
        limits: The configured limits.
        output_prior: Output tokens per item assumed before any reply.
        prior: The latency prior (default: conservative for hosted models).
        estimator: Counts the items' input tokens.
        guessed_output: ``output_prior`` is a default guess (neither declared nor
            bounded by the output type, as for free text): the first replies' sizes
            replace it at once instead of after ten.
        cold_start: Whether a cold start may probe and hold calls (not when no group
            can pay for its packing: those calls go at once).
        paying: The smallest group that pays for its packing now (``math.inf``: none);
            it may change (a prompt cache found, the group cap moved). Default: any pair.

    Attributes:
        cold: No request of the function has been reported yet (predictions are the
            prior's) and the cold start applies.
        probing: A probe was sent while cold and no request has been reported since.
        warmed: When the reply that ended a probe came (``None``: no probe ended): the
            calls made before it were held through the cold start.
    """

    def __init__(
        self,
        limits: PlanLimits,
        output_prior: int,
        prior: LatencyPrior | None,
        estimator: TokenEstimator,
        *,
        guessed_output: bool = False,
        cold_start: bool = True,
        paying: Callable[[], float] | None = None,
    ) -> None:
        self.estimator = estimator
        self._paying = paying
        self.latency = LatencyModel(prior, quantile=PLANNING_QUANTILE)
        self.configured = limits
        tracker = (
            (lambda: OutputTokenTracker(output_prior, min_samples=1)) if guessed_output else None
        )
        self.outputs = OutputTokenRegistry(default_prior=output_prior, factory=tracker)
        self.cold = cold_start
        self.probing = False
        self.warmed: float | None = None
        self.largest = 1
        self.quota = RateLimitState()
        self._sent: deque[tuple[float, int]] = deque(maxlen=64)  # (time, tokens) per request
        self.limits = self._current_limits(0.0)

    def _current_limits(self, now: float) -> PlanLimits:
        # No fixed slow start: a group grows as far as its predicted finish fits its
        # members' deadlines (the prediction carries its own uncertainty: a wide default
        # margin until enough replies were measured), so a generous budget fills
        # max_items from the first call.
        return pack_more(self.quota, self.configured, self.pace(now), now)

    def pace(self, now: float) -> Pace:
        """Requests per second and tokens per request over the recent requests."""
        if len(self._sent) < 2:
            return Pace(0.0, 0.0)
        span = max(now - self._sent[0][0], 1e-3)
        return Pace(len(self._sent) / span, sum(t for _, t in self._sent) / len(self._sent))

    def requests_bind(self, now: float) -> bool:
        """Whether the provider's request quota runs out first at the current pace: then
        every request saved counts, and packing pays whatever the tokens say."""
        return binding_limit(self.quota, self.pace(now), now) == "requests"

    def predict(self, input_tokens: int, output_tokens: int) -> float:
        """Predicted seconds (a p99, :data:`PLANNING_QUANTILE`) of one request of these sizes."""
        return self.latency.predict(input_tokens, output_tokens).total

    def predict_typical(self, input_tokens: int, output_tokens: int) -> float:
        """Seconds one request of these sizes typically takes: the geometric middle of
        the mean and the p99 (:meth:`predict`), a margin half the p99's (in ratio)."""
        mean = self.latency.predict_mean(input_tokens, output_tokens).total
        return math.sqrt(mean * self.predict(input_tokens, output_tokens))

    def least(self) -> float:
        """The smallest group that pays for its packing now (``math.inf``: none)."""
        return 2 if self._paying is None else self._paying()

    def probe_sent(self) -> None:
        """A cold call was sent alone as a probe: hold the others until a reply."""
        self.probing = True

    def plan_item(self, item: Any, partition: Hashable, deadline: float, now: float) -> PlanItem:
        """The planner's view of a new call: its token estimates and deadline."""
        return PlanItem(
            input_tokens=count_json_tokens(item, self.estimator),
            output_tokens=self.outputs.expected(partition),
            deadline=deadline,
            arrival=now,
        )

    def sized(self, plan: PlanItem, partition: Hashable) -> PlanItem:
        """``plan`` with the answer size expected now rather than when the call arrived
        (a call held through a cold start is sized by what the first reply taught)."""
        expected = self.outputs.expected(partition)
        if plan.output_tokens == expected:
            return plan
        return dataclasses.replace(plan, output_tokens=expected)

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

    # -- what it learns (a GroupObserver) -------------------------------------------

    def request_sent(self, slots: Mapping[str, Sequence[Planned]], reask: bool) -> None:
        """Nothing to learn before the reply."""

    def request_done(self, report: Report) -> None:
        """Learn from one request: quotas, whether replies stream, latency, output sizes."""
        if self.probing:
            self.warmed = report.now
        self.cold = self.probing = False
        if report.schema_broken or report.contradicted:
            self.replies_arrive_whole()  # answers are held for the reply's end from now on
        if report.error_headers:
            self.read_quota(report.error_headers, report.now)
        completion = report.completion
        if completion is None:
            return
        streamed = report.streamed and completion.ttft is not None
        if self.configured.streaming and completion.text and not streamed:
            self.replies_arrive_whole()
        text = completion.text if report.text else None
        self.learn(
            completion,
            report.items,
            report.partition,
            report.now,
            packed=not report.plain,
            text=text,
        )

    def retrying(self, retry: object) -> None:
        """Nothing to learn from a retry itself (its 429's quota comes with the report)."""

    def group_done(self, jobs: Sequence[Planned]) -> None:
        """Nothing to learn when a group is done."""

    def read_quota(self, headers: Mapping[str, str], now: float) -> None:
        """Read the provider's rate-limit headers (of a reply or of a 429)."""
        state = parse_rate_limit_headers(headers, now)
        if state.requests is not None or state.tokens is not None:
            self.quota = RateLimitState(
                requests=state.requests or self.quota.requests,
                tokens=state.tokens or self.quota.tokens,
            )
            self.limits = self._current_limits(now)

    def replies_arrive_whole(self) -> None:
        """The provider answered a streamed request in one piece: from now on, every
        member of a group is predicted to wait for the whole reply."""
        if self.configured.streaming:
            self.configured = dataclasses.replace(self.configured, streaming=False)
            self.limits = dataclasses.replace(self.limits, streaming=False)

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
        """Learn the provider's speed and the answers' size from one reply of ``items``."""
        usage = completion.usage
        if usage is not None:
            self._sent.append((now, usage.input_tokens + usage.output_tokens))
        self.read_quota(completion.headers, now)
        if usage is None or completion.seconds is None or items <= 0:
            return
        self.latency.observe(
            usage.input_tokens, usage.output_tokens, completion.seconds, ttft=completion.ttft
        )
        # Each item costs its output plus its key ("7":), which the planner adds back;
        # the reply's own frame ({"results": {...}}) is shared out among the items,
        # rounded up, so a group's reply is never planned shorter than the one seen
        # (at a deadline's edge a few tokens are the difference). A plain call's reply
        # is the output alone; a text one is written as a JSON string when packed.
        overhead = self.limits.per_item_output_overhead_tokens if packed else 0
        per_item = max(1, math.ceil(usage.output_tokens / items) - overhead)
        if text is not None:
            per_item += self.estimator.count(json.dumps(text)) - self.estimator.count(text)
        for _ in range(items):
            self.outputs.observe(partition, per_item)
        if items > self.largest:
            self.largest = items
            self.limits = self._current_limits(now)

    def __repr__(self) -> str:
        return (
            f"<Planning max_items={self.limits.max_items} largest={self.largest}"
            f" streaming={self.limits.streaming} latency={self.latency!r}>"
        )
