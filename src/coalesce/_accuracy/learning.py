"""Where the group cap goes after the shadow verdicts, and when to shadow. Pure.

The group cap is learned per model and function: it starts at the safe cap, rises
geometrically while packed answers at the cap agree with plain ones, and falls where
they do not. Evidence comes from shadow calls (a packed item asked again alone), each
a verdict at the item's group size and its position in the request.

* **The tail decides.** Answers get worse down a packed prompt (``docs/accuracy.md``),
  and positions up to half the cap were checked when the cap was half as large; so
  the cap is judged by its *tail*: items at positions past half the cap, in groups
  larger than half the cap. :func:`next_cap` raises the cap (doubled, up to the
  ``limit``) when agreement in the tail is confidently at least ``min_agreement`` (the
  lower end of its one-sided 95% Wilson bound), and lowers it to just before the first
  weak position of a tail that is confidently below (the upper end under it).
* **Sizes too.** As before, a group size at or under the cap whose agreement is
  confidently below ``min_agreement`` halves the cap below it.
* **A size judged too large is remembered** (``bad``): the cap never rises to it
  again, only half way to it from where it stands, so learning ends, and its cost
  with it.
* **Learn a rise only where the traffic fills the cap.** When the groups leave before
  reaching the top of the cap (their wait ended by the budget, not the cap), a higher
  cap would carry nothing more: the tail is shadowed only as far as judging a fall
  takes, and the rise waits until the traffic fills the cap (:func:`fills`).
* **Shadow densely while thin, sparsely once firm.** :func:`learning_wanted` says
  whether one more tail item should be shadowed to decide the cap now: while the tail
  has not yet decided and no more than :data:`STEP_ALLOWANCE` verdicts were spent on
  this step. The user's ``shadow=`` rate is the long-run rate on top of that
  (:class:`~coalesce._accuracy.shadow.ShadowGuard`).
* **Paid for by what packing saved.** A :class:`LearningBudget` lets learning spend
  at most :data:`LEARNING_SHARE` of what packing has saved so far, and starts a step
  only once that share would pay for the whole of it (the shadow calls it needs at
  least): no job, the first included, costs more than plain calls because of
  learning, and a function that saves little learns slowly, or not at all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .._observe.agreement import wilson_interval

__all__ = [
    "FILLED_SHARE",
    "LEARNING_SHARE",
    "MIN_SAMPLES",
    "STEP_ALLOWANCE",
    "TAIL_SAMPLES",
    "TOP_SAMPLES",
    "LearningBudget",
    "Move",
    "Z",
    "fills",
    "in_tail",
    "in_top",
    "learning_wanted",
    "next_cap",
    "verdicts_to_rise",
]

#: Verdicts at one group size before the size itself is judged.
MIN_SAMPLES = 30
#: Verdicts in the tail before it may lower the cap: a bad tail is usually very bad
#: (the last positions wrong), and each verdict waited for is a group of answers given.
TAIL_SAMPLES = 12
#: Verdicts at the top of the tail (positions past three quarters of the cap) before
#: the cap may rise: a cap is raised on evidence from groups that reached it.
TOP_SAMPLES = 8
#: Verdicts at one position of the tail before that position alone may lower the cap.
POSITION_SAMPLES = 8
#: Most shadow calls spent to decide one step of the cap, as a multiple of
#: :func:`verdicts_to_rise`; past it the evidence is as firm as learning makes it.
STEP_ALLOWANCE = 3
#: The share of recently packed items that must have been in groups reaching the top
#: of the cap's tail before learning pays for a rise: below it, the groups the traffic
#: makes (their wait ended by the budget, not by the cap) would not use a higher cap.
FILLED_SHARE = 0.2
#: The z of a one-sided 95% bound. Each decision asks one question in one direction (is
#: agreement at least ``min_agreement``? is it under?), so the bound it needs is
#: one-sided: 25 agreeing verdicts decide a rise at 0.9, where the lower end of a
#: two-sided 95% interval took 35, each a plain call at full price.
Z = 1.645
#: The most of packing's savings so far that learning may spend on shadow calls: the
#: other half is the caller's from the first job on (with short instructions, where a
#: packed item saves little, learning then waits until enough was saved).
LEARNING_SHARE = 0.5


@dataclass
class LearningBudget:
    """What learning may spend: a share of what packing has saved so far. Pure.

    Amounts are in one unit (input-token equivalents at the model's price): ``saved``
    is what the packed requests answered so far saved against their items' plain calls,
    ``spent`` what learning's shadow calls cost.

    Attributes:
        share: The most of ``saved`` learning may spend.
        saved: What packing has saved so far.
        spent: What learning's shadow calls have cost so far.
    """

    share: float = LEARNING_SHARE
    saved: float = 0.0
    spent: float = 0.0

    def earn(self, amount: float) -> None:
        """Packing saved ``amount`` more (a packed request that cost more counts too)."""
        if math.isfinite(amount):
            self.saved += amount

    def affords(self, price: float, needed: int = 1) -> bool:
        """Whether one more shadow call of ``price`` fits, with room for the ``needed``
        calls (this one included) the step still takes at least: a step is begun only
        once the budget would pay for all of it."""
        return self.spent + max(1, needed) * price <= self.share * self.saved

    def spend(self, price: float) -> None:
        """A shadow call of ``price`` was sent."""
        self.spent += price

    def left(self) -> float:
        """What learning may still spend (negative: none)."""
        return self.share * self.saved - self.spent


class Move(NamedTuple):
    """The cap after a decision.

    Attributes:
        cap: The group cap.
        bad: The smallest group size judged too large so far (``None``: none).
        reason: Why the cap moved, for the log and the statistics (``""``: it held).
    """

    cap: int
    bad: int | None
    reason: str = ""


def verdicts_to_rise(min_agreement: float) -> int:
    """How many agreeing verdicts put the one-sided 95% lower bound at
    ``min_agreement`` (25 for 0.9): the least a step of the cap costs."""
    if min_agreement <= 0:
        return 1
    if min_agreement >= 1:
        return 10**9  # agreement is never confidently perfect
    return max(1, math.ceil(Z * Z * min_agreement / (1 - min_agreement)))


@functools.lru_cache(maxsize=256)
def verdicts_to_decide(disagreements: int, min_agreement: float) -> int:
    """How many verdicts, ``disagreements`` of them against, put the one-sided 95% lower
    bound at ``min_agreement`` when all the others agree (58 with 2 against, at 0.9); at
    most :data:`STEP_ALLOWANCE` times :func:`verdicts_to_rise`."""
    most = STEP_ALLOWANCE * verdicts_to_rise(min_agreement)
    for n in range(max(1, disagreements), most):
        if wilson_interval(n - disagreements, n, Z)[0] >= min_agreement:
            return n
    return most


def in_tail(cap: int, size: int, position: int) -> bool:
    """Whether an item at ``position`` (1 for the first written) of a request of
    ``size`` items is in the tail of ``cap``: past half the cap, in a group larger than
    half the cap and not above it."""
    half = cap // 2
    return cap >= 2 and half < size <= cap and half < position <= size


def fills(cap: int, sizes: Sequence[int]) -> bool:
    """Whether the traffic fills ``cap``: at least :data:`FILLED_SHARE` of the recently
    packed items (``sizes``: each one's group size) were in groups that reached the top
    of its tail. Without any, it is taken to (nothing says otherwise)."""
    if not sizes:
        return True
    top = sum(1 for size in sizes if in_top(cap, size))
    return top >= FILLED_SHARE * len(sizes)


def in_top(cap: int, position: int) -> bool:
    """Whether ``position`` is at the top of ``cap``'s tail: past three quarters of it."""
    return cap >= 2 and 3 * cap // 4 < position <= cap


def top_verdicts(cap: int, positions: Mapping[int, tuple[int, int]]) -> int:
    """Verdicts at the top of ``cap``'s tail."""
    return sum(total for position, (_, total) in positions.items() if in_top(cap, position))


def next_cap(
    cap: int,
    limit: int,
    bad: int | None,
    sizes: Mapping[int, Sequence[bool]],
    tail: Sequence[bool],
    positions: Mapping[int, tuple[int, int]],
    min_agreement: float,
    *,
    rise: bool = True,
    min_samples: int = MIN_SAMPLES,
    tail_samples: int = TAIL_SAMPLES,
) -> Move:
    """The cap after the verdicts (``True``: the packed answer agreed). Pure.

    Args:
        cap: The cap in force.
        limit: The highest the cap may go (``max_items`` when given, else the
            learning's ceiling).
        bad: The smallest size judged too large so far, or ``None``.
        sizes: Recent verdicts per group size.
        tail: Recent verdicts in the cap's tail (see :func:`in_tail`).
        positions: Per position in the tail, ``(agreed, total)``.
        min_agreement: The agreement a size must keep.
        rise: Whether the cap may rise (``False``: it only falls).
        min_samples: Verdicts at a size before it is judged.
        tail_samples: Verdicts in the tail before it may lower the cap.
    """
    weak = _weak_size(cap, sizes, min_agreement, min_samples)
    if weak is not None:
        size, agreed, total, high = weak
        return Move(
            max(1, size // 2),
            _lowest(bad, size),
            f"agreement in groups of {size} is {agreed}/{total} (95% bound"
            f" {high:.1%}), under {min_agreement:.0%}",
        )
    agreed, total = sum(tail), len(tail)
    low, high = wilson_interval(agreed, total, Z)
    fall = _tail_fall(cap, bad, tail, positions, min_agreement, tail_samples)
    if fall is not None:
        return fall
    # Doubled; below a size judged too large, half way to it (a bisection).
    top = limit if bad is None else min(limit, (cap + bad) // 2)
    reached = top_verdicts(cap, positions) >= TOP_SAMPLES
    if rise and cap < top and reached and total and low >= min_agreement:
        return Move(
            min(2 * cap, top),
            bad,
            f"agreement past position {cap // 2} is {agreed}/{total} (95% bound"
            f" {low:.1%}), at least {min_agreement:.0%}",
        )
    return Move(cap, bad)


def _tail_fall(
    cap: int,
    bad: int | None,
    tail: Sequence[bool],
    positions: Mapping[int, tuple[int, int]],
    min_agreement: float,
    tail_samples: int,
) -> Move | None:
    """Where the cap falls if one tail position, or the tail as a whole, is confidently
    under ``min_agreement``: just before the first weak position."""
    place = _weak_position(positions, min_agreement)
    if place is not None:
        right, judged = positions[place]
        return Move(
            max(1, place - 1),
            _lowest(bad, place),
            f"agreement at position {place} is {right}/{judged}, confidently under"
            f" {min_agreement:.0%}",
        )
    agreed, total = sum(tail), len(tail)
    high = wilson_interval(agreed, total, Z)[1]
    if total < tail_samples or high >= min_agreement:
        return None
    first = _first_weak_position(cap, positions, min_agreement)
    return Move(
        max(1, first - 1),
        _lowest(bad, first),
        f"agreement past position {cap // 2} is {agreed}/{total} (95% bound"
        f" {high:.1%}), under {min_agreement:.0%}; position {first} is the first weak one",
    )


def _lowest(bad: int | None, size: int) -> int:
    return size if bad is None else min(bad, size)


def _weak_size(
    cap: int, sizes: Mapping[int, Sequence[bool]], min_agreement: float, min_samples: int
) -> tuple[int, int, int, float] | None:
    """The smallest size at or under ``cap`` confidently under ``min_agreement``."""
    for size in sorted(sizes):
        votes = sizes[size]
        if size > cap or len(votes) < min_samples:
            continue
        high = wilson_interval(sum(votes), len(votes), Z)[1]
        if high < min_agreement:
            return size, sum(votes), len(votes), high
    return None


def _weak_position(positions: Mapping[int, tuple[int, int]], min_agreement: float) -> int | None:
    """The first position whose own verdicts are confidently under ``min_agreement``."""
    for position in sorted(positions):
        agreed, total = positions[position]
        if total >= POSITION_SAMPLES and wilson_interval(agreed, total, Z)[1] < min_agreement:
            return position
    return None


def _first_weak_position(
    cap: int, positions: Mapping[int, tuple[int, int]], min_agreement: float
) -> int:
    """The first tail position whose agreement so far is under ``min_agreement`` (the
    first of the tail when none is)."""
    for position in sorted(positions):
        agreed, total = positions[position]
        if total and agreed < min_agreement * total:
            return position
    return cap // 2 + 1


def learning_wanted(
    cap: int,
    position: int,
    tail: Sequence[bool],
    positions: Mapping[int, tuple[int, int]],
    pending: int,
    spent: int,
    min_agreement: float,
    *,
    filled: bool = True,
) -> bool:
    """Whether to shadow one more tail item (at ``position``) to decide the cap's step.

    Args:
        cap: The cap in force.
        position: The item's position in its request.
        tail: The verdicts in the tail so far.
        positions: Per tail position, ``(agreed, total)``.
        pending: Shadow calls of the tail sent and not judged yet.
        spent: Shadow calls spent on this step so far.
        min_agreement: The agreement the cap must keep.
        filled: Whether the traffic fills the cap (:func:`fills`). When it does not, a
            higher cap would not be used: the tail is shadowed only as far as judging
            a fall takes (:data:`TAIL_SAMPLES`), and the rise waits for the traffic.
    """
    least = verdicts_to_rise(min_agreement)
    if spent >= STEP_ALLOWANCE * least:
        return False  # as firm as learning makes it: the user's rate goes on
    agreed, total = sum(tail), len(tail)
    if not filled and pending + total >= TAIL_SAMPLES:
        return False  # enough to judge a fall; a rise would carry nothing more
    if total and wilson_interval(agreed, total, Z)[0] >= min_agreement:
        # Good so far: what is missing is evidence from groups that reached the cap.
        return in_top(cap, position) and top_verdicts(cap, positions) < TOP_SAMPLES
    if total >= TAIL_SAMPLES and wilson_interval(agreed, total, Z)[1] < min_agreement:
        return False  # confidently below, on enough verdicts: the cap comes down now
    if total and wilson_interval(agreed, total, Z)[1] < min_agreement:
        return True  # below so far, on too few verdicts for the fall: ask on
    # Enough verdicts that, if the rest agree, the interval's lower end reaches the bar.
    return pending + total < verdicts_to_decide(total - agreed, min_agreement)
