"""Savings accounting: what the replies cost, next to what one call per item would have.

Pure bookkeeping over the token counts a provider reports: :class:`Savings` adds each
reply's tokens and dollars to its totals and returns the reply's own figures, with no
clock, I/O or event loop, so it is tested with hand-built numbers.

The one-per-item baseline is an estimate of the best plain alternative: each item
sent alone, with the function's instructions and output schema (``plain``) but no
packing format or frames, at the model's list price, reading from a warm prompt cache
what a plain call would read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from .._pricing import LANE_PRICE, Price, cost
from ..providers import Usage

__all__ = ["Savings", "Shares", "Spent", "lane_cost"]


class Shares(NamedTuple):
    """How a packed request's tokens split, for the one-per-item comparison."""

    #: Prompt tokens sent once per request whatever its items (the instructions and
    #: the packing format, an estimate).
    shared: int
    #: What a plain call of one item pays besides its item (instructions and output
    #: schema); one call per item pays it once per item.
    plain: int
    #: Prompt tokens each item adds besides its own input (its wrapper, its entry in
    #: the reply schema): a plain call pays none.
    frame: int = 0
    #: Reply tokens each answer adds besides its output (its key).
    answer_frame: int = 0
    #: Prompt tokens each plain call would read from a warm prompt cache.
    plain_cached: int = 0


class Spent(NamedTuple):
    """One reply's figures, as :meth:`Savings.add` added them."""

    #: Estimated dollars spent, at its lane's price (NaN: no price or no usage).
    cost: float
    #: Estimated dollars the same items would have cost as plain calls (NaN likewise;
    #: 0 for a re-ask).
    cost_one_per_item: float
    #: Prompt tokens the same items would have used as plain calls (0 for a re-ask,
    #: or without usage).
    input_tokens_one_per_item: int


#: What a reply without reported usage adds.
NOTHING = Spent(math.nan, math.nan, 0)


def lane_cost(usage: Usage, price: Price | None, lane: str = "realtime") -> float:
    """Dollars for one reply's tokens at ``lane``'s price (:data:`~coalesce._pricing.LANE_PRICE`
    of ``price``); NaN without a price. The one rule every cost in coalesce follows: the
    statistics, and the jobs ``coalesce jobs`` collects."""
    if price is None:
        return math.nan
    return cost(
        usage.input_tokens,
        usage.output_tokens,
        price.scaled(LANE_PRICE.get(lane, 1.0)),
        cached_input_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )


class Savings:
    """Token and dollar totals of a function's replies, and of its one-per-item baseline.

    Args:
        price: The model's price, or ``None`` when unknown (then the dollar figures
            are NaN and only tokens are counted).
    """

    def __init__(self, price: Price | None) -> None:
        self.price = price
        #: Prompt tokens reported, cached ones included.
        self.input_tokens = 0
        #: Of those, tokens read from the provider's prompt cache.
        self.cached_input_tokens = 0
        #: Reply tokens reported.
        self.output_tokens = 0
        #: Prompt tokens the same items would have used as plain calls.
        self.input_tokens_one_per_item = 0
        #: Estimated dollars spent (0 without a price).
        self.cost = 0.0
        #: Estimated dollars of the same items as plain calls (0 without a price).
        self.cost_one_per_item = 0.0
        #: ``cost`` by lane.
        self.cost_by_lane: dict[str, float] = {}

    def add(
        self,
        items: int,
        usage: Usage | None,
        shares: Shares,
        *,
        reask: bool = False,
        lane: str = "realtime",
    ) -> Spent:
        """Add one packed (or plain) reply of ``items`` items; return its figures.

        Args:
            usage: The tokens the provider reported, or ``None`` (nothing is added).
            shares: How its tokens split (see :class:`Shares`).
            reask: Whether it asked again for items an earlier reply failed: its items
                were compared when first asked, so it adds to the cost and not to the
                baseline (one request per item would not have needed it).
            lane: Its lane, whose price (:data:`~coalesce._pricing.LANE_PRICE`) it
                is billed at; the baseline is real-time plain calls at list price.
        """
        if usage is None:
            return NOTHING
        shared, plain, frame, answer_frame, plain_cached = (max(0, n) for n in shares)
        own_input = max(0, usage.input_tokens - shared - items * frame)
        baseline_input = 0 if reask else own_input + items * plain
        baseline_output = 0 if reask else max(0, usage.output_tokens - items * answer_frame)
        self._count(usage)
        self.input_tokens_one_per_item += baseline_input
        if self.price is None:
            return Spent(math.nan, math.nan, baseline_input)
        spent = self._bill(usage, lane)
        # A request of one item is its own plain call, cache and all.
        warm = max(items * plain_cached, usage.cached_input_tokens if items == 1 else 0)
        baseline_cached = 0 if reask else min(baseline_input, warm)
        baseline = cost(
            baseline_input, baseline_output, self.price, cached_input_tokens=baseline_cached
        )
        self.cost_one_per_item += baseline
        return Spent(spent, baseline, baseline_input)

    def spend(self, usage: Usage | None) -> float:
        """Add a reply that only costs: a real-time plain call made to check or settle
        answers (the shadow and the vote), with no saving; return its dollars (NaN:
        no price or no usage)."""
        if usage is None:
            return math.nan
        self._count(usage)
        if self.price is None:
            return math.nan
        return self._bill(usage, "realtime")

    def statistics(self) -> Mapping[str, Any]:
        """The totals as :class:`~coalesce.PromptStatistics` fields (dollars NaN without
        a price)."""
        known = self.price is not None
        spent = self.cost if known else math.nan
        baseline = self.cost_one_per_item if known else math.nan
        return {
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "input_tokens_one_per_item": self.input_tokens_one_per_item,
            "estimated_cost": spent,
            "estimated_cost_one_per_item": baseline,
            "savings": 1.0 - spent / baseline if baseline > 0 else math.nan,
            "cost_by_lane": MappingProxyType(
                {
                    lane: dollars if known else math.nan
                    for lane, dollars in self.cost_by_lane.items()
                }
            ),
        }

    def _count(self, usage: Usage) -> None:
        """Add the tokens the provider reported: spent, whatever the request."""
        self.input_tokens += usage.input_tokens
        self.cached_input_tokens += usage.cached_input_tokens
        self.output_tokens += usage.output_tokens

    def _bill(self, usage: Usage, lane: str) -> float:
        """Add the dollars of ``usage`` at ``lane``'s price to the totals; return them."""
        spent = lane_cost(usage, self.price, lane)
        self.cost += spent
        self.cost_by_lane[lane] = self.cost_by_lane.get(lane, 0.0) + spent
        return spent

    def __repr__(self) -> str:
        return (
            f"<Savings {self.input_tokens} input tokens (one per item"
            f" {self.input_tokens_one_per_item}), ${self.cost:.6f}"
            f" (one per item ${self.cost_one_per_item:.6f})>"
        )
