"""The live accuracy guard: a sample of packed items is also asked alone, and the
verdicts move the group cap.

Packing changes what the model reads, and small models answer worse in larger groups
(see ``docs/accuracy.md``). With ``shadow=`` (a fraction), that fraction of the items
answered in packed requests is asked again as a plain call, in the background, after
its caller has its packed answer (which it keeps: the shadow answer is only
compared). Each verdict counts at the item's group size and at its position in the
request; :func:`~coalesce._accuracy.learning.next_cap` (pure) moves the cap.

When the cap is learned (``max_items`` not given), the guard also shadows the cap's
tail densely until it has decided the current step (at most
:data:`~coalesce._accuracy.learning.STEP_ALLOWANCE` times the verdicts a step needs),
then only at the user's rate: the long-run rate is ``shadow``, and what learning
spent is counted apart (:attr:`ShadowGuard.learning_requests`). With a
:class:`~coalesce._accuracy.learning.LearningBudget`, learning spends only out of what
packing has saved (the guard is told each packed request's saving,
:meth:`ShadowGuard.earn`, and each shadow call's price). The learned cap and
its evidence can be kept in a :class:`~coalesce._accuracy.memory.CapMemory`, so that
the next process starts where this one stopped.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .._observe.agreement import Agreement, CapLearning, wilson_interval
from .learning import (
    MIN_SAMPLES,
    LearningBudget,
    Move,
    fills,
    in_tail,
    learning_wanted,
    next_cap,
    verdicts_to_rise,
)
from .memory import CapMemory, Evidence

__all__ = ["MIN_SAMPLES", "CapLearning", "ShadowGuard", "next_cap"]

logger = logging.getLogger("coalesce")

#: Recent verdicts kept per size, and in the tail, for the decisions.
RECENT = 200
#: Moves of the cap kept for the statistics.
MOVES = 20
#: Learning shadows at most this share of the packed items past the first
#: :data:`LEARN_AFTER` (its dense rate): a function called a handful of times pays
#: for no learning.
LEARN_SHARE = 0.25
#: Packed items answered before learning shadows any.
LEARN_AFTER = 32
#: Packed items whose group sizes say whether the traffic fills the cap.
FILL_WINDOW = 64
#: Verdicts between two saves of the evidence (a move of the cap saves at once).
SAVE_EVERY = 25


def _equal(packed: Any, plain: Any) -> bool:
    return bool(packed == plain)


class ShadowGuard:
    """Samples packed items for shadow calls and moves the group cap (see the module doc).

    Args:
        rate: Fraction of the packed items asked again alone (0 to 1), in the long run.
        min_agreement: Agreement under which a group size is judged too large.
        max_items: The highest the cap may go (``max_items``, or the learning's ceiling).
        agree: ``agree(packed, plain) -> bool``; default: equality (enums, booleans,
            numbers, pydantic models field by field); free text's is
            :func:`~coalesce._accuracy.texts.agreement_for`'s.
        min_samples: Verdicts at one size before it is judged.
        learn: Whether the cap is learned: it starts at ``start`` and the tail is
            shadowed densely until each step is decided.
        start: The cap to start at (default ``max_items``).
        memory: Where the evidence is loaded from and saved to, if anywhere.
        name: The function's name, for the log.
        budget: What learning may spend (``None``: no limit but its own allowance).
        rate_budgeted: The long-run ``rate`` is spent from ``budget`` too (it is the
            default rate, which serves learning; a rate the user gave is kept exactly).
    """

    def __init__(
        self,
        rate: float,
        min_agreement: float,
        max_items: int,
        agree: Callable[[Any, Any], bool] | None = None,
        *,
        min_samples: int = MIN_SAMPLES,
        learn: bool = False,
        start: int | None = None,
        memory: CapMemory | None = None,
        name: str = "",
        budget: LearningBudget | None = None,
        rate_budgeted: bool = False,
    ) -> None:
        self.budget, self.rate_budgeted = budget, rate_budgeted
        self.rate, self.min_agreement, self.max_items = rate, min_agreement, max_items
        self.agree = agree or _equal
        self.min_samples, self.learn, self.memory, self.name = min_samples, learn, memory, name
        self.cap = min(max_items, start if start is not None else max_items)
        self.bad: int | None = None
        self.packed = self.shadowed = self.learning_requests = 0
        self._spent = self._pending = self._unsaved = self._learned = 0
        self._counts: dict[int, list[int]] = {}
        self._recent: dict[int, deque[bool]] = {}
        self._tail: deque[bool] = deque(maxlen=RECENT)
        self._positions: dict[int, list[int]] = {}
        #: The group sizes of the recently packed items: does the traffic fill the cap?
        self._sizes: deque[int] = deque(maxlen=FILL_WINDOW)
        self.moves: deque[tuple[int, int, str]] = deque(maxlen=MOVES)
        if memory is not None:
            self._restore(memory.load())

    def wants(self, size: int, position: int = 0, price: float = 0.0) -> bool:
        """Whether to shadow an item just answered at ``position`` (1 for the first
        written; 0: not known) of a request of ``size`` items.

        Exactly ``rate`` of the packed items are shadowed (the first when the count
        crosses the next whole one); when learning, also the cap's tail while its step
        is undecided and the budget affords the shadow call's ``price``.
        """
        if size < 2:
            return False
        self.packed += 1
        self._sizes.append(size)
        tail = in_tail(self.cap, size, position)
        if math.floor(self.packed * self.rate) > self.shadowed and self._affords(price):
            self.shadowed += 1
        elif not (self.learn and tail and self._learning(position, price)):
            return False
        else:
            if self.budget is not None:
                self.budget.spend(price)
            self._spent += 1
            self._learned += 1
            self.learning_requests += 1
        self._pending += tail
        return True

    def _affords(self, price: float) -> bool:
        """Whether the long-run rate's next shadow call may be sent now (spent from the
        budget when the rate serves learning; owed until the budget affords it)."""
        budget = self.budget
        if budget is None or not self.rate_budgeted:
            return True
        if not budget.affords(price):
            return False
        budget.spend(price)
        return True

    def _learning(self, position: int, price: float) -> bool:
        if self._learned + 1 > LEARN_SHARE * (self.packed - LEARN_AFTER):
            return False
        if self.budget is not None and not self._fell():
            least = verdicts_to_rise(self.min_agreement)
            if not self.budget.affords(price, least - len(self._tail) - self._pending):
                return False
        return learning_wanted(
            self.cap,
            position,
            self._tail,
            self.positions(),
            self._pending,
            self._spent,
            self.min_agreement,
            filled=fills(self.cap, self._sizes),
        )

    def _fell(self) -> bool:
        """Whether the cap last moved down: packed answers were seen going wrong, and
        the cap they brought down is being judged. Those checks are the guard's, not an
        investment in a higher cap: they do not wait for the savings to pay for them
        (a cap of 2 saves little, and its callers would otherwise get packed answers
        unchecked for hundreds of calls). They are still counted as spent, and bounded
        by the step's allowance."""
        return bool(self.moves) and self.moves[-1][1] < self.moves[-1][0]

    def earn(self, saved: float) -> None:
        """A packed request answered, saving ``saved`` against its items' plain calls
        (in the budget's unit): learning may spend a share of it."""
        if self.budget is not None:
            self.budget.earn(saved)

    def at_least(self, size: int) -> None:
        """Stand at ``size`` at least (the smallest group packing pays for, which a
        prompt cache found late can raise) while no verdict has moved the cap: a
        starting cap below it would send every group as plain calls."""
        if self.learn and not self.moves and self.cap < size <= self.max_items:
            self.cap = size

    def burst_cap(self) -> int:
        """The cap of a cold burst (calls held through a cold start's probe): while
        nothing is learned yet, one over the cap, so that the probe's request is paid
        back (40 calls take the probe and 8 groups of 5 where groups of 4 took 10);
        the cap itself otherwise. No more: sized after a single reply, which cannot
        yet tell the provider's overhead from its speed, groups of 8 missed a 2 s
        budget (bench_cap, free text at 100 calls/s: 74% of the first 250 calls).
        """
        fresh = self.learn and not self.moves and self.bad is None
        return min(self.max_items, self.cap + 1) if fresh else self.cap

    def dropped(self) -> None:
        """A shadow call gave no answer to compare (it failed)."""
        self._pending = max(0, self._pending - 1)

    def record(self, size: int, packed: Any, plain: Any, position: int = 0) -> bool:
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
        if in_tail(self.cap, size, position):
            self._tail.append(agreed)
            place = self._positions.setdefault(position, [0, 0])
            place[0] += agreed
            place[1] += 1
        self.dropped()
        self._decide()
        return agreed

    def _decide(self) -> None:
        move = next_cap(
            self.cap,
            self.max_items,
            self.bad,
            self._recent,
            self._tail,
            {p: (a, n) for p, (a, n) in self._positions.items()},
            self.min_agreement,
            min_samples=self.min_samples,
        )
        self.bad = move.bad
        self._unsaved += 1
        if move.cap != self.cap:
            self._move(move)
        elif self._unsaved >= SAVE_EVERY:
            self.save()

    def _move(self, move: Move) -> None:
        """Put the cap at ``move.cap``: the tail starts again, and what larger groups
        said is history once it falls."""
        old, self.cap = self.cap, move.cap
        if move.cap < old:
            for stale in [s for s in self._recent if s > move.cap]:
                del self._recent[stale]
        self._tail.clear()
        self._positions.clear()
        self._spent = self._pending = 0
        self.moves.append((old, move.cap, move.reason))
        level = logging.INFO if move.cap < old else logging.DEBUG
        logger.log(level, "%s: group cap %d -> %d: %s", self.name, old, move.cap, move.reason)
        self.save()

    def save(self) -> None:
        """Keep the evidence in the memory, if there is one."""
        self._unsaved = 0
        if self.memory is not None:
            self.memory.save(self._evidence())

    def _evidence(self) -> Evidence:
        return Evidence(
            cap=self.cap,
            bad=self.bad,
            counts={size: (a, n) for size, (a, n) in self._counts.items()},
            recent={size: list(votes) for size, votes in self._recent.items()},
            tail=list(self._tail),
            positions={p: (a, n) for p, (a, n) in self._positions.items()},
            learning_requests=self.learning_requests,
            moves=list(self.moves),
        )

    def _restore(self, evidence: Evidence | None) -> None:
        """Start where the evidence stopped (its cap within this guard's limit)."""
        if evidence is None:
            return
        self.cap = max(1, min(self.max_items, evidence.cap))
        self.bad = evidence.bad
        self._counts = {size: list(pair) for size, pair in evidence.counts.items()}
        self._recent = {s: deque(v, maxlen=RECENT) for s, v in evidence.recent.items()}
        self._tail.extend(evidence.tail)
        self._positions = {p: list(pair) for p, pair in evidence.positions.items()}
        self.learning_requests = evidence.learning_requests
        self.moves.extend(evidence.moves)

    def agreement(self) -> dict[int, Agreement]:
        """Per group size, every verdict so far."""
        return {
            size: Agreement(agreed, total, *wilson_interval(agreed, total))
            for size, (agreed, total) in sorted(self._counts.items())
        }

    def learning(self) -> CapLearning:
        """The cap, its evidence and its moves (see :class:`CapLearning`)."""
        memory = self.memory
        return CapLearning(
            self.cap,
            self.max_items,
            self.learn,
            self.bad,
            sum(self._tail),
            len(self._tail),
            self.learning_requests,
            tuple(self.moves),
            None if memory is None else str(memory.path),
        )

    def positions(self) -> Mapping[int, tuple[int, int]]:
        """Per position in the cap's tail, ``(agreed, total)``."""
        return {p: (a, n) for p, (a, n) in sorted(self._positions.items())}

    def __repr__(self) -> str:
        return f"<ShadowGuard rate={self.rate} cap={self.cap}/{self.max_items}>"
