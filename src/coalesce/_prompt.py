"""``@coalesce.prompt``: an LLM function whose concurrent calls share one packed prompt.

The decorated function's signature is the item, its return annotation the output
schema and its docstring the shared instructions. This module only translates: the
call's arguments into an item, the decorator's keywords into a
:class:`~coalesce._spec.FunctionSpec` and :class:`~coalesce._spec.Options`; the
:class:`~coalesce._engine.Engine` does the rest (grouping, packing, splitting,
re-asking, planning, statistics).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

import pydantic
import pydantic_core

from ._client import as_provider
from ._engine import Engine
from ._exceptions import ConfigurationError
from ._planning.latency import LatencyPrior
from ._planning.tokens import TokenEstimator
from ._pricing import Price
from ._prompt_stats import EventHook, PromptStatistics
from ._spec import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_WAIT,
    FunctionSpec,
    Options,
)
from ._stats import BatcherStatistics
from ._validate import check_callable

__all__ = ["PromptFunction", "prompt"]

P = ParamSpec("P")
Out = TypeVar("Out")


class PromptFunction(Generic[P, Out]):
    """What ``@coalesce.prompt`` returns: call it like the function it decorates.

    ``await f(*args, **kwargs)`` returns that call's own validated output.
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[Any]],
        engine: Engine,
        partition: Callable[..., Hashable] | None = None,
    ) -> None:
        self._fn = fn
        self._engine = engine
        self._partition = partition
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Out:
        item = await self._item(args, kwargs)
        partition = self._partition(*args, **kwargs) if self._partition is not None else None
        return await self._engine.submit(item, partition=partition)  # type: ignore[no-any-return]

    async def _item(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        produced = await self._fn(*args, **kwargs)
        if produced is not None and produced is not Ellipsis:
            value = produced  # the body formatted its own input
        elif len(bound.arguments) == 1:
            (value,) = bound.arguments.values()
        else:
            value = dict(bound.arguments)
        return pydantic_core.to_jsonable_python(value)

    def statistics(self) -> PromptStatistics:
        """An immutable snapshot: latency and budget, tokens, cost and savings, requests.

        See :class:`~coalesce.PromptStatistics`.
        """
        return self._engine.statistics()

    def batcher_statistics(self) -> BatcherStatistics:
        """The underlying batcher's counters (windows, waits, dispatch reasons)."""
        return self._engine.batcher_statistics()

    async def aclose(self) -> None:
        """Send every pending call now, wait for all of them, refuse new calls."""
        await self._engine.aclose()

    def __repr__(self) -> str:
        return f"<PromptFunction {self._engine!r}>"


def prompt(
    *,
    client: Any,
    model: str,
    instructions: str | None = None,
    max_wait: float = DEFAULT_MAX_WAIT,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    partition: Callable[..., Hashable] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_retries: int = DEFAULT_MAX_RETRIES,
    max_output_tokens: int | None = None,
    stream: bool = True,
    dedupe: bool = False,
    expected_output_tokens: int | None = None,
    latency_prior: LatencyPrior | None = None,
    token_estimator: TokenEstimator | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
    **request_options: Any,
) -> Callable[[Callable[P, Awaitable[Out]]], PromptFunction[P, Out]]:
    """Turn ``async def f(<item params>) -> Out`` into an LLM call that coalesces.

    The docstring (or ``instructions=``) is the shared instruction, sent once per
    request; the call's arguments are the item (one parameter: its value; several: an
    object of those fields; or what the body returns); the return annotation is the
    output type, validated with pydantic. Each option is explained in ``docs/prompt.md``.

    Args:
        client: An ``AsyncOpenAI``, an ``AsyncAnthropic``, a Provider or an async callable.
        model: The model name.
        instructions: The shared instructions (default: the docstring).
        max_wait: Longest a call waits for company, in seconds (default 0.05).
        max_items: Most items per request (default 8).
        max_concurrency: Most requests in flight at once (default: no limit).
        latency_budget: Seconds a caller may wait end to end (default: no budget).
        partition: ``partition(*args, **kwargs) -> key``: different keys never share a prompt.
        max_attempts: Requests that may carry one item, re-asks included (default 4).
        max_retries: Retries of a request that failed as a whole (default 4).
        max_output_tokens: Cap on each reply's tokens (default: the provider's).
        stream: Answer each caller as soon as its own output is streamed (default True).
        dedupe: Identical items in one group share one slot in the prompt.
        expected_output_tokens: Output tokens per item the planner assumes at first.
        latency_prior: The provider's speed the planner assumes at first (LatencyPrior).
        token_estimator: Counts input tokens (``count(text) -> int``; default: tiktoken).
        prices: A Price for ``model``, or a table consulted before the defaults.
        on_event: Called with each call, request, dispatch and retry event.
        **request_options: Passed to the provider unchanged (``temperature=0``...).

    Raises:
        ConfigurationError: A bad option, a sync function, no instructions, or an odd return type.
    """
    options, where = _split_keywords(locals())

    def decorate(fn: Callable[P, Awaitable[Out]]) -> PromptFunction[P, Out]:
        return _decorate(fn, options=options, request_options=request_options, **where)

    return decorate


_OPTION_NAMES = tuple(field.name for field in dataclasses.fields(Options))


def _split_keywords(given: Mapping[str, Any]) -> tuple[Options, dict[str, Any]]:
    """``prompt()``'s keywords: the checked :class:`Options`, and what names the function."""
    options = Options(**{name: given[name] for name in _OPTION_NAMES})
    return options, {name: given[name] for name in ("client", "model", "instructions", "partition")}


def _decorate(
    fn: Callable[P, Awaitable[Out]],
    *,
    client: Any,
    model: Any,
    instructions: str | None,
    options: Options,
    partition: Callable[..., Hashable] | None,
    request_options: Mapping[str, Any],
) -> PromptFunction[P, Out]:
    if not inspect.iscoroutinefunction(fn):
        raise ConfigurationError(f"@coalesce.prompt decorates an async def function, got {fn!r}")
    check_callable("partition", partition)
    if client is None or model is None:
        raise ConfigurationError(
            f"@coalesce.prompt on {fn.__qualname__} needs client= (an AsyncOpenAI, AsyncAnthropic,"
            " Provider or async callable) and model= (the model name)"
        )
    if not isinstance(model, str) or not model:  # (a non-string model is a user error)
        raise ConfigurationError(f"model must be a non-empty string, got {model!r}")
    instructions = instructions or inspect.getdoc(fn)
    if not instructions:
        raise ConfigurationError(
            f"{fn.__qualname__} has no instructions: give it a docstring or instructions="
        )
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(_output_type(fn))
    spec = FunctionSpec(
        name=fn.__qualname__,
        provider=as_provider(client),
        model=model,
        instructions=instructions,
        output_schema=adapter.json_schema(),
        validate=adapter.validate_python,
        request_options=dict(request_options),
    )
    return PromptFunction(fn, Engine(spec, options), partition)


def _output_type(fn: Any) -> Any:
    """The return annotation, resolved (``from __future__ import annotations`` too)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the return annotation of {fn.__qualname__}: {exc}; define the"
            " output type at module level (or import it) so it can be looked up"
        ) from exc
    output = hints.get("return", str)
    if output is Any or output is None or output is type(None):
        return str
    try:
        pydantic.TypeAdapter(output).json_schema()
    except Exception as exc:
        raise ConfigurationError(
            f"the return type of {fn.__qualname__} ({output!r}) cannot be validated and"
            f" described as JSON schema by pydantic: {exc}"
        ) from exc
    return output
