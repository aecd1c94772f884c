"""Per-item admission: each call's item is checked alone, before it joins a group.

One bad item must not fail its neighbours. So before a call is submitted,
:meth:`Admission.admit` refuses, with :class:`~coalesce.InvalidInputError` for that
caller alone:

* an item that is not strict JSON (:func:`~coalesce._validate.encode_item`, called as
  the engine keys the call): NaN or infinity, a string (or key) holding a lone
  surrogate, which UTF-8 cannot encode, bytes or any other object; the error names the
  field (``$.tags[2]``) and what would be valid;
* an item too large for the model's context window
  (:class:`~coalesce._planning.context.ContextWindow`) together with the instructions
  and its expected output.

Admitted items are then kept apart when they cannot share a request:
:class:`ContextPolicy` closes a window before an item that would push its request past
the context window (ten 100k-token items never make one 1M-token request).

Cheap on purpose (it runs on every call): the canonical JSON the engine needs anyway,
its UTF-8 length as an upper bound on its tokens (a token covers at least one byte), and
a real token count only for an item large enough for the bound to matter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .._batching.policy import DispatchPolicy, DispatchReason, Due, Hold
from .._calls import Job
from .._exceptions import InvalidInputError, RequestTimeoutError
from .._planning.context import ContextWindow
from .._planning.footprint import Footprint
from .._planning.output import request_output_cap
from .._planning.planner import PlanItem, PlanLimits, group_tokens
from .._planning.tokens import TokenEstimator, count_json_tokens
from .spec import FunctionSpec, Options

__all__ = ["Admission", "ContextPolicy", "admission_for"]

# The reply cap is reserved whole: lowering it makes room too.
_CAP_FIX = ", lower max_output_tokens (the reply cap, kept free in the window)"


class Admission:
    """Admits one engine's calls one at a time (see the module doc).

    Args:
        window: The model's context window (it may learn a smaller one).
        footprint: What a request costs besides its items' own tokens.
        estimator: Counts an item's tokens when its size is close to the window.
        output_tokens: Output tokens expected of an item not planned against a budget.
        reply_cap: The ``max_output_tokens`` of a request: the provider keeps room for
            the whole cap in the window, so it is reserved instead of the outputs.
        max_items: Most items in one request.
        item_cap: Each call's own cap on its answer (``item_output_cap``): a bound, not
            a forecast, so it is not reserved; each request's ``max_tokens`` is sized
            from it by :meth:`request_cap`.
    """

    def __init__(
        self,
        window: ContextWindow,
        footprint: Footprint,
        estimator: TokenEstimator,
        *,
        output_tokens: int,
        reply_cap: int | None = None,
        max_items: int = 1,
        item_cap: int | None = None,
    ) -> None:
        self.window = window
        self.footprint = footprint
        self.estimator = estimator
        self.output_tokens = output_tokens
        self.reply_cap = reply_cap
        self.max_items = max_items
        self.item_cap = item_cap
        self.limits = PlanLimits(
            shared_tokens=footprint.shared,
            per_item_overhead_tokens=footprint.item_frame,
            per_item_output_overhead_tokens=footprint.answer_frame,
        )

    def admit(
        self,
        item: Any,
        size: int,
        plan: PlanItem | None = None,
        *,
        deadline: float = math.inf,
        arrival: float = 0.0,
    ) -> PlanItem:
        """Refuse ``item`` if it cannot fit the window alone; else its token plan.

        A call planned against a budget keeps its ``plan``; another gets one here, whose
        input is the item's UTF-8 ``size`` when even a full group of such items fits.

        Args:
            item: The call's input.
            size: The UTF-8 length of its canonical JSON.
            plan: The planner's plan for it, if it plans against a budget.
            deadline: When the call's budget runs out (for a plan made here).
            arrival: When the call was made (for a plan made here).

        Raises:
            InvalidInputError: The item, the instructions and its expected output
                exceed the model's context window.
        """
        limit = self.window.limit
        if plan is None:
            plan = PlanItem(self._tokens(item, size, limit), self.output_tokens, deadline, arrival)
        if limit is not None and plan.input_tokens > self._room(limit, plan.output_tokens):
            raise self._too_large(plan, limit)
        return plan

    def oversized(self, item: Any) -> bool:
        """Whether ``item`` cannot fit the model's known context window with the
        instructions and its expected output. The drop-in client sends such a call as
        it is, for the provider to judge, as it would judge the plain call."""
        limit = self.window.limit
        if limit is None:
            return False
        room = self._room(limit, self.output_tokens)
        if isinstance(item, str) and 4 * len(item) <= room:
            return False  # a token is at least one UTF-8 byte, a character at most four
        return count_json_tokens(item, self.estimator) > room

    def request_cap(self, jobs: Sequence[Job]) -> int | None:
        """The ``max_tokens`` of one request carrying ``jobs`` (one per item), by
        :func:`~coalesce._planning.output.request_output_cap`."""
        if self.item_cap is None:
            return self.reply_cap
        inputs, outputs = group_tokens(_plans(jobs), self.limits)
        limit = self.window.limit
        return request_output_cap(
            len(jobs),
            item_cap=self.item_cap,
            configured=self.reply_cap,
            expected=outputs,
            model_limit=self.window.output_limit,
            room=None if limit is None else limit - inputs,
        )

    def _tokens(self, item: Any, size: int, limit: int | None) -> int:
        """``item``'s input tokens: its ``size`` bounds them, unless that is too coarse."""
        if limit is not None and size * self.max_items > self._room(limit, self.output_tokens):
            return count_json_tokens(item, self.estimator)
        return size

    def _output_room(self, output_tokens: int) -> int:
        if self.reply_cap is not None:
            return self.reply_cap
        return output_tokens + self.footprint.answer_frame

    def _room(self, limit: int, output_tokens: int) -> int:
        """Input tokens one item may have to fit the window in a request of its own."""
        footprint = self.footprint
        return limit - footprint.shared - footprint.item_frame - self._output_room(output_tokens)

    def _too_large(self, plan: PlanItem, limit: int) -> InvalidInputError:
        output = self._output_room(plan.output_tokens)
        needed = self.footprint.shared + self.footprint.item_frame + plan.input_tokens + output
        return InvalidInputError(
            f"the item is about {plan.input_tokens:,} tokens: with the instructions"
            f" ({self.footprint.shared:,}) and room for its output ({output:,}), its request"
            f" needs {needed:,} tokens, more than the model's context window of"
            f" {limit:,} ({self.window.source}). Shorten the item or split it across"
            f" calls{_CAP_FIX if self.reply_cap is not None else ''}, or set context_window="
            " if the model's window is larger"
        )

    def overflows(self, jobs: Sequence[Job]) -> bool:
        """Whether one request packing ``jobs`` would exceed the context window."""
        limit = self.window.limit
        if limit is None:
            return False
        inputs, outputs = group_tokens(_plans(jobs), self.limits)
        if self.reply_cap is not None:
            outputs = self.reply_cap
        return inputs + outputs > limit

    def __repr__(self) -> str:
        return f"Admission({self.window!r})"


def admission_for(
    spec: FunctionSpec,
    options: Options,
    footprint: Footprint,
    estimator: TokenEstimator,
    output_tokens: int,
) -> Admission:
    """The :class:`Admission` of one function's calls.

    An item's expected output is ``output_tokens`` (the one rule of
    :func:`~coalesce._planning.output.expected_output_tokens`); with
    ``max_output_tokens`` set, the whole cap is reserved instead.
    """
    window = ContextWindow(
        spec.model, options.context_window, estimator=estimator, shared_tokens=footprint.shared
    )
    return Admission(
        window,
        footprint,
        estimator,
        output_tokens=output_tokens,
        reply_cap=options.max_output_tokens,
        max_items=options.most_items,
        item_cap=options.item_output_cap,
    )


def _plans(jobs: Sequence[Job]) -> list[PlanItem]:
    plans = [job.plan for job in jobs]
    return [plan for plan in plans if plan is not None]


class ContextPolicy:
    """Dispatch a window before an item that would push its request past the context
    window; otherwise do as ``inner`` (the budget planner's policy, say) says.

    Args:
        admission: Knows the window and each admitted call's token plan.
        inner: The policy it composes with, or ``None``.
        cap: The most items a window of these members may hold now (the shadow
            guard's group cap), if it can be lower than the batcher's ``max_items``.
    """

    def __init__(
        self,
        admission: Admission,
        inner: DispatchPolicy[Job] | None = None,
        cap: Callable[[Sequence[Job]], int] | None = None,
    ) -> None:
        self.admission = admission
        self.inner = inner
        self.cap = cap

    def before_add(
        self, members: Sequence[Job], item: Job, now: float
    ) -> DispatchReason | Hold | None:
        """``SCREENED`` for an item that must go alone; ``FULL`` if the window holds the cap; ``TOKENS`` if ``item`` would not
        fit with ``members`` (``SOLO`` if ``inner`` sends it alone anyway); else
        ``inner``'s answer (a cold start's ``PROBE`` or :class:`Hold` too)."""
        if item.alone:
            return DispatchReason.SCREENED
        inner = self.inner
        if members and self.cap is not None and len(members) >= self.cap(members):
            return DispatchReason.FULL
        if members and self.admission.overflows([*members, item]):
            if inner is not None and inner.before_add((), item, now) is DispatchReason.SOLO:
                return DispatchReason.SOLO
            return DispatchReason.TOKENS
        return None if inner is None else inner.before_add(members, item, now)

    def after_add(self, members: Sequence[Job], now: float) -> Due | None:
        """At once if the window holds the cap; else ``inner``'s due time (``None``
        without one: the window's ``max_wait``)."""
        if self.cap is not None and len(members) >= self.cap(members):
            return Due(now, DispatchReason.FULL)
        return None if self.inner is None else self.inner.after_add(members, now)

    def expires_at(self, item: Job) -> float:
        """When ``item``'s caller gives up: its deadline (the dispatcher frees it then if
        its group still waits for a ``max_concurrency`` slot)."""
        return item.deadline

    def expired(self, item: Job, now: float) -> RequestTimeoutError:
        """The error of a caller whose budget ran out before a request slot freed."""
        return RequestTimeoutError(
            f"no answer within the call's {item.budget:g} s latency budget (waited"
            f" {now - item.arrival:.2f} s, all of it in coalesce's queue: its request was"
            " never sent, as max_concurrency requests were in flight); allow more requests"
            " in flight (max_concurrency=), send fewer calls at once (f.map), or raise"
            " latency_budget=",
            seconds=now - item.arrival,
        )

    def __repr__(self) -> str:
        return f"ContextPolicy({self.admission!r}, inner={self.inner!r})"
