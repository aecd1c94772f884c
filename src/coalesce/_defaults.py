"""Every default of the public options, in one table (httpx keeps its in ``_config.py``).

An option that defaults differently on two entry points has one name per entry point
(``BATCH_MAX_WAIT`` for :class:`~coalesce.Batcher` and ``@coalesce.batch``,
``PROMPT_MAX_WAIT`` for ``@coalesce.prompt`` and ``coalesce.wrap``), so that no name
means two numbers. The signatures and the docs read their defaults from here.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BATCH_MAX_ITEMS",
    "BATCH_MAX_WAIT",
    "BATCH_WINDOW",
    "BUDGET_WAIT_SHARE",
    "LANE",
    "LEARNED_CAP_CEILING",
    "MAX_ATTEMPTS",
    "MAX_RETRIES",
    "MIN_AGREEMENT",
    "PACKING",
    "POLL_INTERVAL",
    "PROMPT_MAX_ITEMS",
    "PROMPT_MAX_WAIT",
    "REQUEST_TIMEOUT",
    "SHADOW",
    "LearningRate",
    "SafeCap",
    "WindowDefault",
    "cap_given",
    "shadow_given",
    "wait_for_company",
]

# -- the generic micro-batcher: Batcher and @coalesce.batch ---------------------------

#: A 10 ms window: a small, bounded wait added to each call for the chance to
#: share a batch's fixed cost (a query, a model's forward pass).
BATCH_MAX_WAIT = 0.01
#: 64 items: large enough to amortise a batch's fixed cost, small enough that one
#: batch's failure or latency touches few callers.
BATCH_MAX_ITEMS = 64

# -- LLM calls: @coalesce.prompt and coalesce.wrap ------------------------------------


class WindowDefault(float):
    """The default ``max_wait``: a ``float`` (the window without a latency budget) that
    says it was not given, so that a declared budget sets the window instead
    (:func:`wait_for_company`). Any ``float`` the caller passes, ``0.05`` included, is
    the window whatever the budget."""

    def __repr__(self) -> str:
        return str(float(self))


#: A 50 ms window bounds the wait added to an LLM call that itself takes seconds,
#: where no latency budget says how much waiting the caller accepts.
PROMPT_MAX_WAIT: Final = WindowDefault(0.05)
#: With a latency budget and ``max_wait`` left at its default, a call waits for company
#: at most a quarter of its budget (0.5 s of a 2 s budget). The planner still sends a
#: group earlier when waiting longer would make a member late, and a full group goes at
#: once. Measured (bench_cap, 100 calls/s, 2 s budget, the cap learned): 0.05 s windows
#: hold 5-6 calls, 0.28x of plain calls' prompt tokens; a quarter of the budget, 7
#: calls (as many as the budget allows), 0.249x, 100% within budget. A larger share
#: leaves the reply too little of the budget at low rates.
BUDGET_WAIT_SHARE = 0.25


def wait_for_company(max_wait: float, latency_budget: float | None) -> float:
    """The window: ``max_wait`` as given; left at its default, a quarter of the latency
    budget (:data:`BUDGET_WAIT_SHARE`) when there is one, else :data:`PROMPT_MAX_WAIT`."""
    if isinstance(max_wait, WindowDefault) and latency_budget is not None:
        return latency_budget * BUDGET_WAIT_SHARE
    return float(max_wait)


class SafeCap(int):
    """The default ``max_items``: an ``int`` (the cap learning starts from) that says
    it was not given, so that the cap is learned (:func:`cap_given`). Any ``int`` the
    caller passes, ``4`` included, pins the cap instead."""

    def __repr__(self) -> str:
        return str(int(self))


def cap_given(max_items: int) -> bool:
    """Whether ``max_items`` was given (it pins the group cap) rather than left at
    :data:`PROMPT_MAX_ITEMS` (the cap is learned from there)."""
    return not isinstance(max_items, SafeCap)


#: Group size is an accuracy decision as well as a latency one: small models lose
#: accuracy as more items share a prompt, hosted ones far less (about single-call
#: accuracy at 4-6 items). Measured here (docs/accuracy.md), 4 is the largest group
#: that stays near plain calls for labels and extracted values alike; 8 is worse.
#: Left at this default, the cap starts here and is learned per model and function
#: (``shadow=``, docs/accuracy.md); given, it pins the cap.
PROMPT_MAX_ITEMS: Final = SafeCap(4)
#: The most items a learned cap reaches: published measurements find hosted models
#: about as accurate as single calls up to 6-32 items (Cheng et al. 2023; BatchPrompt,
#: batch 32), and a 2 s budget rarely fits a larger group's answers.
LEARNED_CAP_CEILING = 32
#: Requests that may carry one item, re-asks included: a missing or invalid answer
#: is asked again, but a bounded number of times, so one poison item costs little.
MAX_ATTEMPTS = 4
#: Retries of a request that failed as a whole (429, 5xx, timeouts, dropped
#: connections), after the first attempt; never past the callers' budget. Only
#: ``@coalesce.prompt`` has it: ``coalesce.wrap`` defaults to the client's own setting.
MAX_RETRIES = 4
#: Longest one request attempt may run when no latency budget bounds it (a budget does).
REQUEST_TIMEOUT = 60.0
#: Pack a group only where packed it costs less than its members as plain calls.
PACKING: Final = "auto"
#: The cheapest lane each call's latency budget allows (real time without a budget).
LANE: Final = "auto"
#: Seconds a deferred (batch or flex lane) call waits for others: a minute of calls
#: shares one job, and a minute is nothing next to a batch job's 24 h window.
BATCH_WINDOW = 60.0
#: The longest wait, in seconds, between two polls of a batch-lane job (polls start at
#: 5 s and grow by half each time up to it).
POLL_INTERVAL = 60.0


class LearningRate(float):
    """The default ``shadow``: a ``float`` that says it was not given. It serves the
    learning of the group cap, so it applies only where the cap is learned (``max_items``
    not given); given, ``shadow=`` applies to every function (see :func:`shadow_given`)."""

    def __repr__(self) -> str:
        return str(float(self))


def shadow_given(shadow: float) -> bool:
    """Whether ``shadow`` was given rather than left at :data:`SHADOW`."""
    return not isinstance(shadow, LearningRate)


#: 1% of packed items asked again alone, in the long run, where the cap is learned:
#: each costs a plain call, so at a learned cap's ~0.24x of plain calls' prompt tokens
#: (MEASUREMENTS: max_items=16 at 100 calls/s, 2 s budget) it adds about 0.01x, and at
#: 100 calls/s it still judges a size within a minute. Learning the cap shadows more,
#: for a bounded while (``_accuracy/learning.py``). With ``max_items`` given and no
#: ``shadow=``, nothing is shadowed, as before.
SHADOW: Final = LearningRate(0.01)
#: Packed and plain answers must agree on 90% of shadowed items, else the group
#: cap comes down.
MIN_AGREEMENT = 0.9
