"""``coalesce.wrap(client)``: an ``AsyncOpenAI`` / ``AsyncAnthropic`` that coalesces.

The wrapper has the client's interface; only ``chat.completions.create`` and
``.parse`` (OpenAI, also under ``beta``) and ``messages.create`` and ``.parse``
(Anthropic) are intercepted. A compatible call (see :mod:`coalesce._wrap.plan`, and
:mod:`coalesce._wrap.parse` for ``parse``) becomes one call of an
:class:`~coalesce._engine.engine.Engine`, one engine per kind of call (same model, instructions and options); its caller gets
a genuine SDK response (:mod:`coalesce._wrap.replies`) whose content is its own answer
and whose usage is its share, charged by the engine's
:class:`~coalesce._observe.listeners.UsageShares` listener. Anything else goes to the real
client. Calls in different partitions (:func:`partition_key`: the client's
``partition=`` function and the call's ``x-coalesce-partition`` header) never share a
request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeVar, cast

import anyio
import pydantic_core

from .._calls import Job
from .._engine.admission import check_item
from .._engine.engine import Engine
from .._engine.spec import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_WAIT,
    FunctionSpec,
    Options,
)
from .._exceptions import ConfigurationError, InvalidInputError, TruncatedOutputError
from .._observe.listeners import UsageShares
from .._observe.recorder import EventHook, PromptRecorder, PromptStatistics
from .._planning.latency import LatencyPrior
from .._pricing import Price
from .._validate import check_callable
from ..providers import AnthropicProvider, OpenAIProvider, Provider
from ..providers._client import as_provider
from .parse import (
    anthropic_parse_plan,
    anthropic_parsed,
    openai_length_error,
    openai_parse_plan,
    openai_parsed,
)
from .plan import Plan, anthropic_plan, coalesce_headers, given_arguments, openai_plan
from .replies import anthropic_response, anthropic_stream, openai_response, openai_stream

__all__ = ["CoalescedClient", "Partition", "partition_key", "wrap"]

C = TypeVar("C")
Respond = Callable[[Any, Job, Plan], Any]
RespondStreamed = Callable[[Any, Job, Plan, anyio.Event], Any]
#: ``partition(kwargs) -> key``: calls with different keys never share a prompt.
Partition = Callable[[Mapping[str, Any]], Hashable]


def _validator(schema: Mapping[str, Any] | None) -> Callable[[Any], Any]:
    """A light check: text for no schema, the JSON type the schema names otherwise."""
    kinds: dict[str, tuple[type, ...]] = {
        "object": (dict,),
        "array": (list,),
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "boolean": (bool,),
    }
    expected = kinds.get(str(schema.get("type"))) if schema is not None else (str,)

    def validate(value: Any) -> Any:
        if expected is not None and not isinstance(value, expected):
            raise ValueError(f"expected {expected[0].__name__}, got {type(value).__name__}")
        return value

    return validate


class _Engines:
    """One engine per kind of call; one recorder per model; usage shares for all."""

    def __init__(self, provider: Provider, options: Options) -> None:
        self._provider = provider
        self._options = options
        self._engines: dict[str, Engine] = {}
        self._recorders: dict[str, PromptRecorder] = {}
        self._shares = UsageShares()

    def engine(self, plan: Plan) -> Engine:
        """The engine serving calls like ``plan``."""
        engine = self._engines.get(plan.key)
        if engine is None:
            spec = FunctionSpec(
                name=f"wrap:{plan.model}",
                provider=self._provider,
                model=plan.model,
                instructions=plan.instructions,
                output_schema=plan.output_schema or {"type": "string"},
                validate=_validator(plan.output_schema),
                request_options=dict(plan.options),
            )
            recorder = self._recorder(plan.model)
            engine = Engine(
                spec, self._options_for(plan), recorder=recorder, observers=[self._shares]
            )
            self._engines[plan.key] = engine
        return engine

    def _options_for(self, plan: Plan) -> Options:
        cap = None if plan.item_cap is None else plan.item_cap * self._options.max_items
        if self._options.max_output_tokens is not None:
            cap = (
                self._options.max_output_tokens
                if cap is None
                else min(cap, self._options.max_output_tokens)
            )
        # Streamed callers get their answer as the split finds it; the others wait for
        # the whole reply anyway (their usage share needs it).
        return self._options.replace(max_output_tokens=cap, stream=plan.stream)

    def _recorder(self, model: str) -> PromptRecorder:
        recorder = self._recorders.get(model)
        if recorder is None:
            o = self._options
            recorder = PromptRecorder(f"wrap:{model}", model, prices=o.prices, on_event=o.on_event)
            self._recorders[model] = recorder
        return recorder

    def statistics(self) -> dict[str, PromptStatistics]:
        return {model: recorder.snapshot() for model, recorder in self._recorders.items()}

    async def answer(self, plan: Plan, partition: Hashable = None) -> tuple[Any, Job, anyio.Event]:
        """Await ``plan``'s own answer; the job carries its usage share and reply, the
        event is set once that share is final. Calls of different ``partition`` never
        share a request."""
        engine = self.engine(plan)
        job = engine.new_job(plan.item, budget=plan.budget, partition=partition)
        finished = self._shares.finished(job)
        try:
            value = await engine.answer(job)
        except BaseException:
            self._shares.forget(job)
            raise
        return value, job, finished

    async def aclose(self) -> None:
        for engine in list(self._engines.values()):
            await engine.aclose()


def _check_sendable(given: Mapping[str, Any]) -> None:
    """Refuse a call whose messages hold what JSON cannot carry (NaN, bytes, objects),
    with the field named, before it is grouped or passed through."""
    sent = {name: given[name] for name in ("messages", "system") if name in given}
    try:
        # The SDKs take pydantic models (an earlier reply's message) and bytes as well.
        check_item(pydantic_core.to_jsonable_python(sent))
    except (pydantic_core.PydanticSerializationError, UnicodeDecodeError) as exc:
        raise InvalidInputError(
            f"this call's messages cannot be sent: {exc}; pass text (str) or the SDK's"
            " content parts"
        ) from None


class _Proxy:
    """Delegates every attribute to ``target`` except those in ``own``."""

    def __init__(self, target: Any, own: Mapping[str, Any]) -> None:
        self._target = target
        self._own = dict(own)

    def __getattr__(self, name: str) -> Any:
        own = self.__dict__.get("_own", {})
        if name in own:
            return own[name]
        return getattr(self.__dict__["_target"], name)

    def __repr__(self) -> str:
        return f"<coalesced {self._target!r}>"


class CoalescedClient(_Proxy):
    """What :func:`wrap` returns: the client, with coalescing ``create`` and ``parse``.

    Every attribute but ``chat.completions.create`` / ``.parse`` (OpenAI, and the same
    under ``beta.chat.completions``) and ``messages.create`` / ``.parse`` (Anthropic) is
    the wrapped client's own.
    """

    def __init__(
        self, client: Any, kind: str, engines: _Engines, partition: Partition | None = None
    ) -> None:
        self._engines = engines
        self._partition = partition
        if kind == "openai":
            own = self._openai_resources(client)
        else:
            own = {"messages": self._anthropic_messages(client.messages)}
        super().__init__(client, {**own, "close": self.aclose})

    def _openai_resources(self, client: Any) -> dict[str, Any]:
        own = {"chat": self._openai_chat(client.chat)}
        beta: Any = getattr(client, "beta", None)
        if getattr(beta, "chat", None) is not None:
            own["beta"] = _Proxy(beta, {"chat": self._openai_chat(beta.chat)})
        return own

    def _openai_chat(self, chat: Any) -> _Proxy:
        completions = chat.completions
        create, parse = completions.create, _method(completions, "parse")

        async def coalesced_create(**kwargs: Any) -> Any:
            return await self._route(kwargs, openai_plan, (openai_response, openai_stream), create)

        async def coalesced_parse(**kwargs: Any) -> Any:
            respond = openai_parsed(given_arguments(kwargs).get("response_format"))
            try:
                # parse() never streams: its planner passes stream= through.
                return await self._route(kwargs, openai_parse_plan, (respond, openai_stream), parse)
            except TruncatedOutputError as exc:
                raise openai_length_error(exc, str(kwargs.get("model"))) from exc

        own = {"create": coalesced_create, "parse": coalesced_parse}
        return _Proxy(chat, {"completions": _Proxy(completions, _present(completions, own))})

    def _anthropic_messages(self, messages: Any) -> _Proxy:
        create, parse = messages.create, _method(messages, "parse")
        streamed: tuple[Respond, RespondStreamed] = (anthropic_response, anthropic_stream)

        async def coalesced_create(**kwargs: Any) -> Any:
            return await self._route(kwargs, anthropic_plan, streamed, create)

        async def coalesced_parse(**kwargs: Any) -> Any:
            respond = anthropic_parsed(given_arguments(kwargs).get("output_format"))
            return await self._route(kwargs, anthropic_parse_plan, (respond, streamed[1]), parse)

        own = {"create": coalesced_create, "parse": coalesced_parse}
        return _Proxy(messages, _present(messages, own))

    async def _route(
        self,
        kwargs: dict[str, Any],
        planner: Callable[[Mapping[str, Any], float | None], Plan | None],
        respond: tuple[Respond, RespondStreamed],
        send: Callable[..., Awaitable[Any]],
    ) -> Any:
        cleaned, headers = coalesce_headers(kwargs)
        given = given_arguments(cleaned)
        if headers.coalesce:
            _check_sendable(given)
        plan = planner(given, headers.budget) if headers.coalesce else None
        if plan is None or self._engines.engine(plan).pays_from is None:
            return await send(**cleaned)  # not coalescible, or packing cannot pay
        key = partition_key(self._partition, kwargs, headers.partition)
        value, job, finished = await self._engines.answer(plan, key)
        whole, streamed = respond
        return streamed(value, job, plan, finished) if plan.stream else whole(value, job, plan)

    def statistics(self) -> dict[str, PromptStatistics]:
        """Immutable snapshots of the coalesced calls, one per model.

        See :class:`~coalesce.PromptStatistics`: latency and budget, tokens, cost and
        savings, requests. Calls passed through to the client are not counted.
        ``wrap`` is typed as the client it wraps; reach this with
        ``typing.cast(coalesce.CoalescedClient, client).statistics()``.
        """
        return self._engines.statistics()

    async def aclose(self) -> None:
        """Send pending calls now, wait for them, then close the wrapped client.

        ``await wrapped.close()`` does the same.
        """
        await self._engines.aclose()
        await self._target.close()

    async def __aenter__(self) -> CoalescedClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _method(resource: Any, name: str) -> Any:
    """``resource.name``, or ``None`` where this SDK's resource has none."""
    return getattr(resource, name, None)


def _present(resource: Any, methods: Mapping[str, Any]) -> dict[str, Any]:
    """Those of ``methods`` the SDK resource has (``parse`` is missing from older SDKs)."""
    return {name: method for name, method in methods.items() if hasattr(resource, name)}


def partition_key(
    partition: Partition | None, kwargs: Mapping[str, Any], header: str | None
) -> Hashable:
    """The batcher's partition of one call: its ``x-coalesce-partition`` header and
    what ``partition`` says of its keyword arguments (``None``: the shared partition).

    Args:
        partition: The client's partition function, if any.
        kwargs: The call's keyword arguments, as the caller gave them.
        header: The call's ``x-coalesce-partition`` header, if any.

    Raises:
        ConfigurationError: ``partition`` raised, or returned an unhashable value.
    """
    if partition is None:
        return None if header is None else (header, None)
    name = getattr(partition, "__qualname__", repr(partition))
    try:
        key = partition(MappingProxyType(given_arguments(kwargs)))
    except Exception as exc:
        raise ConfigurationError(
            f"the partition function {name} raised {exc!r} for this call; it receives the"
            " call's keyword arguments (a read-only mapping) and must return a hashable key"
        ) from exc
    try:
        hash(key)
    except TypeError as exc:
        raise ConfigurationError(
            f"the partition function {name} returned {key!r}, which is not hashable; return"
            " a str, an int or a tuple of them"
        ) from exc
    return (header, key)


def _kind(client: Any) -> tuple[Provider, str]:
    """The provider of an async OpenAI or Anthropic client, and which SDK it is."""
    if isinstance(client, CoalescedClient):
        raise ConfigurationError(
            f"{client!r} is already wrapped by coalesce.wrap; wrap the SDK client once"
        )
    base = as_provider(client)  # raises ConfigurationError for anything else
    if isinstance(base, (OpenAIProvider, AnthropicProvider)):
        return base, "openai" if isinstance(base, OpenAIProvider) else "anthropic"
    raise ConfigurationError(
        f"coalesce.wrap takes an openai.AsyncOpenAI or an anthropic.AsyncAnthropic, got {client!r}"
    )


_OPTION_NAMES = (
    "shadow",
    "min_agreement",
    "agree",
    "max_wait",
    "max_items",
    "max_concurrency",
    "latency_budget",
    "max_attempts",
    "max_output_tokens",
    "timeout",
    "context_window",
    "schema_enforced",
    "packing",
    "latency_prior",
    "prices",
    "on_event",
)


def _options(client: Any, given: Mapping[str, Any]) -> Options:
    """``wrap()``'s keywords as checked :class:`Options`; retries default to the client's."""
    retries = given["max_retries"]
    if retries is None:
        retries = int(getattr(client, "max_retries", 2))
    return Options(
        **{name: given[name] for name in _OPTION_NAMES}, max_retries=retries, lane="realtime"
    )


def wrap(
    client: C,
    *,
    max_wait: float = DEFAULT_MAX_WAIT,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    partition: Partition | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_retries: int | None = None,
    max_output_tokens: int | None = None,
    timeout: float | None = None,
    context_window: int | None = None,
    schema_enforced: bool | None = None,
    packing: Literal["auto", "always"] = "auto",
    latency_prior: LatencyPrior | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
    shadow: float = 0.0,
    min_agreement: float = 0.9,
    agree: Callable[[Any, Any], bool] | None = None,
) -> C:
    """Wrap an ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic`` so compatible calls coalesce.

    The result is typed as the client: code written for the client runs unchanged.

    Args:
        client: The SDK client. (``max_wait``: longest wait for company, 0.05 s.)
        max_items: Most items per request (default 4).
        max_concurrency: Most coalesced requests in flight at once (default: no limit).
        latency_budget: Seconds a coalesced call may wait end to end (default: none).
        partition: ``partition(kwargs) -> key``, called with each coalesced call's
            keyword arguments (a read-only mapping): calls with different keys never
            share a prompt (see ``docs/isolation.md``).
        max_attempts: (and ``max_retries``) Requests that may carry one item, re-asks included
            (default 4); retries of a failed request (default: the client's).
        max_output_tokens: Cap on a packed reply's tokens (default: each call's own cap
            times ``max_items``, or the provider's default).
        timeout: Longest one request attempt may run, in s (default: the budget, or 60).
        context_window: The model's context window in tokens (default: known, or learned).
        schema_enforced: Whether the provider holds every reply to the reply schema
            (default: as the provider declares); if not, streamed answers are held
            until the reply can no longer contradict them.
        packing: ``"auto"`` coalesces a kind of call only where a packed request costs
            less than plain calls (otherwise the calls pass through to the client,
            unchanged); ``"always"`` packs every group of two or more.
        latency_prior: (and ``prices``) What the planner assumes of the provider before measuring
            it; prices for the statistics' cost estimates (see :func:`~coalesce.price_for`).
        on_event: Called with each call, request, dispatch and retry event.
        shadow: (and ``min_agreement``, ``agree``) Fraction of packed items also asked alone (0); the
            agreement under which the group cap comes down (0.9); ``agree(a, b)`` (``==``).

    Raises:
        ConfigurationError: ``client`` is not an async OpenAI or Anthropic client (or is
            already wrapped), ``partition`` is not callable, or an option is out of range.
    """
    provider, kind = _kind(client)
    options = _options(client, locals())
    check_callable("partition", partition)
    return cast(C, CoalescedClient(client, kind, _Engines(provider, options), partition))
