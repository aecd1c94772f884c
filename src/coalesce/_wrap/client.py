"""``coalesce.wrap(client)``: an ``AsyncOpenAI`` / ``AsyncAnthropic`` that coalesces.

The wrapper has the client's interface; only the SDK methods in
:data:`~coalesce._wrap.registry.TRANSLATORS` are intercepted (today
``chat.completions.create`` and ``.parse``, also under ``beta``, and
``messages.create`` and ``.parse``). Each has a :class:`~coalesce._wrap.translator.Translator`:
a call it can read becomes one call of an :class:`~coalesce._engine.engine.Engine`
(:class:`~coalesce._wrap.engines.Engines`: one engine per kind of call), and its caller
gets the SDK's own object, whose content is its own answer and whose usage is its
share. Anything else goes to the real client. Calls in different partitions
(:func:`~coalesce._wrap.partition.partition_key`: the client's ``partition=`` function
and the call's ``x-coalesce-partition`` header) never share a request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar, cast

import pydantic_core

from .._defaults import (
    MAX_ATTEMPTS,
    MIN_AGREEMENT,
    PACKING,
    PROMPT_MAX_ITEMS,
    PROMPT_MAX_WAIT,
    SHADOW,
)
from .._engine.spec import Options
from .._exceptions import ConfigurationError, InvalidInputError
from .._observe.recorder import EventHook, PromptStatistics
from .._planning.latency import LatencyPrior
from .._pricing import Price
from .._validate import check_item
from ..providers import AnthropicProvider, OpenAIProvider, Provider
from ..providers._client import as_provider, retries_for
from .call import given_arguments
from .engines import Engines
from .headers import coalesce_headers
from .partition import Partition, PartitionFunction, partition_function, partition_key
from .proxy import Proxy, overlay
from .registry import TRANSLATORS
from .translator import Translator

__all__ = ["CoalescedClient", "wrap"]

C = TypeVar("C")
Send = Callable[..., Awaitable[Any]]


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


class CoalescedClient(Proxy):
    """What :func:`wrap` returns: the client, with coalescing ``create`` and ``parse``.

    Every attribute but the methods of :data:`~coalesce._wrap.registry.TRANSLATORS`
    (``chat.completions.create`` / ``.parse``, and the same under
    ``beta.chat.completions``, for OpenAI; ``messages.create`` / ``.parse`` for
    Anthropic) is the wrapped client's own.
    """

    def __init__(
        self,
        client: Any,
        kind: str,
        engines: Engines,
        partition: PartitionFunction | None = None,
    ) -> None:
        self._engines = engines
        self._partition = partition
        methods = {
            path: self._intercept(translator) for path, translator in TRANSLATORS[kind].items()
        }
        super().__init__(client, {**overlay(client, methods), "close": self.aclose})

    def _intercept(self, translator: Translator) -> Callable[[Send], Send]:
        """Given the SDK's own method, the method that coalesces through ``translator``."""

        def replace(send: Send) -> Send:
            async def coalesced(**kwargs: Any) -> Any:
                return await self._dispatch(translator, send, kwargs)

            return coalesced

        return replace

    async def _dispatch(self, translator: Translator, send: Send, kwargs: dict[str, Any]) -> Any:
        """One intercepted call: to the engine when ``translator`` reads it and packing
        pays, to the SDK's own method ``send`` otherwise."""
        cleaned, headers = coalesce_headers(kwargs)
        if not headers.coalesce:
            return await send(**cleaned)
        given = given_arguments(cleaned)
        _check_sendable(given)
        call = translator.read(given)
        if call is None or self._engines.engine(call).pays_from is None:
            return await send(**cleaned)  # not coalescible, or packing cannot pay
        key = partition_key(self._partition, kwargs, headers.partition)
        try:
            answer = await self._engines.answer(call, headers.budget, key)
        except Exception as exc:
            error = translator.error(exc, given)
            if error is exc:
                raise
            raise error from exc
        return translator.reply(answer, given)

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
    """``wrap()``'s keywords as checked :class:`Options` (retries: see
    :func:`~coalesce.providers._client.retries_for`)."""
    retries = retries_for(client, given["max_retries"])
    return Options(
        **{name: given[name] for name in _OPTION_NAMES}, max_retries=retries, lane="realtime"
    )


def wrap(
    client: C,
    *,
    max_wait: float = PROMPT_MAX_WAIT,
    max_items: int = PROMPT_MAX_ITEMS,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    partition: Partition | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    max_retries: int | None = None,
    max_output_tokens: int | None = None,
    timeout: float | None = None,
    context_window: int | None = None,
    schema_enforced: bool | None = None,
    packing: Literal["auto", "always"] = PACKING,
    latency_prior: LatencyPrior | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
    shadow: float = SHADOW,
    min_agreement: float = MIN_AGREEMENT,
    agree: Callable[[Any, Any], bool] | None = None,
) -> C:
    """Wrap an ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic`` so compatible calls coalesce.

    The result is typed as the client: code written for the client runs unchanged.

    Args:
        client: The SDK client. (``max_wait``: longest wait for company, 0.05 s.)
        max_items: Most items per request (default 4).
        max_concurrency: Most coalesced requests in flight at once (default: no limit).
        latency_budget: Seconds a coalesced call may wait end to end (default: none).
        partition: ``partition(**kwargs) -> key``, called with each coalesced call's
            keyword arguments: calls with different keys never share a prompt (see
            ``docs/isolation.md``; ``partition(kwargs)``, one mapping, is deprecated).
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
    by = partition_function(partition)
    return cast(C, CoalescedClient(client, kind, Engines(provider, options), by))
