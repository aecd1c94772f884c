"""What the providers over an official SDK (``openai``, ``anthropic``) share.

Both SDKs raise errors of the same shape (``APIStatusError``, ``APIConnectionError``,
``APITimeoutError``) and both retry by themselves; :class:`SDKProvider` turns the
SDK's retries off and judges its errors, so the two never multiply.

An SDK client's connection pool belongs to the event loop that first used it: its
connections are that loop's sockets, and once that loop has closed they fail ("Event
loop is closed"). So a provider never sends through your client's pool: each loop it
sends from gets a copy of your client with a pool of its own
(:meth:`SDKProvider.client`), closed as that loop ends, and your client is left to
whichever loop you use it on.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from .._batching.runtime import at_loop_end, running_owner, spawn_on
from ._base import RetryAdvice
from ._http import lower_headers, status_advice, transport_error_kind

__all__ = [
    "SDKProvider",
    "own_pool",
    "sdk_advice",
    "sdk_transport_errors",
    "timeout_seconds",
]


_Self = TypeVar("_Self", bound="_SDKClient")


class _SDKClient(Protocol):
    def with_options(self: _Self, *, max_retries: int) -> _Self: ...


ClientT = TypeVar("ClientT", bound=_SDKClient)


class SDKProvider(Generic[ClientT]):
    """Base of the providers over an official SDK client.

    The client is copied with ``max_retries=0`` (yours is left as it is): retries are
    coalesce's job (:func:`~coalesce._engine.retry.complete_with_retries`), so the
    SDK's never multiply with them.

    Args:
        client: The SDK client.
    """

    #: The SDK's module, imported only when an error is judged.
    sdk: ClassVar[str]
    structured = True

    def __init__(self, client: ClientT) -> None:
        self._client = client.with_options(max_retries=0)
        self._pools = _Pools()
        # Collected (an engine's objects refer to each other: by the garbage collector),
        # it closes its copies on their loops: they are kept out of the garbage here.
        weakref.finalize(self, self._pools.close)

    @property
    def client(self) -> Any:
        """The SDK client requests sent from the running loop go through: a copy of
        yours with ``max_retries=0`` and a connection pool of that loop's own, closed as
        the loop ends (a client given a custom ``http_client=`` is shared as it is:
        coalesce cannot rebuild it)."""
        owner = running_owner()
        if owner is None:
            return self._client
        client = self._pools.copies.get(owner)
        return client if client is not None else self._pools.add(owner, self._client)

    @property
    def default_timeout(self) -> float | None:
        """The read timeout configured on the client, in seconds (``None`` if it has
        none): a request attempt without a ``timeout=`` or a budget may run this long,
        so coalesce's own default never undercuts what the client was given."""
        return timeout_seconds(getattr(self._client, "timeout", None)) or None

    def advise(self, error: BaseException) -> RetryAdvice:
        """Retry 408, 409, 429 (after ``retry-after``), 5xx (Anthropic's 529 too),
        timeouts and connection errors.

        Args:
            error: What ``complete`` raised.
        """
        return sdk_advice(error, importlib.import_module(self.sdk))


class _Pools:
    """A provider's copies of its client, one per loop, each with a pool of its own."""

    def __init__(self) -> None:
        self.copies: weakref.WeakKeyDictionary[object, Any] = weakref.WeakKeyDictionary()
        # What closes each copy as its loop ends.
        self.closers: weakref.WeakKeyDictionary[object, object] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()  # threads' loops may send their first requests at once

    def add(self, owner: object, client: Any) -> Any:
        """The copy of ``client`` for the loop ``owner`` names, made now if need be
        (``client`` itself if it cannot be copied)."""
        with self.lock:
            copy = self.copies.get(owner)
            if copy is None:
                copy = own_pool(client)
                if copy is None:
                    return client
                self.copies[owner] = copy
                self.closers[owner] = at_loop_end(copy.close)
            return copy

    def close(self) -> None:
        """Close every copy on its loop (one that has ended keeps its sockets)."""
        for owner, copy in list(self.copies.items()):
            spawn_on(owner, copy.close)


def own_pool(client: Any) -> Any:
    """A copy of an SDK client with a connection pool of its own, or ``None`` if its
    HTTP client is not the SDK's default (a custom one cannot be rebuilt)."""
    http: Any = getattr(client, "_client", None)
    if type(http).__name__ != "AsyncHttpxClientWrapper":
        return None
    return client.with_options(
        http_client=type(http)(base_url=client.base_url, timeout=client.timeout)
    )


def timeout_seconds(timeout: Any) -> float | None:
    """An SDK ``timeout`` as the seconds a caller waits: a number as it is, a
    ``Timeout`` object by its ``read`` limit (the wait for the answer), ``None`` (or
    anything else, or no finite limit) for none."""
    if not isinstance(timeout, (int, float)):
        timeout = getattr(timeout, "read", None)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return None
    return max(float(timeout), 0.0) if math.isfinite(timeout) else None


def sdk_advice(error: BaseException, sdk: Any) -> RetryAdvice:
    """Whether an official SDK's exception is worth retrying, and when.

    An ``APIStatusError`` is judged by :func:`status_advice`; an ``APIConnectionError``
    (``APITimeoutError`` is one) is retried; anything else is not.

    Args:
        error: What the provider's ``complete`` raised.
        sdk: The SDK module, ``openai`` or ``anthropic``.
    """
    if isinstance(error, sdk.APIStatusError):
        return status_advice(error.status_code, lower_headers(error.response.headers.items()))
    return RetryAdvice(retry=isinstance(error, sdk.APIConnectionError))


@contextlib.contextmanager
def sdk_transport_errors(sdk: Any, request: Any) -> Iterator[None]:
    """Re-raise a transport error that escaped an SDK's stream as the SDK's own.

    The SDKs wrap httpx / httpx2 errors while sending, but can let them through while a
    stream is read; callers should only ever see the SDK's types.

    Args:
        sdk: The SDK module, ``openai`` or ``anthropic``.
        request: The SDK's HTTP request, for the new error.
    """
    try:
        yield
    except Exception as exc:
        kind = transport_error_kind(exc)
        if kind == "timeout":
            raise sdk.APITimeoutError(request=request) from exc
        if kind == "connection":
            message = f"Connection error: {exc}"
            raise sdk.APIConnectionError(message=message, request=request) from exc
        raise
