"""Turn what the user passes as ``client=`` into a :class:`~coalesce.providers.Provider`."""

from __future__ import annotations

import inspect
from typing import Any

from .._exceptions import ConfigurationError
from .._options import MAX_RETRIES
from . import Provider

__all__ = ["as_provider", "retries_for"]


def as_provider(client: Any) -> Provider:
    """The provider for ``client``.

    Accepts a :class:`~coalesce.providers.Provider`, an ``openai.AsyncOpenAI``, an
    ``anthropic.AsyncAnthropic``, or an async callable taking a
    :class:`~coalesce.providers.CompletionRequest` and returning the reply text. The
    SDKs are recognised without being imported.

    Raises:
        ConfigurationError: For anything else (a sync client, a string...).
    """
    if isinstance(client, Provider):
        return client
    lineage = {(c.__module__.split(".")[0], c.__name__) for c in type(client).__mro__}
    if ("openai", "AsyncOpenAI") in lineage:
        from . import OpenAIProvider

        return OpenAIProvider(client)
    if ("anthropic", "AsyncAnthropic") in lineage:
        from . import AnthropicProvider

        return AnthropicProvider(client)
    module, name = type(client).__module__.split(".")[0], type(client).__name__
    if module in ("openai", "anthropic"):
        raise ConfigurationError(
            f"client must be an async client: got {module}.{name}; use {module}.Async"
            f"{name.removeprefix('Async')}(...) instead"
        )
    if callable(client) and (
        inspect.iscoroutinefunction(client)
        or inspect.iscoroutinefunction(getattr(client, "__call__", None))  # noqa: B004
    ):
        from . import CallableProvider

        return CallableProvider(client)
    raise ConfigurationError(
        f"client must be an openai.AsyncOpenAI, an anthropic.AsyncAnthropic, a"
        f" coalesce.providers.Provider or an async callable; got {client!r}"
    )


def retries_for(client: Any, given: int | None) -> int:
    """``wrap(max_retries=)``: retries of a request that failed as a whole, done by
    coalesce (the SDK's own are switched off, so the two never multiply): ``given``,
    else the wrapped client's own ``max_retries`` setting (a drop-in keeps what the
    client was configured with), else :data:`~coalesce._options.MAX_RETRIES`."""
    if given is not None:
        return given
    own = getattr(client, "max_retries", None)
    return own if isinstance(own, int) and not isinstance(own, bool) else MAX_RETRIES
