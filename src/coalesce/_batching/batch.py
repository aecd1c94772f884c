"""``@coalesce.batch``: the decorator, and one batcher per instance on methods."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar, overload

from .._exceptions import ConfigurationError
from .batcher import Batcher
from .options import is_async_callable
from .policy import DispatchPolicy, DispatchReason

__all__ = ["BatchMethod", "batch"]

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")


class BatchMethod(Generic[S, T, R]):
    """``@batch`` on a method: each instance gets its own :class:`Batcher`.

    The batcher is created on first access and cached on the instance, so
    ``obj.method(item)`` batches only with calls on the same ``obj``.
    """

    def __init__(self, fn: Callable[[S, list[T]], Awaitable[Sequence[R]]], options: Any) -> None:
        self._fn = fn
        self._options = options
        self._attr = fn.__name__
        functools.update_wrapper(self, fn, updated=())  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> BatchMethod[S, T, R]: ...
    @overload
    def __get__(self, instance: S, owner: type | None = None) -> Batcher[T, R]: ...
    def __get__(self, instance: S | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        try:
            namespace = vars(instance)
        except TypeError:
            raise TypeError(
                f"@coalesce.batch on {type(instance).__name__}.{self._attr} needs instances"
                " with a __dict__ to keep one batcher per instance (the class has __slots__)"
            ) from None
        bound = Batcher(
            functools.partial(self._fn, instance),
            name=f"{type(instance).__name__}.{self._attr}",
            **self._options,
        )
        namespace[self._attr] = bound
        return bound


@overload
def batch(fn: Callable[[list[T]], Awaitable[Sequence[R]]], /) -> Batcher[T, R]: ...
@overload
def batch(fn: Callable[[S, list[T]], Awaitable[Sequence[R]]], /) -> BatchMethod[S, T, R]: ...
@overload
def batch(
    *,
    max_wait: float = ...,
    max_items: int = ...,
    max_concurrency: int | None = ...,
    max_pending: int | None = ...,
    partition: Callable[[Any], Hashable] | None = ...,
    size: Callable[[Any], float] | None = ...,
    max_size: float | None = ...,
    policy: DispatchPolicy[Any] | None = ...,
    on_dispatch: Callable[[DispatchReason, Sequence[Any]], None] | None = ...,
    resolve_early: bool = ...,
) -> _BatchDecorator: ...
def batch(fn: Any = None, /, **options: Any) -> Any:
    """Decorate ``async def f(items: list[T]) -> list[R]`` so that ``await f(item) -> R``.

    Usable bare (``@coalesce.batch``) or with options
    (``@coalesce.batch(max_wait=0.005, max_items=32)``); the options are those of
    :class:`Batcher`. On a method (``async def f(self, items)``), each instance gets
    its own batcher.

    The batch function must return a sequence (a list, a tuple...) of exactly one result
    per item, in the order of the items; anything else (a string, a dict, a set, a
    generator) fails every caller of that batch with :class:`~coalesce.BatchError`, and a
    sequence of the wrong length with :class:`~coalesce.ResultCountError`.

    Args:
        fn: The batch function, when the decorator is bare.
        **options: :class:`Batcher`'s (``max_wait``, ``max_items``, ``partition``...).

    Raises:
        ConfigurationError: If an option is out of range, or the function is not
            ``async def`` (at decoration time); ``UnknownOptionError`` if misspelt.
    """
    if fn is None:
        # Validate now, at decoration time, not on the first call.
        Batcher(_placeholder, **options)
        return _BatchDecorator(options)
    return _decorate(fn, options)


async def _placeholder(items: list[Any]) -> list[Any]:  # pragma: no cover - never called
    return items


def _decorate(fn: Any, options: dict[str, Any]) -> Any:
    if not callable(fn) or not is_async_callable(fn):
        shape = "fn(items, resolve)" if options.get("resolve_early") else "fn(items)"
        raise ConfigurationError(
            f"@coalesce.batch decorates an async function, async def {shape} (or a method"
            f" with self first), got {getattr(fn, '__qualname__', None) or repr(fn)}: define"
            " it with async def"
        )
    # A method takes ``self`` first; an early-resolving function also takes ``resolve``.
    if _positional_arity(fn) == 2 + bool(options.get("resolve_early")):
        Batcher(_placeholder, **options)
        return BatchMethod(fn, options)
    return Batcher(fn, **options)


def _positional_arity(fn: Any) -> int:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is p.empty for p in parameters)


class _BatchDecorator:
    """What ``batch(**options)`` returns: applies those options to a function."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options

    @overload
    def __call__(self, fn: Callable[[list[T]], Awaitable[Sequence[R]]], /) -> Batcher[T, R]: ...
    @overload
    def __call__(
        self, fn: Callable[[S, list[T]], Awaitable[Sequence[R]]], /
    ) -> BatchMethod[S, T, R]: ...
    def __call__(self, fn: Any, /) -> Any:
        return _decorate(fn, self._options)
