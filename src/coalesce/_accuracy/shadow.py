"""The live accuracy guard: a sample of packed items is also asked alone.

Packing changes what the model reads, and small models answer worse in larger groups
(see ``docs/accuracy.md``). With ``shadow=`` (a fraction), that fraction of the items
answered in packed requests is asked again as a plain call, in the background, after
its caller has its packed answer (which it keeps: the shadow answer is only
compared). Agreement between the two answers is tracked per group size; when it is
confidently below ``min_agreement`` at some size, the function's group cap comes
down (halved), and it climbs back one item at a time while agreement at the cap
holds: additive increase, multiplicative decrease.

The decision is :func:`next_cap`, a pure function of the recent verdicts;
:class:`ShadowGuard` keeps the verdicts, samples the items (exactly ``shadow`` of the
packed items, never more: the cost is capped) and answers what the statistics report.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._observe.agreement import Agreement, wilson_interval

__all__ = ["ShadowGuard", "next_cap"]

#: Verdicts at one size before it is judged.
MIN_SAMPLES = 30
#: Recent verdicts kept per size for the decision.
RECENT = 200


def next_cap(
    cap: int,
    max_items: int,
    recent: Mapping[int, Sequence[bool]],
    min_agreement: float,
    min_samples: int = MIN_SAMPLES,
) -> int:
    """The group cap after the recent verdicts (``True``: the answers agreed). Pure.

    * A size whose agreement is confidently below ``min_agreement`` (the upper end of
      its 95% interval under it, from ``min_samples`` verdicts) halves the cap below
      that size.
    * Otherwise, when the cap's own size has twice ``min_samples`` recent verdicts
      and agreed at least ``min_agreement`` of the time, the cap rises by one, up to
      ``max_items``.
    """
    judged = {size: votes for size, votes in recent.items() if len(votes) >= min_samples}
    bad = [
        size
        for size, votes in judged.items()
        if size <= cap and wilson_interval(sum(votes), len(votes))[1] < min_agreement
    ]
    if bad:
        return max(1, min(bad) // 2)
    votes = recent.get(cap, ())
    enough = cap < max_items and len(votes) >= 2 * min_samples
    return cap + 1 if enough and sum(votes) >= min_agreement * len(votes) else cap


def _equal(packed: Any, plain: Any) -> bool:
    return bool(packed == plain)


class ShadowGuard:
    """Samples packed items for shadow calls and moves the group cap (see the module doc).

    Args:
        rate: Fraction of the packed items asked again alone (0 to 1).
        min_agreement: Agreement under which a group size is judged too large.
        max_items: The function's ``max_items``: the cap never goes above it.
        agree: ``agree(packed, plain) -> bool``; default: equality (enums, booleans,
            numbers, pydantic models field by field). Free text needs its own.
        min_samples: Verdicts at one size before it is judged.
    """

    def __init__(
        self,
        rate: float,
        min_agreement: float,
        max_items: int,
        agree: Callable[[Any, Any], bool] | None = None,
        *,
        min_samples: int = MIN_SAMPLES,
    ) -> None:
        self.rate, self.min_agreement, self.max_items = rate, min_agreement, max_items
        self.agree = agree or _equal
        self.min_samples = min_samples
        self.cap = max_items
        self.packed = self.shadowed = 0
        self._counts: dict[int, list[int]] = {}
        self._recent: dict[int, deque[bool]] = {}

    def wants(self, size: int) -> bool:
        """Whether to shadow an item just answered in a request of ``size`` items.

        Exactly ``rate`` of the packed items are shadowed (the first when the count
        crosses the next whole one): the cost is bounded, not left to chance.
        """
        if size < 2:
            return False
        self.packed += 1
        if math.floor(self.packed * self.rate) > self.shadowed:
            self.shadowed += 1
            return True
        return False

    def record(self, size: int, packed: Any, plain: Any) -> bool:
        """Judge one shadowed item; move the cap if the verdicts say so. Whether the
        answers agreed (an ``agree`` that raises counts as a disagreement)."""
        try:
            agreed = bool(self.agree(packed, plain))
        except Exception:
            agreed = False
        counts = self._counts.setdefault(size, [0, 0])
        counts[0] += agreed
        counts[1] += 1
        self._recent.setdefault(size, deque(maxlen=RECENT)).append(agreed)
        cap = next_cap(self.cap, self.max_items, self._recent, self.min_agreement, self.min_samples)
        if cap < self.cap:  # what larger groups said is history now
            for stale in [s for s in self._recent if s > cap]:
                del self._recent[stale]
        self.cap = cap
        return agreed

    def agreement(self) -> dict[int, Agreement]:
        """Per group size, every verdict so far."""
        return {
            size: Agreement(agreed, total, *wilson_interval(agreed, total))
            for size, (agreed, total) in sorted(self._counts.items())
        }

    def __repr__(self) -> str:
        return f"<ShadowGuard rate={self.rate} cap={self.cap}/{self.max_items}>"
