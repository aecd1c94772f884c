"""A batcher's options, checked once, when it is built (or decorates a function).

A bad option raises :class:`~coalesce.ConfigurationError` naming the option, the value
and the range it accepts, before the first call rather than on it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._exceptions import ConfigurationError
from .._options import on
from .policy import DispatchPolicy, DispatchReason, Limits

__all__ = [
    "BatchFunction",
    "BatcherOptions",
    "EarlyBatchFunction",
    "OnDispatch",
    "Resolve",
    "check_options",
    "is_async_callable",
]

T = TypeVar("T")
R = TypeVar("R")

BatchFunction = Callable[[list[T]], Awaitable[Sequence[R]]]
#: Hands the caller at an index its result (or exception) before the batch returns.
Resolve = Callable[[int, Any], None]
EarlyBatchFunction = Callable[[list[T], Resolve], Awaitable[Sequence[R] | None]]
OnDispatch = Callable[[DispatchReason, Sequence[T]], None]


@dataclass(frozen=True)
class BatcherOptions(Generic[T]):
    """A batcher's checked options (see :class:`~coalesce.Batcher` for each).

    Attributes:
        fn: The batch function.
        name: For messages and ``repr``.
        limits: ``max_items``, ``max_wait`` and ``max_size``.
        max_concurrency: Most batches running at once, or ``None``.
        max_pending: Most items accepted and not yet dispatched, or ``None``.
        partition: ``partition(item) -> key``, or ``None``.
        size: ``size(item) -> weight``, or ``None``.
        policy: Consulted before and after each item joins a window, or ``None``.
        on_dispatch: Told of each window dispatched, or ``None``.
        resolve_early: ``fn`` takes ``resolve`` too.
    """

    fn: Any
    name: str
    limits: Limits
    max_concurrency: int | None
    max_pending: int | None
    partition: Callable[[T], Hashable] | None
    size: Callable[[T], float] | None
    policy: DispatchPolicy[T] | None
    on_dispatch: OnDispatch[T] | None
    resolve_early: bool

    @property
    def lean(self) -> bool:
        """Whether joining an open window needs no check at all (the hot path):
        no weights, no room limit and no policy."""
        return self.size is None and self.max_pending is None and self.policy is None


def check_options(fn: Any, given: Mapping[str, Any]) -> BatcherOptions[Any]:
    """The :class:`BatcherOptions` of ``Batcher(fn, **given)``, each option checked as
    :data:`coalesce._options.OPTIONS` says.

    Raises:
        ConfigurationError: An option is out of range, or ``fn`` is not an ``async
            def`` function.
    """
    _check_function(fn, given["size"], given["max_size"])
    for option in on("batch"):
        option.validate(given[option.name])
    kept = ("max_concurrency", "max_pending", "partition", "size", "policy", "on_dispatch")
    return BatcherOptions(
        fn=fn,
        name=given["name"] or getattr(fn, "__qualname__", None) or repr(fn),
        limits=Limits(given["max_items"], float(given["max_wait"]), given["max_size"]),
        resolve_early=bool(given["resolve_early"]),
        **{name: given[name] for name in kept},
    )


def _check_function(fn: Any, size: Any, max_size: Any) -> None:
    if not callable(fn):
        raise ConfigurationError(f"the batch function must be callable, got {fn!r}")
    if not is_async_callable(fn):
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise ConfigurationError(
            f"the batch function {name} is not async: define it with async def (a batch"
            " runs in the event loop, and a blocking function would stall every caller)"
        )
    if (size is None) != (max_size is None):
        raise ConfigurationError(
            "size and max_size go together: give both (an item's weight and the most"
            f" per batch) or neither; got size={size!r}, max_size={max_size!r}"
        )


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` may return an awaitable: not a plain ``def`` function.

    An ``async def`` function (partials and bound methods included), an object with an
    ``async def __call__``, and anything that is not a Python function (it cannot be
    inspected, and may well return an awaitable) pass; a plain ``def`` function, or an
    async generator function, does not. A sync wrapper of an ``async def`` function (one
    that sets ``__wrapped__``, as ``functools.wraps`` does) passes too.
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    call: Any = target if inspect.isroutine(target) else getattr(type(target), "__call__", None)  # noqa: B004
    if call is None or inspect.iscoroutinefunction(call):
        return True
    if inspect.iscoroutinefunction(inspect.unwrap(call)):
        return True
    return not (inspect.isfunction(call) or inspect.ismethod(call))
