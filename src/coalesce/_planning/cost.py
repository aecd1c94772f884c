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
"""

from __future__ import annotations

import math

from .._pricing import Price
from .footprint import Footprint

__all__ = ["DEFAULT_OUTPUT_INPUT_RATIO", "packing_saves", "smallest_paying_group"]

#: Output tokens cost about four times input tokens at most providers (gpt-4o-mini
#: $0.60/$0.15, gpt-4o $10/$2.50, claude haiku $4/$0.80 per million): the ratio used
#: for a model without a known price.
DEFAULT_OUTPUT_INPUT_RATIO = 4.0


def _ratio(price: Price | None) -> float:
    if price is None or price.input_per_mtok <= 0:
        return DEFAULT_OUTPUT_INPUT_RATIO
    return price.output_per_mtok / price.input_per_mtok


def packing_saves(costs: Footprint, price: Price | None, items: int) -> float:
    """Input-token equivalents a packed request of ``items`` saves against plain calls
    (negative: it costs more)."""
    per_item = costs.item_frame + _ratio(price) * costs.answer_frame
    return items * (costs.plain_shared - per_item) - costs.shared


def smallest_paying_group(costs: Footprint, price: Price | None, max_items: int) -> int | None:
    """The smallest group whose packed request costs less than its members as plain
    calls, or ``None`` if no group of up to ``max_items`` does.

    Args:
        costs: The function's token footprint.
        price: The model's price (``None``: unknown; the usual price ratio is assumed).
        max_items: The largest group allowed.
    """
    gain = costs.plain_shared - costs.item_frame - _ratio(price) * costs.answer_frame
    if gain <= 0:
        return None
    smallest = max(2, math.floor(costs.shared / gain) + 1)
    return smallest if smallest <= max_items else None
