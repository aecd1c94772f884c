"""Best group size for a budget, from the planner's own rules: a benchmark's yardstick.

Used by ``bench_budget.py`` to say how close the planner gets to the largest group
that could meet the budget; tested in ``tests/test_group_sizing.py``.
"""

from __future__ import annotations

import math

from coalesce._exceptions import ConfigurationError
from coalesce._planning.planner import PlanItem, PlanLimits, Predict, latest_start

__all__ = ["best_group_size", "prompt_tokens_ratio"]


def best_group_size(
    *,
    arrival_rate: float,
    budget: float,
    max_wait: float,
    shared_tokens: int,
    item_input_tokens: int,
    item_output_tokens: int,
    predict: Predict,
    max_items: int = 64,
    per_item_overhead_tokens: int = 20,
    streaming: bool = False,
    per_item_output_overhead_tokens: int = 3,
) -> int:
    """Return the largest group size whose every member meets ``budget``; at least 1.

    A group of ``k`` items arriving evenly at ``arrival_rate`` per second keeps its
    first member waiting ``(k - 1) / arrival_rate`` for the group to fill; then the
    request takes ``predict`` of its packed size, or, with ``streaming``, each member
    is answered once the outputs up to its own are written (see :func:`latest_start`).
    A group is never larger than what arrives within ``max_wait`` (the window is
    dispatched then), nor than ``max_items``. If no size meets the budget, 1: an item
    is sent alone rather than not at all.

    Args:
        arrival_rate: Items per second (``math.inf`` for a burst).
        budget: Latency budget of each item, in seconds.
        max_wait: Longest a window waits, in seconds.
        shared_tokens: Input tokens paid once per request.
        item_input_tokens: Input tokens of one item.
        item_output_tokens: Expected output tokens of one item.
        predict: Predicted duration of one request.
        max_items: Most items per request.
        per_item_overhead_tokens: See :class:`PlanLimits`.
        streaming: See :class:`PlanLimits`.
        per_item_output_overhead_tokens: See :class:`PlanLimits`.

    Raises:
        ConfigurationError: If ``arrival_rate`` is not positive or a limit is invalid.
    """
    if not arrival_rate > 0:
        raise ConfigurationError(f"arrival_rate must be > 0, got {arrival_rate!r}")
    limits = PlanLimits(
        max_items=max_items,
        max_wait=max_wait,
        shared_tokens=shared_tokens,
        per_item_overhead_tokens=per_item_overhead_tokens,
        streaming=streaming,
        per_item_output_overhead_tokens=per_item_output_overhead_tokens,
    )
    largest = limits.max_items
    if math.isfinite(arrival_rate * max_wait):  # else a burst, or no wait limit
        largest = min(largest, 1 + math.floor(arrival_rate * max_wait + 1e-9))
    for k in range(largest, 1, -1):
        arrivals = [j / arrival_rate for j in range(k)]
        group = [
            PlanItem(item_input_tokens, item_output_tokens, at + budget, at) for at in arrivals
        ]
        if latest_start(group, limits, predict) >= arrivals[-1] - 1e-9:
            return k
    return 1


def prompt_tokens_ratio(k: int, shared: float, per_item: float) -> float:
    """Return prompt tokens per item at group size ``k`` divided by those at size 1.

    ``((shared + k * per_item) / k) / (shared + per_item)``: the saving from paying the
    shared instructions once per request, to compare with a benchmark's measured ratio.

    Args:
        k: Group size, at least 1.
        shared: Tokens paid once per request (instructions, reply format).
        per_item: Tokens of one item as packed (input plus its wrapper).

    Raises:
        ConfigurationError: If ``k < 1`` or a one-item prompt would have no tokens.
    """
    if k < 1:
        raise ConfigurationError(f"group size must be >= 1, got {k!r}")
    if not (shared >= 0 and per_item >= 0 and shared + per_item > 0):
        raise ConfigurationError(
            f"shared and per_item must be >= 0 and not both 0, got {shared!r}, {per_item!r}"
        )
    return (shared / k + per_item) / (shared + per_item)
