"""``coalesce.wrap(client)``: an ``AsyncOpenAI`` / ``AsyncAnthropic`` that coalesces.

The wrapped client is an instance of the client's own class (a subclass made once per
SDK class, :func:`~coalesce._wrap.proxy.coalesced_class`) holding the client's state,
so frameworks that check ``isinstance(client, openai.AsyncOpenAI)`` take it. Only
the SDK methods in :data:`~coalesce._wrap.registry.TRANSLATORS` are replaced (today
``chat.completions.create`` and ``.parse``, also under ``beta``, and
``messages.create`` and ``.parse``), and with them their ``with_raw_response`` and
``with_streaming_response`` forms. Each has a
:class:`~coalesce._wrap.translator.Translator`: a call it can read becomes one call of
an :class:`~coalesce._engine.engine.Engine` (:class:`~coalesce._wrap.engines.Engines`:
one engine per kind of call), and its caller gets the SDK's own object, whose content
is its own answer and whose usage is its share (or the SDK's raw response around it,
:mod:`~coalesce._wrap.raw`). Anything else goes to the SDK. Calls in different
partitions (:func:`~coalesce._wrap.partition.partition_key`: the client's
``partition=`` function and the call's ``x-coalesce-partition`` header) never share a
request; ``with_options()`` and ``copy()`` give a client that shares the engines, and
one with other credentials sends through a copy of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import anyio
import pydantic_core

from .._batching.runtime import current_time
from .._engine.spec import Lane, Options
from .._exceptions import ConfigurationError, InvalidInputError
from .._lanes.store import JobStore
from .._observe.recorder import EventHook, PromptStatistics
from .._options import NOT_GIVEN, LaneChoice, NotGiven, refuses_unknown
from .._planning.latency import LatencyPrior
from .._pricing import Price
from .._validate import check_item
from ..providers import AnthropicProvider, OpenAIProvider, Provider
from ..providers._client import as_provider, retries_for
from .call import SdkCall, given_arguments
from .credentials import credentials_key
from .engines import Answered, Engines
from .fleet import through_fleet
from .headers import LANE_HEADER, CallHeaders, coalesce_headers
from .openai_chat import posted_create
from .partition import Partition, PartitionFunction, partition_function, partition_key
from .proxy import Replace, coalesced_copy, replace_methods
from .raw import call_limit, raw_mode, raw_response, timeout_error
from .registry import TRANSLATORS, Endpoint, endpoint_of
from .sync_client import async_twin, sync_coalesced
from .translator import Translator

__all__ = ["CoalescedClient", "wrap"]

C = TypeVar("C")
Send = Callable[..., Awaitable[Any]]


def _check_sendable(given: Mapping[str, Any]) -> None:
    """Refuse a call whose messages hold what JSON cannot carry (NaN, bytes, objects),
    with the field named, before it is grouped or passed through."""
    sent = {name: given[name] for name in ("messages", "system") if name in given}
    if _ascii(sent):
        return  # nothing JSON could refuse: the common case, without writing it out
    try:
        # The SDKs take pydantic models (an earlier reply's message) and bytes as well.
        check_item(pydantic_core.to_jsonable_python(sent))
    except (pydantic_core.PydanticSerializationError, UnicodeDecodeError) as exc:
        raise InvalidInputError(
            f"this call's messages cannot be sent: {exc}; pass text (str) or the SDK's"
            " content parts"
        ) from None


def _ascii(value: Any) -> bool:
    """Whether ``value`` is ASCII text, or lists and dicts (text keys) of it only."""
    if type(value) is str:
        return value.isascii()
    if type(value) is list:
        return all(_ascii(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and k.isascii() and _ascii(v) for k, v in value.items())
    return False


def _refused_plainly(error: Exception, sdk: str) -> BaseException | None:
    """The SDK's own error when the provider refused a call sent alone as too long (the
    engine's ``InvalidInputError`` says so with it as cause): the plain call raises
    exactly that, so the drop-in does too."""
    cause = error.__cause__
    if not isinstance(error, InvalidInputError) or cause is None:
        return None
    return cause if type(cause).__module__.partition(".")[0] == sdk else None


@dataclass(frozen=True)
class Wrapping:
    """What one wrapped client (or a copy of it) coalesces with.

    Attributes:
        sdk: ``"openai"`` or ``"anthropic"``.
        plain: The SDK client whose state it holds (the one given to ``wrap``, or the
            SDK's own copy of it for ``with_options``): its copies are made from it.
        partition: The ``partition=`` function, if any.
        root: The credentials key of the client given to ``wrap``.
        sender: This client's credentials key when it differs from ``root`` (its
            calls go through its own provider), else ``None``.
    """

    sdk: str
    plain: Any
    partition: PartitionFunction | None
    root: str
    sender: str | None = None


@dataclass(frozen=True)
class _Call:
    """One intercepted call, read."""

    translator: Translator
    endpoint: Endpoint | None
    given: dict[str, Any]
    call: SdkCall
    headers: CallHeaders
    limit: float | None
    lane: Lane = Lane.REALTIME


class CoalescedClient:
    """What :func:`wrap` returns: the client, with coalescing ``create`` and ``parse``.

    The wrapped client is an instance of the SDK client's own class
    (``isinstance(wrapped, openai.AsyncOpenAI)`` holds) and of this one. Every
    attribute but the methods of :data:`~coalesce._wrap.registry.TRANSLATORS`
    (``chat.completions.create`` / ``.parse``, and the same under
    ``beta.chat.completions``, for OpenAI; ``messages.create`` / ``.parse`` for
    Anthropic) and their ``with_raw_response`` / ``with_streaming_response`` forms is
    the SDK's own.
    """

    _engines: Engines
    _coalesce: Wrapping

    def _intercept(self, translator: Translator, path: str) -> Replace:
        """Given the SDK's own method at ``path``, the method that coalesces through
        ``translator`` (with the SDK method's name, docstring and signature)."""

        def replace(send: Send) -> Send:
            @functools.wraps(send)
            async def coalesced(**kwargs: Any) -> Any:
                return await self._dispatch(translator, path, send, kwargs)

            return coalesced

        return replace

    async def _dispatch(
        self, translator: Translator, path: str, send: Send, kwargs: dict[str, Any]
    ) -> Any:
        """One intercepted call: to the engine when ``translator`` reads it and packing
        pays, to the SDK's own method ``send`` otherwise."""
        cleaned, headers = coalesce_headers(kwargs)
        if not headers.coalesce:
            return await send(**cleaned)
        own, mode = raw_mode(cleaned)
        read = self._read(translator, path, own, headers, raw=mode is not None)
        if read is None:
            return await send(**cleaned)  # not coalescible, or packing cannot pay
        del own, cleaned  # read holds what the call needs while it waits
        partition = self._coalesce.partition
        given = raw_mode(kwargs)[0] if partition is not None else kwargs  # read only by it
        key = partition_key(partition, given, headers.partition)
        start = current_time()
        answer = await self._answer(read, key)
        reply = read.translator.reply(answer, read.given)
        if read.endpoint is None or (mode is None and not read.call.stream):
            return reply
        raw = raw_response(
            self,
            self._coalesce.sdk,
            mode,
            reply,
            read.endpoint,
            stream=read.call.stream,
            parsed=path.endswith(".parse"),
            waited=current_time() - start,
            reply_id=answer.share.reply.get("id"),
            group_size=answer.company,
        )
        raw.http_response.headers[LANE_HEADER] = answer.lane  # the lane that answered it
        # A stream is the SDK's own AsyncStream, parsed from its response as the SDK does.
        return raw if mode is not None else await raw.parse()

    def _read(
        self,
        translator: Translator,
        path: str,
        kwargs: dict[str, Any],
        headers: CallHeaders,
        *,
        raw: bool,
    ) -> _Call | None:
        """The call as the engine takes it, or ``None`` to pass it through: a call its
        translator declines, one whose kind packing does not pay for, a raw call of a
        method without a known endpoint."""
        given = given_arguments(kwargs)
        _check_sendable(given)
        call = translator.read(given)
        endpoint = endpoint_of(self._coalesce.sdk, path)
        if call is None or (raw and endpoint is None):
            return None
        sender = self._coalesce.sender
        lane = self._engines.lane_of(call, sender, headers.lane, headers.budget)
        engine = self._engines.engine(call, sender)
        if lane is Lane.REALTIME and engine.pays_from is None:
            return None  # the deferred lanes pay with plain requests too: half the price
        if engine.admission.oversized(call.item):
            return None  # it cannot share a request: sent as it is, the provider judges it
        limit = call_limit(given, call.timeout, getattr(self, "timeout", None))
        return _Call(translator, endpoint, given, call, headers, limit, lane)

    async def _answer(self, read: _Call, key: Any) -> Answered:
        """The engine's answer to ``read``, within the caller's own time limit."""
        with anyio.move_on_after(read.limit):
            try:
                return await self._engines.answer(
                    read.call, read.headers.budget, key, self._coalesce.sender, read.lane
                )
            except Exception as exc:
                refused = _refused_plainly(exc, self._coalesce.sdk)
                if refused is not None:
                    raise refused from None
                error = read.translator.error(exc, read.given)
                if error is exc:
                    raise
                raise error from exc
        base = str(getattr(self, "base_url", "")).rstrip("/")
        url = base + (read.endpoint.url if read.endpoint is not None else "")
        raise timeout_error(self._coalesce.sdk, url)

    async def post(self, path: str, **posted: Any) -> Any:
        """The SDK's ``post``; a chat completion's body posted to ``/chat/completions``
        (litellm's ``acompletion(client=...)`` sends so) goes through the coalescing
        ``chat.completions.create``, which sends the same body when it passes the call
        through (see :func:`~coalesce._wrap.openai_chat.posted_create`)."""
        if self._coalesce.sdk == "openai":
            create = posted_create(path, posted)
            if create is not None:
                return await cast(Any, self).chat.completions.create(**create)
        return await cast(Any, super()).post(path, **posted)

    def statistics(self) -> dict[str, PromptStatistics]:
        """Immutable snapshots of the coalesced calls, one per model.

        See :class:`~coalesce.PromptStatistics`: latency and budget, tokens, cost and
        savings, requests. Calls passed through to the client are not counted; copies
        made with ``with_options()`` / ``copy()`` share these statistics.
        ``wrap`` is typed as the client it wraps; reach this with
        ``typing.cast(coalesce.CoalescedClient, client).statistics()``.
        """
        return self._engines.statistics()

    def copy(self, **options: Any) -> Any:
        """The SDK's ``copy()`` (alias ``with_options()``): a client with ``options``
        changed that still coalesces, sharing this client's engines and statistics.

        A copy with other credentials, another base URL or other default headers
        (``api_key``, ``base_url``, ``organization``, ``project``, ``default_headers``,
        ...) never shares a request with calls sent with this client's: its calls go
        through its own copy of the client. ``timeout`` is each of its calls' own
        limit; ``max_retries`` applies to the calls it passes through (coalesced calls
        keep ``wrap``'s retries).

        Args:
            options: The SDK's ``copy()`` arguments.
        """
        return _coalesced(self._coalesce.plain.copy(**options), self._engines, self._coalesce)

    with_options = copy

    async def aclose(self) -> None:
        """Send pending calls now, wait for them, then close the client (the HTTP
        client it shares with the client given to ``wrap`` and every copy).

        ``await wrapped.close()`` does the same.
        """
        await self._engines.aclose()
        await cast(Any, super()).close()

    async def close(self) -> None:
        """The same as :meth:`aclose`."""
        await self.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<coalesced {self._coalesce.plain!r}>"


def _coalesced(plain: Any, engines: Engines, wrapping: Wrapping) -> CoalescedClient:
    """The coalescing client holding ``plain``'s state, served by ``engines``; its
    own provider if ``plain``'s credentials differ from the wrapped client's."""
    sender: str | None = credentials_key(plain)
    if sender == wrapping.root:
        sender = None
    else:
        engines.add_sender(cast(str, sender), lambda: as_provider(plain))
    table = TRANSLATORS[wrapping.sdk]
    client = cast(CoalescedClient, coalesced_copy(plain, table, CoalescedClient))
    client._engines = engines
    client._coalesce = dataclasses.replace(wrapping, plain=plain, sender=sender)
    replace_methods(client, {path: client._intercept(t, path) for path, t in table.items()})
    return client


def _kind(client: Any) -> tuple[Provider, str]:
    """The provider of an async OpenAI or Anthropic client, and which SDK it is."""
    if isinstance(client, CoalescedClient):
        raise ConfigurationError(
            f"{client!r} is already wrapped by coalesce.wrap; wrap the SDK client once"
        )
    refused = ConfigurationError(
        "coalesce.wrap takes an SDK client: openai.AsyncOpenAI or openai.OpenAI (and"
        " AsyncAzureOpenAI / AzureOpenAI), anthropic.AsyncAnthropic or anthropic.Anthropic;"
        f" got {client!r}. For a Provider or an async function, use @coalesce.prompt(client=...)"
    )
    try:
        base = as_provider(client)
    except ConfigurationError:
        raise refused from None
    if isinstance(base, (OpenAIProvider, AnthropicProvider)):
        return base, "openai" if isinstance(base, OpenAIProvider) else "anthropic"
    raise refused


@refuses_unknown("coalesce.wrap")
def wrap(
    client: C,
    *,
    max_wait: float | NotGiven = NOT_GIVEN,
    max_items: int | NotGiven = NOT_GIVEN,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    partition: Partition | None = None,
    max_attempts: int = 4,
    max_retries: int | None = None,
    max_output_tokens: int | None = None,
    timeout: float | None = None,
    context_window: int | None = None,
    schema_enforced: bool | None = None,
    packing: Literal["auto", "always"] = "auto",
    latency_prior: LatencyPrior | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
    shadow: float | NotGiven = NOT_GIVEN,
    min_agreement: float = 0.9,
    agree: Callable[[Any, Any], bool] | None = None,
    screen: bool | Callable[[Any], bool] = True,
    vote: bool = False,
    lane: LaneChoice = "realtime",
    store: str | os.PathLike[str] | JobStore | None = None,
    batch_window: float = 60.0,
    poll_interval: float = 60.0,
    fleet: str | None = None,
    fleet_creds: str | os.PathLike[str] | None = None,
    fleet_tls_ca: str | os.PathLike[str] | None = None,
) -> C:
    """Wrap an ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic`` so that compatible
    calls coalesce (a blocking ``OpenAI`` or ``Anthropic`` client's calls block, served
    on one background loop). The options mean what they mean for :func:`prompt`.

    Args:
        client: The SDK client.
        max_wait: Longest a call waits for company, in seconds; not given: 0.05, or a
            quarter of the call's budget.
        max_items: Most calls per request; not given: learned per model and kind of call,
            from 4; given, even 4, it pins the cap.
        max_concurrency: Most requests in flight at once (default: no limit).
        latency_budget: Seconds a call may take, unless its ``x-coalesce-budget`` says.
        partition: ``partition(**kwargs) -> key``, called with each coalesced call's
            keyword arguments: calls with different keys never share a request.
        max_attempts: Requests that may carry one item, re-asks included.
        max_retries: Retries of a request that failed as a whole (default: the wrapped
            client's own ``max_retries``; the SDK's are switched off inside coalesce).
        max_output_tokens: Cap on a packed reply (default: each call's cap times items).
        timeout: Longest one attempt, in seconds (default: the budget, else the client's).
        context_window: The model's context window in tokens (default: known models').
        schema_enforced: Whether replies always follow the schema (default: as declared).
        packing: ``"auto"``: coalesce a kind of call only where packing costs less than
            plain calls (else they pass through); ``"always"``.
        latency_prior: What the planner assumes of the provider before measuring it.
        prices: Prices for the cost estimates (see :func:`~coalesce.price_for`).
        on_event: Called with each call, request, dispatch and retry event.
        shadow: Share of packed items also asked alone; not given: 0.01 where learned.
        min_agreement: Agreement of packed and plain answers under which the cap comes down.
        agree: ``agree(a, b) -> bool`` for the shadow guard and the vote (default:
            ``==``, free text compared by its words).
        screen: A call whose item reads like instructions goes alone.
        vote: Ask each packed group in two orders; settle differences with plain calls.
        lane: A call's lane unless its ``x-coalesce-lane`` header says (default
            ``"realtime"``: the caller waits on its SDK's timeout).
        store: The batch lane's job store, with the learned caps beside it (default:
            ``$COALESCE_STORE``, else the user data directory; ``":memory:"``: no file).
        batch_window: Seconds a deferred (flex, batch) call waits for others.
        poll_interval: The longest wait between two polls of a batch job, in seconds.
        fleet: A NATS URL (``nats://host:4222``): the calls of every process wrapping a
            client with the same one coalesce as one (docs/fleet.md). The client returned
            is then the SDK's own, sending through a gateway this process serves on a
            loopback port; only the options that gateway takes may be given with it.
        fleet_creds: A NATS credentials file the fleet connects with.
        fleet_tls_ca: A CA bundle the fleet's NATS server is verified with (TLS).

    Raises:
        ConfigurationError: The client is not OpenAI's or Anthropic's, or is wrapped
            already, or an option is out of range (``UnknownOptionError``: misspelt).
    """
    if fleet is not None or fleet_creds is not None or fleet_tls_ca is not None:
        return cast(C, through_fleet(client, locals(), "wrap"))
    if async_twin(client) is not None:  # a blocking openai.OpenAI / anthropic.Anthropic
        return cast(C, _blocking(dict(locals())))
    return cast(C, _wrapped(client, locals(), partition_function(partition)))  # warns here


def _wrapped(
    client: Any, given: Mapping[str, Any], partition: PartitionFunction | None
) -> CoalescedClient:
    """``wrap()`` of an async SDK client, with ``given``, its keywords, and ``partition``."""
    provider, kind = _kind(client)
    retries = retries_for(client, given["max_retries"])  # the client's own by default
    engines = Engines(provider, Options.of({**given, "max_retries": retries}))
    engines.adopt()  # with store= inside a running loop: the jobs an earlier process left
    by = Wrapping(kind, client, partition, credentials_key(client))
    return _coalesced(client, engines, by)


def _blocking(given: dict[str, Any]) -> Any:
    """``wrap()`` of a synchronous SDK client: its async twin wrapped with the same
    options, the calls of every thread served on the process's background loop."""
    client = given.pop("client")
    return sync_coalesced(client, wrap(async_twin(client), **given))
