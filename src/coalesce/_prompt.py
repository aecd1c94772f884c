"""``@coalesce.prompt``: an LLM function whose concurrent calls share one packed prompt.

The decorated function's signature is the item, its return annotation the output
schema and its docstring the shared instructions. This module only translates: the
call's arguments into an item, the decorator's keywords into a
:class:`~coalesce._engine.spec.FunctionSpec` and :class:`~coalesce._engine.spec.Options`;
the :class:`~coalesce._engine.engine.Engine` does the rest.
"""

from __future__ import annotations

import copy
import difflib
import functools
import inspect
import os
import typing
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

import pydantic

from ._batching.runtime import CARRIED
from ._batching.stats import BatcherStatistics
from ._engine.budget import budget_override
from ._engine.engine import Engine
from ._engine.spec import FunctionSpec, Options
from ._exceptions import ConfigurationError, InvalidInputError
from ._lanes.router import LaneRouter
from ._lanes.store import JobStore
from ._observe.recorder import EventHook, PromptStatistics
from ._options import IN_MEMORY, NOT_GIVEN, LaneChoice, NotGiven, on, refuse_unknown
from ._planning.latency import LatencyPrior
from ._planning.tokens import TokenEstimator
from ._pricing import Price
from ._sync.blocking import Blocking
from ._sync.bulk import MapCall, OnProgress, default_concurrency, spread
from ._sync.progress import ProgressOption
from ._validate import (
    ArgumentTypes,
    bind_arguments,
    check_callable,
    json_path,
    jsonable,
    partition_of,
)
from ._wrap.fleet import through_fleet
from .providers._client import as_provider

__all__ = ["PromptFunction", "prompt"]

P = ParamSpec("P")
Out = TypeVar("Out")

_UNBOUND: Any = object()  # a PromptFunction not accessed through an instance

# A ``latency_budget()`` block follows a call to the loop that answers it.
CARRIED.append(budget_override)


class PromptFunction(Generic[P, Out]):
    """What ``@coalesce.prompt`` returns: call it like the function it decorates.

    ``await f(*args, **kwargs)`` returns that call's own validated output, from any
    event loop or thread: a call made on another loop than the one its batcher serves
    is forwarded there, so the calls of every loop coalesce together. From synchronous
    code, ``f.sync(*args, **kwargs)`` blocks for it (see :attr:`sync`); for many items,
    ``await f.map(items)`` (see :meth:`map`). On a method, ``obj.f(x)`` binds ``obj``
    like a method: ``self`` is passed to the body and to ``partition`` but is not part
    of the item, and every instance shares one engine (one batcher, one set of
    statistics).
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[Any]],
        lanes: LaneRouter,
        partition: Callable[..., Hashable] | None = None,
        types: ArgumentTypes | None = None,
    ) -> None:
        self._fn = fn
        self._lanes = lanes
        self._engine = lanes.engine
        self._partition = partition
        self._signature = inspect.signature(fn)
        self._positional = _positional_names(self._signature)
        self._types = types
        self._instance: Any = _UNBOUND
        functools.update_wrapper(self, fn)

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> PromptFunction[P, Out]: ...
    @overload
    def __get__(
        self, instance: object, owner: type[Any] | None = None
    ) -> PromptFunction[..., Out]: ...
    def __get__(self, instance: object, owner: type[Any] | None = None) -> Any:
        """On an instance: this function bound to it, sharing the engine."""
        if instance is None:
            return self
        bound = copy.copy(self)
        bound._instance = instance
        return bound

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Out:
        if self._instance is not _UNBOUND:
            args = (self._instance, *args)  # type: ignore[assignment]
        item = await self._item(args, kwargs)
        partition = self._key(args, kwargs)
        # The call (its budget, its job) is made on the loop that answers it.
        submit = functools.partial(self._lanes.submit, item, partition=partition)
        answer = self._engine.batcher.run_on_its_loop(submit)
        del item, submit  # nothing of the call but its answer kept while it waits
        return await answer  # type: ignore[no-any-return]

    @property
    def sync(self) -> Blocking[P, Out]:
        """The blocking form, for synchronous code: ``f.sync(*args, **kwargs)`` blocks
        until that call's output; ``f.sync.map(items)`` (a list) and
        ``f.sync.imap(items)`` (pairs as they are ready) take many items, as
        :meth:`map` does; ``f.sync.close()`` is :meth:`aclose`.

        The calls of every thread are served by one background event loop per process,
        where they coalesce. Where an event loop runs in the calling thread (an
        ``async def``, a notebook cell) it raises ``RuntimeError``: ``await f(...)``.
        """
        return Blocking(self, self.map, self.aclose)

    def map(
        self,
        items: Iterable[Any],
        *,
        concurrency: int | None = None,
        ordered: bool = True,
        return_exceptions: bool = True,
        on_progress: OnProgress | None = None,
        progress: ProgressOption = False,
    ) -> MapCall[Out | Exception]:
        """Call once per item: ``await f.map(items)`` is the list of outputs in input
        order; ``async for index, output in f.map(items)`` yields them as they are ready.

        Args:
            items: Each item is the call's argument (for a function of one parameter),
                or else a tuple of positional or a dict of keyword arguments.
            concurrency: Most calls in flight at once (default: the group cap times
                ``max_concurrency``, or times 16 requests without ``max_concurrency``, read
                again as the cap is learned, so that the calls in flight make whole
                groups). Each call starts when a slot frees, so its latency budget counts
                from there.
            ordered: Iteration yields in input order (else as each call finishes).
            return_exceptions: A failed call's exception stands in its place (default);
                ``False``: the first failure is raised and the calls left are cancelled.
            on_progress: ``on_progress(done, total)``, as each call finishes.
            progress: ``True``: a progress bar on standard error when it is a terminal
                (rich's if installed, else a plain line); ``"always"``: drawn anyway.

        Raises:
            ConfigurationError: ``concurrency`` or ``progress`` is invalid.
        """
        listed = list(items)
        engine = self._engine

        def whole_groups() -> int:  # the default, read again as the cap is learned
            return default_concurrency(engine.group_cap(), engine.options.max_concurrency)

        parameters = len(self._signature.parameters) - (self._instance is not _UNBOUND)
        single = parameters == 1

        async def call(index: int) -> Out:
            args, kwargs = spread(listed[index], single=single)
            return await self(*args, **kwargs)

        return MapCall(
            call,
            len(listed),
            concurrency=whole_groups if concurrency is None else concurrency,
            ordered=ordered,
            return_exceptions=return_exceptions,
            on_progress=on_progress,
            progress=progress,
            label=self._engine.spec.name.rsplit("<locals>.", 1)[-1],
        )

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name (without ``self`` on an instance),
        checked against the signature and the annotations.

        Raises:
            TypeError: They do not fit the signature (naming the function and parameter).
            InvalidInputError: One does not validate against its annotation.
        """
        names = self._positional
        if names is not None and not kwargs and len(args) == len(names):
            arguments = dict(zip(names, args, strict=True))  # as binding them would give
        else:
            arguments = self._bound(args, kwargs)
        if self._instance is not _UNBOUND:
            del arguments[next(iter(self._signature.parameters))]  # self is not the item
        if self._types is not None:
            self._check_types(self._types, arguments)
        return arguments

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments bound to the signature, defaults applied."""
        name, shown = self._engine.spec.name, self._signature
        if self._instance is not _UNBOUND:
            parameters = list(self._signature.parameters.values())[1:]
            shown = self._signature.replace(parameters=parameters)
        bound = bind_arguments(self._signature, args, kwargs, name=name, shown=shown)
        return dict(bound.arguments)

    def _check_types(self, types: ArgumentTypes, arguments: dict[str, Any]) -> None:
        """Validate the arguments against their annotations; an argument that also
        cannot be sent as JSON at all (bytes, an arbitrary object) gets that reason,
        which names the fix."""
        single = len(arguments) == 1

        def field(name: str) -> str:
            return "$" if single else json_path("$", name)

        try:
            types.check(arguments, field)
        except InvalidInputError as exc:
            mistyped = exc
        else:
            return
        for name, value in arguments.items():
            self._jsonable(value, field(name), f"argument {name!r}")
        raise mistyped

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        """This call's partition key; a partition function that fails fails this call only."""
        if self._partition is None:
            return None
        return partition_of(self._partition, args, kwargs, receives="the call's arguments")

    async def _item(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call's item as JSON data.

        Raises:
            TypeError: The arguments do not fit the function's signature.
            InvalidInputError: An argument does not validate against its annotation, or
                it (or what the body returned) cannot be sent as JSON; only this call
                fails, before it joins a group.
        """
        arguments = self._arguments(args, kwargs)
        produced = await self._fn(*args, **kwargs)
        if produced is not None and produced is not Ellipsis:
            return self._jsonable(produced, "$", "the value its body returned")
        if len(arguments) == 1:
            ((name, value),) = arguments.items()
            return self._jsonable(value, "$", f"argument {name!r}")
        return {
            name: self._jsonable(value, f"$.{name}", f"argument {name!r}")
            for name, value in arguments.items()
        }

    def _jsonable(self, value: Any, field: str, what: str) -> Any:
        return jsonable(value, field=field, subject=f"{self._engine.spec.name}: {what}")

    def statistics(self) -> PromptStatistics:
        """An immutable snapshot: latency and budget, tokens, cost and savings, requests.

        See :class:`~coalesce.PromptStatistics`.
        """
        return self._engine.statistics()

    def batcher_statistics(self) -> BatcherStatistics:
        """The underlying batcher's counters (windows, waits, dispatch reasons)."""
        return self._engine.batcher.statistics()

    async def aclose(self) -> None:
        """Send every pending call now, wait for all of them, refuse new calls."""
        await self._lanes.aclose()

    def __repr__(self) -> str:
        """Live state: ``<coalesce.prompt tag model='gpt-4o-mini' budget=2s: 412 calls, ...>``."""
        return "<coalesce.prompt " + repr(self._engine).removeprefix("<coalesce.Engine ")


def _positional_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    """The parameters' names when every one may be given by position (and none is
    ``*args``, ``**kwargs`` or keyword-only): a call giving each by position binds
    them in that order. ``None`` otherwise."""
    parameters = signature.parameters.values()
    if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters):
        return tuple(p.name for p in parameters)
    return None


def prompt(
    fn: None = None,  # a bare ``@coalesce.prompt``, refused with how to call it
    /,
    *,
    client: Any = None,
    model: str | None = None,
    instructions: str | None = None,
    max_wait: float | NotGiven = NOT_GIVEN,
    max_items: int | NotGiven = NOT_GIVEN,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    partition: Callable[..., Hashable] | None = None,
    max_attempts: int = 4,
    max_retries: int = 4,
    max_output_tokens: int | None = None,
    stream: bool = True,
    dedupe: bool = False,
    expected_output_tokens: int | None = None,
    latency_prior: LatencyPrior | None = None,
    token_estimator: TokenEstimator | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
    timeout: float | None = None,
    context_window: int | None = None,
    schema_enforced: bool | None = None,
    packing: Literal["auto", "always"] = "auto",
    lane: LaneChoice = "auto",
    store: str | os.PathLike[str] | JobStore | None = None,
    batch_window: float = 60.0,
    batch_client: Any = None,
    poll_interval: float = 60.0,
    shadow: float | NotGiven = NOT_GIVEN,
    min_agreement: float = 0.9,
    agree: Callable[[Any, Any], bool] | None = None,
    vote: bool = False,
    screen: bool | Callable[[Any], bool] = True,
    fleet: str | None = None,
    fleet_creds: str | os.PathLike[str] | None = None,
    fleet_tls_ca: str | os.PathLike[str] | None = None,
    **request_options: Any,
) -> Callable[[Callable[P, Awaitable[Out]]], PromptFunction[P, Out]]:
    """Turn ``async def f(<item>) -> Out`` into a function whose concurrent calls share
    packed prompts: its signature is the item, its return annotation each call's output
    type, its docstring the instructions (see docs/prompt.md for each option at length).

    Args:
        fn: Not given: the options come in parentheses (a bare ``@coalesce.prompt`` raises).
        client: An ``AsyncOpenAI``, ``AsyncAnthropic``, Provider or async callable (required).
        model: The model name (required).
        instructions: The shared instructions, sent once per request (default: the docstring).
        max_wait: Longest a call waits for company, in seconds; not given: 0.05, or a
            quarter of the call's latency budget.
        max_items: Most calls per request; not given: learned per model and function from
            4 up to 32; given, even 4, it pins the cap.
        max_concurrency: Most requests in flight at once (default: no limit).
        latency_budget: Seconds a call may take end to end; groups are sized to finish in it.
        partition: ``partition(*args, **kwargs) -> key``: calls with different keys never
            share a request.
        max_attempts: Requests that may carry one item, re-asks included.
        max_retries: Retries of a request that failed as a whole (429, 5xx, timeouts), by
            coalesce: an SDK client's own are switched off.
        max_output_tokens: Cap on each reply's tokens (default: the provider's).
        stream: Stream replies; answer each caller as soon as its own output is complete.
        dedupe: Identical items in one group share one slot in the prompt.
        expected_output_tokens: Output tokens per item assumed before any reply.
        latency_prior: A :class:`~coalesce.LatencyPrior`: the provider's speed, at first.
        token_estimator: Counts input tokens, ``count(text) -> int`` (default: tiktoken).
        prices: A :class:`~coalesce.Price`, or a table by model, for the cost estimates.
        on_event: Called with each call, request, dispatch and retry event.
        timeout: Longest one request attempt may run, in seconds (default: the budget,
            else the SDK client's timeout, else 60).
        context_window: The model's context window in tokens (default: known models').
        schema_enforced: Whether the provider holds every reply to the schema (default: as
            it declares); if not, streamed answers wait for the whole reply.
        packing: ``"auto"``: pack only where cheaper than plain calls; ``"always"``.
        lane: ``"auto"`` (by each call's budget), ``"realtime"``, ``"flex"`` or ``"batch"``.
        store: The batch lane's job store, a path or a ``JobStore``, with the learned group
            caps beside it (default: ``$COALESCE_STORE``, else the user data directory;
            ``":memory:"``: nothing on disk).
        batch_window: Seconds a call bound for flex or the batch lane waits for others.
        batch_client: The client the deferred lanes send through (default: ``client``).
        poll_interval: The longest wait between two polls of a batch job, in seconds.
        shadow: Share of packed items also asked alone, to check packing; not given: 0.01
            where the cap is learned, else none.
        min_agreement: Agreement of packed and plain answers under which the cap comes down.
        agree: ``agree(a, b) -> bool`` for the shadow guard and the vote (default:
            ``==``, free text compared by its words).
        vote: Ask each packed group in two orders, settling differences with plain calls.
        screen: A call whose item reads like instructions goes alone; ``False``: off; or
            your own ``screen(item) -> bool``.
        fleet: A NATS URL (``nats://host:4222``): each call is sent as its plain request
            through a gateway this process serves, and the calls of every process given
            the same URL coalesce as one there (docs/fleet.md); only the options that
            gateway takes may be given with it (``client``: an OpenAI or Anthropic SDK one).
        fleet_creds: A NATS credentials file the fleet connects with.
        fleet_tls_ca: A CA bundle the fleet's NATS server is verified with (TLS).
        **request_options: Passed to the provider (``temperature=0``...); one that looks
            like a misspelt option raises ``UnknownOptionError``.

    Raises:
        ConfigurationError: An option is out of range, the decorator is bare, or the
            function cannot be asked (not ``async def``, no return annotation...).
    """
    if fn is not None:
        raise _bare(fn)
    given = locals()
    if fleet is not None or fleet_creds is not None or fleet_tls_ca is not None:
        given = _through_fleet(given)
    return _decorator(*_split_keywords(given), request_options)


def _through_fleet(given: dict[str, Any]) -> dict[str, Any]:
    """``prompt(fleet=...)``'s keywords in this process: the client sends through the
    fleet, which coalesces; here each call is its plain request, sent at once."""
    if given["client"] is None:
        raise ConfigurationError(
            "prompt(fleet=...) needs client=, an OpenAI or Anthropic SDK client"
        )
    client = through_fleet(given["client"], given, "prompt")
    alone = {"max_items": 1, "max_wait": NOT_GIVEN, "stream": False, "lane": "realtime"}
    return {**given, **alone, "client": client, "store": IN_MEMORY}


def _bare(fn: object) -> ConfigurationError:
    """The error of ``@coalesce.prompt`` used without parentheses (or given a function)."""
    name = getattr(fn, "__qualname__", repr(fn))
    short = getattr(fn, "__name__", "f")
    return ConfigurationError(
        f"@coalesce.prompt needs its options, in parentheses: it cannot know which client and"
        f" model to ask for {name}. Write @coalesce.prompt(client=openai.AsyncOpenAI(),"
        f' model="gpt-4o-mini") above async def {short}(...) (any AsyncOpenAI or'
        " AsyncAnthropic client, Provider or async callable, and its model name)"
    )


def _decorator(
    options: Options, where: dict[str, Any], request_options: dict[str, Any]
) -> Callable[[Callable[P, Awaitable[Out]]], PromptFunction[P, Out]]:
    return lambda fn: _decorate(fn, options=options, request_options=request_options, **where)


#: Every keyword ``prompt()`` takes itself; anything else is a request option.
_PROMPT_KEYWORDS = tuple(option.name for option in on("prompt"))
#: Request options of the OpenAI and Anthropic APIs, never taken for a misspelling.
_KNOWN_REQUEST_OPTIONS = frozenset(
    {
        *("temperature", "top_p", "top_k", "seed", "user", "metadata", "stop", "n"),
        *("stop_sequences", "logprobs", "top_logprobs", "frequency_penalty"),
        *("presence_penalty", "logit_bias", "max_tokens", "max_completion_tokens"),
        *("reasoning_effort", "service_tier", "store", "parallel_tool_calls", "thinking"),
        *("verbosity", "prompt_cache_key", "safety_identifier"),
        *("extra_headers", "extra_body", "extra_query"),
    }
)


def _check_request_options(request_options: Mapping[str, Any]) -> None:
    """Refuse a keyword that looks like a misspelt coalesce option: unknown keywords go
    to the provider, so ``max_item=8`` would otherwise fail every call in the SDK."""
    suspects = [
        name
        for name in request_options
        if name not in _KNOWN_REQUEST_OPTIONS
        and difflib.get_close_matches(name, _PROMPT_KEYWORDS, n=1, cutoff=0.8)
    ]
    refuse_unknown("coalesce.prompt", suspects, _PROMPT_KEYWORDS, cutoff=0.8)


def _split_keywords(given: Mapping[str, Any]) -> tuple[Options, dict[str, Any]]:
    """``prompt()``'s keywords: the checked :class:`Options`, and what names the function.

    Raises:
        ConfigurationError: An option is out of range, or a request option looks like a
            misspelt option.
    """
    _check_request_options(given["request_options"])
    options = Options.of(given)
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
    hints = _hints(fn)
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(_output_type(fn, hints))
    spec = FunctionSpec(
        name=fn.__qualname__,
        provider=as_provider(client),
        model=model,
        instructions=instructions,
        output_schema=adapter.json_schema(),
        validate=adapter.validate_python,
        request_options=dict(request_options),
    )
    types = ArgumentTypes(inspect.signature(fn), hints, name=fn.__qualname__)
    return PromptFunction(fn, LaneRouter(Engine(spec, options)), partition, types)


def _hints(fn: Any) -> dict[str, Any]:
    """The function's annotations, resolved (``from __future__ import annotations`` too)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the annotations of {fn.__qualname__}: {exc}; define the types"
            " it names at module level (or import them) so they can be looked up"
        ) from exc


def _output_type(fn: Any, hints: Mapping[str, Any]) -> Any:
    """The output type: the return annotation, checked."""
    if "return" not in hints:
        raise ConfigurationError(
            f"{fn.__qualname__} has no return annotation, and it is the type of each call's"
            " output: annotate it -> str for text, or with a model (or another type pydantic"
            " validates) for structured output"
        )
    output = hints["return"]
    if output is None or output is type(None):
        raise ConfigurationError(
            f"{fn.__qualname__} is annotated -> None, but its return annotation is the type"
            " of each call's output: annotate it -> str for text, or with a model (or another"
            " type pydantic validates) for structured output"
        )
    if output is Any:
        return str
    try:
        pydantic.TypeAdapter(output).json_schema()
    except Exception as exc:
        raise ConfigurationError(
            f"the return type of {fn.__qualname__} ({output!r}) cannot be validated and"
            f" described as JSON schema by pydantic: {exc}"
        ) from exc
    return output
