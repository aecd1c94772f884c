"""A plain async function as a provider: for tests, local models and custom clients."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._batching.runtime import current_time
from .._exceptions import ConfigurationError
from ._base import Completion, CompletionRequest, RetryAdvice

__all__ = ["CallableProvider"]

CompletionFunction = Callable[[CompletionRequest], Awaitable["str | Completion"]]


class CallableProvider:
    """Wraps ``async def fn(request: CompletionRequest) -> str | Completion``.

    A returned string is the reply text (``finish_reason="stop"``, no usage). The
    function cannot stream: when ``request.stream`` is true, ``on_text`` receives the
    whole reply as one delta once it is known.

    Args:
        fn: The function.
        structured: Whether ``fn`` enforces ``request.reply_schema``; if not (the
            default), the reply format is described in the prompt.
        retry_on: Exception types worth retrying; nothing is retried by default.
        name: The provider's name in statistics.
    """

    def __init__(
        self,
        fn: CompletionFunction,
        *,
        structured: bool = False,
        retry_on: tuple[type[BaseException], ...] = (),
        name: str = "callable",
    ) -> None:
        self.name = name
        self.structured = structured
        self.retry_on = retry_on
        self._fn = fn

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        """Call the function and wrap its answer.

        Args:
            request: The request.
            on_text: Receives the whole reply, when ``request.stream`` is true.

        Raises:
            ConfigurationError: The function returned something other than a ``str`` or
                a :class:`Completion` with ``str`` text (it is not retried: every caller
                of the request gets it).
            Exception: Whatever the function raises, unchanged.
        """
        start = current_time()
        result = await self._fn(request)
        seconds = current_time() - start
        if isinstance(result, str):
            result = Completion(text=result, finish_reason="stop", seconds=seconds)
        elif not isinstance(result, Completion) or not isinstance(result.text, str):
            raise ConfigurationError(_wrong_reply(self._fn, result))
        if request.stream and on_text is not None and result.text:
            on_text(result.text)
        return result

    def advise(self, error: BaseException) -> RetryAdvice:
        """Retry exactly the exception types given as ``retry_on``.

        Args:
            error: What :meth:`complete` raised.
        """
        return RetryAdvice(retry=isinstance(error, self.retry_on))

    def __repr__(self) -> str:
        return f"<CallableProvider fn={self._fn!r} structured={self.structured}>"


def _wrong_reply(fn: Any, result: Any) -> str:
    name = getattr(fn, "__qualname__", None) or repr(fn)
    shown = repr(result if not isinstance(result, Completion) else result.text)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    what = (
        f"a Completion whose text is {type(result.text).__name__} {shown}"
        if isinstance(result, Completion)
        else f"{type(result).__name__} {shown}"
    )
    return (
        f"the provider function {name} returned {what}; it must return the reply text (a"
        " str) or a coalesce.providers.Completion with str text"
    )
