"""A call's latency budget: its own, else a ``coalesce.latency_budget()`` block's, else
its function's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .._validate import check_seconds

__all__ = ["budget_of", "budget_override", "latency_budget"]

budget_override: ContextVar[float | None] = ContextVar("coalesce_latency_budget", default=None)


@contextmanager
def latency_budget(seconds: float | None) -> Iterator[None]:
    """Override the latency budget of the ``coalesce.prompt`` and ``coalesce.wrap`` calls
    made inside.

    ``with coalesce.latency_budget(0.5): await tag(ticket)`` gives that call 0.5 s,
    keeping the function's signature untouched. ``None`` restores each function's own
    budget. The budget sizes the call's wait for company and its group whether or not
    its function declared one.

    Args:
        seconds: The calls' budget, in seconds; ``None``: each function's own.

    Raises:
        ConfigurationError: If ``seconds`` is not a positive number or None.
    """
    value = check_seconds("latency_budget", seconds, positive=True, optional=True)
    token = budget_override.set(value)
    try:
        yield
    finally:
        budget_override.reset(token)


def budget_of(given: float | None, default: float | None) -> float | None:
    """A call's budget: ``given``, else the :func:`latency_budget` block's, else
    ``default`` (its function's ``latency_budget``)."""
    if given is None:
        given = budget_override.get()
    return default if given is None else given
