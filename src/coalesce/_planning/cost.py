"""Whether packing pays: the cost of a packed request against plain calls. Pure.

A packed request of ``n`` items pays its shared part once (the instructions, the
packing format, the reply schema) and a small frame per item, in and out (see
:class:`~coalesce._planning.footprint.Footprint`). Its ``n`` members sent as plain calls
pay the plain shared part (the instructions and output schema) each, and no frame. In
input-token prices, with ``r`` the output/input price ratio::

    packed(n) - plain(n) = shared + n * (item_frame + r * answer_frame) - n * plain_shared

so packing pays from the smallest ``n`` that makes this negative, and never when each
item's frames cost as much as the plain shared part it saves (short instructions).
:func:`smallest_paying_group` computes that ``n``.

Prompt caching changes the sum. A provider that caches a prompt prefix bills a warm
prefix at a fraction ``c`` of the input price (OpenAI: automatic from 1,024 tokens;
Anthropic: a marked prefix above a per-model minimum, read at 0.1x). Plain calls then
pay their shared part at ``c`` each, and a packed request its own, where each is long
enough to be cached (:class:`PromptCache`)::

    packed(n) - plain(n) = c_packed * shared + n * (frames - c_plain * plain_shared)

The decision assumes a warm cache (steady traffic): the best plain alternative, not the
naive one. Below the minimum nothing is cached and packing is the only way to pay the
instructions once.
"""

from __future__ import annotations

import math

from .._pricing import Price, PromptCache
from .footprint import Footprint

__all__ = [
    "DEFAULT_OUTPUT_INPUT_RATIO",
    "PackingCost",
    "PromptCache",
    "cached_share",
    "packing_saves",
    "plain_call_cost",
    "smallest_paying_group",
    "voting_pays",
]

#: Output tokens cost about four times input tokens at most providers (gpt-4o-mini
#: $0.60/$0.15, gpt-4o $10/$2.50, claude haiku $4/$0.80 per million): the ratio used
#: for a model without a known price.
DEFAULT_OUTPUT_INPUT_RATIO = 4.0


def cached_share(prefix_tokens: int, cache: PromptCache | None, price: Price | None) -> float:
    """What a prefix of ``prefix_tokens`` costs with a warm cache, in input tokens:
    all of it below the cache's minimum (or without a cache), a fraction above."""
    if cache is None or prefix_tokens < cache.min_tokens:
        return float(prefix_tokens)
    return prefix_tokens * cache.discount(price)


def _ratio(price: Price | None) -> float:
    if price is None or price.input_per_mtok <= 0:
        return DEFAULT_OUTPUT_INPUT_RATIO
    return price.output_per_mtok / price.input_per_mtok


def _gain(footprint: Footprint, price: Price | None, cache: PromptCache | None) -> float:
    """What each packed item saves: its plain shared part, less its frames."""
    per_item = footprint.item_frame + _ratio(price) * footprint.answer_frame
    return cached_share(footprint.plain_shared, cache, price) - per_item


def packing_saves(
    footprint: Footprint, price: Price | None, items: int, cache: PromptCache | None = None
) -> float:
    """Input-token equivalents a packed request of ``items`` saves against plain calls
    (negative: it costs more), with a warm ``cache`` if the provider has one."""
    return items * _gain(footprint, price, cache) - cached_share(footprint.shared, cache, price)


def plain_call_cost(
    footprint: Footprint,
    price: Price | None,
    cache: PromptCache | None = None,
    *,
    item_tokens: int,
    output_tokens: int,
) -> float:
    """What one plain call costs, in input-token equivalents (the unit of
    :func:`packing_saves`): its shared part (at the cached price with a warm ``cache``),
    its item and its answer at the output/input price ratio."""
    shared = cached_share(footprint.plain_shared, cache, price)
    return shared + item_tokens + _ratio(price) * output_tokens


def voting_pays(
    footprint: Footprint,
    price: Price | None,
    cache: PromptCache | None,
    *,
    item_tokens: int,
    output_tokens: int,
    items: int,
    disagreement: float = 0.0,
    overheads: tuple[float, float] = (0.0, 0.0),
) -> bool:
    """Whether asking a group of ``items`` packed twice (``vote=True``) costs less
    than asking each item alone once.

    Two packed requests cost ``2 * (plain - saves)``, with ``plain`` the items' plain
    calls and ``saves`` what one packed request saves on them (:func:`packing_saves`),
    and the items the two orders disagree on are asked alone as well
    (``disagreement * plain``): voting pays when ``2 * saves > (1 + disagreement) *
    plain``. The items' own tokens, which one packed request pays once like plain
    calls, are paid twice.

    Args:
        footprint: The function's token footprint.
        price: The model's price (``None``: the usual output/input ratio).
        cache: The provider's prompt cache, if it has one (assumed warm).
        item_tokens: The group's items' own input tokens, all together.
        output_tokens: Their answers' tokens, all together (an estimate).
        items: Items in the group.
        disagreement: The share of voted items whose two answers differed so far.
        overheads: Prompt tokens a plain call and a packed request cost beyond the
            estimates (learned from the provider's counts), each paid per request.
    """
    plain_overhead, packed_overhead = overheads
    plain = (
        items * (cached_share(footprint.plain_shared, cache, price) + plain_overhead)
        + item_tokens
        + _ratio(price) * output_tokens
    )
    saves = packing_saves(footprint, price, items, cache) + items * plain_overhead - packed_overhead
    return 2 * saves > (1 + disagreement) * plain


def smallest_paying_group(
    footprint: Footprint, price: Price | None, max_items: int, cache: PromptCache | None = None
) -> int | None:
    """The smallest group whose packed request costs less than its members as plain
    calls, or ``None`` if no group of up to ``max_items`` does.

    Args:
        footprint: The function's token footprint.
        price: The model's price (``None``: unknown; the usual price ratio is assumed).
        max_items: The largest group allowed.
        cache: The provider's prompt cache, if it has one (assumed warm).
    """
    gain = _gain(footprint, price, cache)
    if gain <= 0:
        return None
    smallest = max(2, math.floor(cached_share(footprint.shared, cache, price) / gain) + 1)
    return smallest if smallest <= max_items else None


class PackingCost:
    """Whether packing pays for one function, kept up to date as the provider's prompt
    cache shows itself.

    A provider that declares no cache is taken to have none until a reply reports
    cached tokens; from then on the decision (and the plain-call baseline of the
    statistics) assume the cache is warm.

    Args:
        footprint: The function's token footprint.
        price: The model's price, if known.
        max_items: The largest group allowed.
        cache: The provider's declared prompt cache, if any.
        auto: Decide by cost (``packing="auto"``); otherwise packing always "pays".
    """

    def __init__(
        self,
        footprint: Footprint,
        price: Price | None,
        max_items: int,
        cache: PromptCache | None,
        *,
        auto: bool = True,
    ) -> None:
        self.footprint, self.price, self.max_items, self.auto = footprint, price, max_items, auto
        self.cache = cache
        self.smallest = self._decide()

    @property
    def pays_from(self) -> float:
        """The smallest group that pays (``math.inf``: none)."""
        return math.inf if self.smallest is None else self.smallest

    def plain_cached_tokens(self) -> int:
        """Prompt tokens a plain call would read from a warm cache: its shared part,
        when the cache keeps a prefix that long."""
        cache, shared = self.cache, self.footprint.plain_shared
        return shared if cache is not None and shared >= cache.min_tokens else 0

    def saw_cached(self, cached_tokens: int) -> bool:
        """Note a reply's cached tokens; whether this revealed a cache not known before
        (the decision is then made again)."""
        if cached_tokens <= 0 or self.cache is not None:
            return False
        self.cache = PromptCache()
        self.smallest = self._decide()
        return True

    def _decide(self) -> int | None:
        if not self.auto:
            return 2
        return smallest_paying_group(self.footprint, self.price, self.max_items, self.cache)
