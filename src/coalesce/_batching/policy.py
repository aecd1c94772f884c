"""When does an open window become a batch? Pure decisions, no clock, no I/O.

The batcher keeps one open *window* per partition key and asks these functions,
with explicit state and ``now``, whether to dispatch it. Tests call them with
hand-built numbers and no event loop.

Beyond its own limits (items, weight, ``max_wait``), a batcher may be given a
:class:`DispatchPolicy`: a small object it consults before and after each item joins
a window (the latency-budget planner is one, :class:`~coalesce._planning.policy.BudgetPolicy`).
Policies compose by wrapping: the engine's :class:`~coalesce._engine.admission.ContextPolicy`
closes a window before an item that would push its request past the model's context
window (:attr:`DispatchReason.TOKENS`), and otherwise asks the budget planner's.

A policy may also *hold* an item (:class:`Hold`): it stays out of every window until
the time the policy names or until a batch of the batcher ends, whichever comes first,
and is then offered to the policy again as if it arrived then. The budget planner holds
the calls of a cold function while the first one, sent alone (:attr:`DispatchReason.PROBE`),
teaches it how fast the provider is.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

__all__ = [
    "DispatchPolicy",
    "DispatchReason",
    "Due",
    "Hold",
    "Limits",
    "after_add",
    "before_add",
    "window_deadline",
]

T_contra = TypeVar("T_contra", contravariant=True)


class DispatchReason(str, enum.Enum):
    """Why a batch was dispatched."""

    #: The window reached ``max_items``.
    FULL = "full"
    #: The window reached ``max_size``, or the next item would have pushed it over.
    SIZE = "size"
    #: The oldest item in the window had waited ``max_wait``.
    WINDOW = "window"
    #: ``aclose()`` flushed the window.
    CLOSE = "close"
    #: Waiting longer (or adding the next item) would make the predicted finish of
    #: the window's most urgent member miss its deadline (``latency_budget``).
    DEADLINE = "deadline"
    #: The item's own prediction already exceeded its budget: sent at once, alone.
    SOLO = "solo"
    #: The context window or the output-token limit of one request was reached.
    TOKENS = "tokens"
    #: Sent alone at once, so that what its batch teaches the policy sizes the items it
    #: holds meanwhile (a cold function's first call under a ``latency_budget``).
    PROBE = "probe"
    #: Sent alone at once because the item reads like instructions to the model (the
    #: ``screen=`` of :mod:`coalesce._wire.screen`): it must not share a prompt.
    SCREENED = "screened"
    #: Sent at once because the batcher's work moved to the background loop (calls
    #: came from a second event loop): what waited on the loop it left went then.
    MOVE = "move"

    def __str__(self) -> str:
        return self.value


class Due(NamedTuple):
    """When a window must be dispatched at the latest, and why then."""

    at: float
    """The latest dispatch time; may be in the past (dispatch at once)."""
    reason: DispatchReason
    """Why: ``WINDOW`` if ``max_wait`` comes first, else the policy's own reason."""


class Hold(NamedTuple):
    """A policy's answer to an arriving item: keep it out of every window for now.

    The item waits, with the other items held in its partition, until ``until`` or until
    a batch of the batcher ends, whichever comes first (what the policy knows may have
    changed); then the held items are offered to the policy again, in the order they
    arrived, as if they arrived then. A hold whose ``until`` is not after the current
    time, or one asked while the batcher closes, is ignored: the item joins its window.
    """

    until: float
    """The latest time the item is held (same clock as ``now``)."""


class DispatchPolicy(Protocol[T_contra]):
    """Decides, besides the batcher's own limits, when a window is dispatched.

    Both methods are pure functions of the window's items and ``now`` (and of what
    the policy knows); the batcher applies their answers. Tests build windows by hand.

    A policy may also give items deadlines: ``expires_at(item) -> float`` (same clock as
    ``now``; ``math.inf`` for none) and ``expired(item, now) -> BaseException``. Then an
    item whose window waits for a ``max_concurrency`` slot past its deadline is taken
    out of it and its caller gets ``expired(item, now)`` at that moment, unsent.
    """

    def before_add(
        self, members: Sequence[T_contra], item: T_contra, now: float
    ) -> DispatchReason | Hold | None:
        """Before ``item`` joins the window holding ``members`` (empty: it opens one).

        Returns ``None`` to let it join, a reason to dispatch the window first,
        :attr:`DispatchReason.SOLO` or :attr:`DispatchReason.PROBE` to send ``item``
        alone at once, or a :class:`Hold` to keep it out of every window for now.
        """
        ...

    def after_add(self, members: Sequence[T_contra], now: float) -> Due | None:
        """After an item joined: when the window is due (at or before ``now``: at once).

        The answer replaces the window's ``max_wait`` deadline (a policy may wait longer,
        as the planner does while the request quota binds); ``None`` keeps it.
        """
        ...


@dataclass(frozen=True)
class Limits:
    """The limits one batcher enforces on every window.

    Attributes:
        max_items: Most items in one batch.
        max_wait: Longest an item waits in an open window, in seconds.
        max_size: Most total weight in one batch, or ``None`` for no weight limit.
    """

    max_items: int
    max_wait: float
    max_size: float | None = None


def before_add(count: int, size: float, item_size: float, limits: Limits) -> DispatchReason | None:
    """Must the open window be dispatched *before* an item of ``item_size`` joins it?

    Only when the window already holds items and the new one would push it over
    ``max_size``; an empty window always accepts the item, however heavy, so an
    item heavier than ``max_size`` travels alone instead of being dropped.
    """
    if limits.max_size is not None and count and size + item_size > limits.max_size:
        return DispatchReason.SIZE
    return None


def after_add(count: int, size: float, limits: Limits) -> DispatchReason | None:
    """Must the window, now holding ``count`` items of total ``size``, go at once?"""
    if count >= limits.max_items:
        return DispatchReason.FULL
    if limits.max_size is not None and size >= limits.max_size:
        return DispatchReason.SIZE
    return None


def window_deadline(opened_at: float, limits: Limits) -> float:
    """The time at which a window opened at ``opened_at`` is dispatched."""
    return opened_at + limits.max_wait


def validate_size(value: float) -> float:
    """Check an item weight returned by the user's ``size`` function."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"size() must return a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"size() must return a number >= 0, got {value!r}")
    return value
