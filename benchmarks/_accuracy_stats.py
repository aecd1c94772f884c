"""Statistics for the accuracy benchmark (``bench_accuracy.py``): pure functions.

Every configuration answers the same items, so configurations are compared item by
item (paired), not by their accuracies alone: McNemar's exact test counts the items
one configuration got right and the other wrong, and asks how likely so lopsided a
split is when neither is better (a fair coin over the discordant items). Accuracy
comes with a Wilson score interval, which stays inside [0, 1] and behaves at small
counts and near 0 or 100% (where the normal approximation does not).

No scipy: the binomial tail is summed exactly with :func:`math.comb`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

__all__ = [
    "Paired",
    "bucket_label",
    "bucket_of",
    "mcnemar_exact",
    "paired",
    "runs_of",
    "wilson_interval",
]

T = TypeVar("T")

#: z for a two-sided 95% interval.
Z95 = 1.959963984540054


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs.

    Under the null hypothesis each discordant item is equally likely to favour
    either side, so ``min(b, c)`` follows Binomial(b + c, 1/2); the p-value doubles
    its lower tail (capped at 1). No discordant pair at all gives 1.

    Args:
        b: Items the first configuration got right and the second wrong.
        c: Items the second got right and the first wrong.

    Raises:
        ValueError: A count is negative.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, float(Fraction(2 * tail, 1 << n)))  # exact, and no overflow at large n


@dataclass(frozen=True)
class Paired:
    """Two configurations compared on the same items.

    Attributes:
        n: Items both answered.
        b: Right in the first (the baseline), wrong in the second.
        c: Wrong in the first, right in the second.
        p: Exact McNemar p-value (two-sided).
    """

    n: int
    b: int
    c: int
    p: float

    @property
    def difference(self) -> float:
        """Accuracy of the second minus the first, as a fraction of ``n``."""
        return (self.c - self.b) / self.n if self.n else 0.0


def paired(baseline: Sequence[bool], other: Sequence[bool]) -> Paired:
    """McNemar's comparison of ``other`` against ``baseline``, item by item.

    Args:
        baseline: Per item, whether the baseline answered it correctly.
        other: The same items, in the same order, for the other configuration.

    Raises:
        ValueError: The sequences have different lengths (they must be the same items).
    """
    if len(baseline) != len(other):
        raise ValueError(
            f"paired results need the same items: {len(baseline)} baseline results"
            f" against {len(other)}; run both configurations on the same item list"
        )
    b = sum(1 for x, y in zip(baseline, other, strict=True) if x and not y)
    c = sum(1 for x, y in zip(baseline, other, strict=True) if y and not x)
    return Paired(len(baseline), b, c, mcnemar_exact(b, c))


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for an accuracy of ``correct`` out of ``n``.

    Args:
        correct: Items answered correctly.
        n: Items answered.
        z: The normal quantile (default: 95% two-sided).

    Returns:
        ``(low, high)``; ``(0.0, 1.0)`` when ``n`` is 0 (nothing is known).

    Raises:
        ValueError: ``correct`` is not between 0 and ``n``.
    """
    if not 0 <= correct <= n:
        raise ValueError(f"correct must be between 0 and n={n}, got {correct}")
    if n == 0:
        return 0.0, 1.0
    share = correct / n
    denominator = 1 + z * z / n
    centre = (share + z * z / (2 * n)) / denominator
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / denominator
    # At 0 and n the bound is exactly 0 (or 1); floating point leaves a crumb.
    low = 0.0 if correct == 0 else max(0.0, centre - half)
    high = 1.0 if correct == n else min(1.0, centre + half)
    return low, high


def bucket_of(position: int, group_size: int, buckets: int = 4) -> int:
    """The bucket (0-based) of a 1-based ``position`` in a group of ``group_size``.

    Positions are split into ``buckets`` consecutive runs of equal length (lengths
    differ by at most one when they do not divide evenly); a group smaller than
    ``buckets`` has one bucket per position.

    Raises:
        ValueError: ``position`` is outside ``1..group_size``, or ``buckets`` < 1.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if not 1 <= position <= group_size:
        raise ValueError(f"position must be in 1..{group_size}, got {position}")
    return (position - 1) * min(buckets, group_size) // group_size


def bucket_label(bucket: int, group_size: int, buckets: int = 4) -> str:
    """The positions of ``bucket`` in a group of ``group_size``: ``"1-4"``, ``"16"``..."""
    members = [p for p in range(1, group_size + 1) if bucket_of(p, group_size, buckets) == bucket]
    if not members:
        raise ValueError(f"bucket {bucket} is empty in a group of {group_size} ({buckets} buckets)")
    low, high = members[0], members[-1]
    return str(low) if low == high else f"{low}-{high}"


def runs_of(values: Sequence[T]) -> list[tuple[T, int, int]]:
    """The runs of equal consecutive ``values``: ``(value, start, stop)``, with
    ``values[start:stop]`` the run (the stretches of calls sent at one group cap).

    >>> runs_of([4, 4, 2, 2, 2, 4])
    [(4, 0, 2), (2, 2, 5), (4, 5, 6)]
    """
    runs: list[tuple[T, int, int]] = []
    for index, value in enumerate(values):
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1], index + 1)
        else:
            runs.append((value, index, index + 1))
    return runs
