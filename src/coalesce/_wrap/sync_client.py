"""``coalesce.wrap(openai.OpenAI())``: a synchronous client whose calls coalesce.

Synchronous code (a Flask or Django view, a FastAPI ``def`` endpoint, a script's
threads) uses ``openai.OpenAI`` / ``anthropic.Anthropic``. The wrapped client is an
instance of the client's own class (made the way :mod:`~coalesce._wrap.proxy` makes the
async one), so ``isinstance(wrapped, openai.OpenAI)`` holds and every other attribute
is the SDK's. Its coalescing methods (those of
:data:`~coalesce._wrap.registry.TRANSLATORS`) hand the call to its *twin*, an async
client built from the same settings (:func:`async_twin`: API key, base URL, timeout,
retries, default headers and query...) and wrapped by ``coalesce.wrap``, on the
process's background event loop (:mod:`~coalesce._batching.portal`), and block until
its answer: the calls of every thread coalesce there. A streamed call returns the SDK's
own ``Stream`` (:func:`~coalesce._wrap.stream.blocking_stream`). What its translator
declines, a call with ``x-coalesce: off`` and the raw-response forms
(``with_raw_response``, ``with_streaming_response``) go to the synchronous client
itself, untouched.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .._batching.portal import call_blocking
from .._observe.recorder import PromptStatistics
from .call import given_arguments
from .headers import coalesce_headers
from .proxy import Replace, coalesced_copy, replace_methods
from .raw import raw_mode
from .registry import TRANSLATORS
from .stream import blocking_stream
from .translator import Translator

__all__ = ["SyncCoalescedClient", "async_twin", "sync_coalesced"]

Send = Callable[..., Any]

#: ``module:Name`` of each SDK's synchronous client and of its async counterpart.
_TWINS = {"openai": ("OpenAI", "AsyncOpenAI"), "anthropic": ("Anthropic", "AsyncAnthropic")}
#: Constructor arguments not carried over: the HTTP client is synchronous; headers and
#: query are read from the client's own (without the SDK's platform headers).
_NOT_CARRIED = frozenset({"self", "http_client", "default_headers", "default_query"})


def _sdk_of(client: Any) -> str | None:
    """``"openai"`` or ``"anthropic"`` if ``client`` is that SDK's synchronous client
    (never importing an SDK that is not imported yet)."""
    for sdk, (sync_name, _) in _TWINS.items():
        module = sys.modules.get(sdk)
        if module is not None and isinstance(client, getattr(module, sync_name, ())):
            return sdk
    return None


def async_twin(client: Any) -> Any | None:
    """The async client with ``client``'s settings, if ``client`` is an ``openai.OpenAI``
    or ``anthropic.Anthropic`` (else ``None``): every constructor argument the client
    keeps as a public attribute (API key, auth token, organization, project, base URL,
    timeout, max_retries...), its default headers and query. A custom ``http_client``
    is not carried over (it is synchronous): the twin has the SDK's default one.
    """
    sdk = _sdk_of(client)
    if sdk is None:
        return None
    twin_class = getattr(sys.modules[sdk], _TWINS[sdk][1])
    settings: dict[str, Any] = {}
    for name in inspect.signature(twin_class.__init__).parameters:
        if name in _NOT_CARRIED or name.startswith("_") or not hasattr(client, name):
            continue
        if isinstance(getattr(type(client), name, None), functools.cached_property):
            continue  # a resource of the client (Anthropic's ``models``), not a setting
        settings[name] = getattr(client, name)
    settings["default_headers"] = getattr(client, "_custom_headers", None)
    settings["default_query"] = getattr(client, "_custom_query", None)
    return twin_class(**settings)


class SyncCoalescedClient:
    """What ``coalesce.wrap`` returns for ``openai.OpenAI`` / ``anthropic.Anthropic``:
    the client, whose coalescing methods block on its async twin (see the module doc).
    It is an instance of the SDK client's own class and of this one.
    """

    _coalesce_twin: Any
    _coalesce_plain: Any

    def _intercept(self, translator: Translator, path: str) -> Replace:
        """Given the SDK's own method at ``path``, the blocking method that coalesces."""

        def replace(send: Send) -> Send:
            @functools.wraps(send)
            def coalesced(**kwargs: Any) -> Any:
                return self._dispatch(translator, path, send, kwargs)

            return coalesced

        return replace

    def _dispatch(
        self, translator: Translator, path: str, send: Send, kwargs: dict[str, Any]
    ) -> Any:
        """One call: through the twin (blocking) when its translator reads it, else to
        the synchronous SDK method ``send`` untouched (coalesce's headers removed)."""
        cleaned, headers = coalesce_headers(kwargs)
        own, mode = raw_mode(cleaned)
        if (
            not headers.coalesce
            or mode is not None
            or translator.read(given_arguments(own)) is None
        ):
            return send(**cleaned)
        method: Callable[..., Awaitable[Any]] = functools.reduce(
            getattr, path.split("."), self._coalesce_twin
        )
        reply = call_blocking(method, **kwargs)
        return blocking_stream(self, reply) if hasattr(reply, "__aiter__") else reply

    def statistics(self) -> dict[str, PromptStatistics]:
        """Immutable snapshots of the coalesced calls, one per model (see
        :meth:`coalesce.CoalescedClient.statistics`); shared with copies."""
        return cast(dict[str, PromptStatistics], self._coalesce_twin.statistics())

    def copy(self, **options: Any) -> Any:
        """The SDK's ``copy()`` (alias ``with_options()``): a client with ``options``
        changed that still coalesces, sharing this client's engines and statistics (a
        copy with other credentials sends its calls in requests of its own)."""
        twin_options = {name: value for name, value in options.items() if name != "http_client"}
        return sync_coalesced(
            self._coalesce_plain.copy(**options), self._coalesce_twin.copy(**twin_options)
        )

    with_options = copy

    def close(self) -> None:
        """Send pending calls now, wait for them, then close the twin and the client."""
        call_blocking(self._coalesce_twin.aclose)
        cast(Any, super()).close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<coalesced {self._coalesce_plain!r}>"


def sync_coalesced(client: Any, twin: Any) -> Any:
    """The synchronous coalescing client: ``client`` (an ``openai.OpenAI`` or
    ``anthropic.Anthropic``) whose coalescing methods block on ``twin``, its async twin
    already wrapped by ``coalesce.wrap`` (see :func:`async_twin`).

    Args:
        client: The synchronous SDK client.
        twin: ``coalesce.wrap(async_twin(client), ...)``.

    Raises:
        TypeError: ``client`` is not a synchronous OpenAI or Anthropic client.
    """
    sdk = _sdk_of(client)
    if sdk is None:
        raise TypeError(f"expected an openai.OpenAI or anthropic.Anthropic, got {client!r}")
    table = TRANSLATORS[sdk]
    wrapped = cast(SyncCoalescedClient, coalesced_copy(client, table, SyncCoalescedClient))
    wrapped._coalesce_twin = twin
    wrapped._coalesce_plain = client
    replace_methods(wrapped, {path: wrapped._intercept(t, path) for path, t in table.items()})
    return wrapped
