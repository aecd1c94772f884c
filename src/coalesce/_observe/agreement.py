"""How often two answers to the same item agreed, with a confidence interval.

:class:`Agreement` is a statistics value (:attr:`coalesce.PromptStatistics.agreement_by_size`)
that the accuracy code fills in (the shadow's verdicts per group size); it lives
here, below both, so that the statistics can name it without importing accuracy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import NamedTuple

__all__ = ["Agreement", "CapLearning", "merged_agreement", "wilson_interval"]


class Agreement(NamedTuple):
    """How often packed and plain answers agreed at one group size.

    Attributes:
        agreed: Shadowed items whose packed and plain answers agreed.
        total: Shadowed items.
        low: Lower end of the 95% Wilson interval of the agreement rate.
        high: Upper end.
    """

    agreed: int
    total: int
    low: float
    high: float

    @property
    def rate(self) -> float:
        """``agreed / total`` (NaN before any)."""
        return self.agreed / self.total if self.total else math.nan


def wilson_interval(agreed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``agreed / total`` (``(0, 1)`` before any)."""
    if total <= 0:
        return 0.0, 1.0
    p = agreed / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


#: An agreement as its four numbers (any :class:`Agreement`-shaped tuple).
AgreementTuple = tuple[int, int, float, float]


def merged_agreement(tables: Iterable[Mapping[int, AgreementTuple]]) -> dict[int, Agreement]:
    """Several tables of agreement per group size, added up (one table: itself): ``wrap``'s
    kinds of call each shadow on their own, and report together per model."""
    tables = list(tables)
    if len(tables) == 1:
        return {size: Agreement(*numbers) for size, numbers in tables[0].items()}
    counts: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    for table in tables:
        for size, (agreed, total, _, _) in table.items():
            counts[size] += agreed
            totals[size] += total
    return {
        size: Agreement(counts[size], total, *wilson_interval(counts[size], total))
        for size, total in sorted(totals.items())
    }


class CapLearning(NamedTuple):
    """How the group cap was learned (``PromptStatistics.cap_learning``).

    Attributes:
        cap: The group cap in force.
        limit: The highest it may go: ``max_items`` when given, else the learning's
            ceiling.
        learned: Whether the cap is learned (``max_items`` not given).
        bad: The smallest group size judged too large (``None``: none yet); the cap
            never rises to it again.
        tail_agreed: Agreeing verdicts in the cap's tail (positions past half the cap).
        tail_total: Verdicts in the cap's tail.
        learning_requests: Shadow calls made to learn the cap, beyond the ``shadow=``
            rate (part of ``shadow_requests``).
        moves: The last moves of the cap, oldest first: ``(from, to, why)``.
        stored: Where the evidence is kept between processes (``None``: nowhere).
    """

    cap: int
    limit: int
    learned: bool
    bad: int | None
    tail_agreed: int
    tail_total: int
    learning_requests: int
    moves: tuple[tuple[int, int, str], ...]
    stored: str | None
