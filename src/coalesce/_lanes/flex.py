"""The flex lane: OpenAI's flex processing, with real time as the fallback.

A flex request is billed at batch prices, answered more slowly, and refused with
``429`` ``resource_unavailable`` (not billed) when the provider has no spare capacity;
a model without flex refuses it with ``400`` naming ``service_tier`` (``docs/lanes.md``).
Capacity comes back in minutes, not the seconds the group runner retries after, so
:class:`FlexProvider` marks both refusals as not retryable and :func:`flex_refused`
recognises them; the lane router then asks again in flex after :data:`FLEX_BACKOFF`
while the budget allows (:func:`~coalesce._lanes.choose.flex_again`), else in real time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tenacity import wait_exponential

from ..providers import Completion, CompletionRequest, RetryAdvice

__all__ = [
    "FLEX_BACKOFF",
    "FLEX_TIMEOUT",
    "FLEX_UNAVAILABLE",
    "FlexProvider",
    "flex_refused",
    "flex_unsupported",
]

#: Longest one flex request may run (OpenAI advises a client timeout of 15 minutes).
FLEX_TIMEOUT = 15 * 60.0

#: The error code of a flex request refused for lack of capacity.
FLEX_UNAVAILABLE = "resource_unavailable"

#: The wait before a call flex refused is asked in flex again, as tenacity's strategy
#: (by the refusals so far): 30 s after the first, doubling, at most 5 minutes, since
#: capacity comes back in minutes.
FLEX_BACKOFF = wait_exponential(multiplier=30.0, exp_base=2.0, max=300.0)


def _error_fields(error: BaseException) -> tuple[int | None, Mapping[str, Any]]:
    """The status code and the ``error`` object of an SDK's ``APIStatusError``."""
    status = getattr(error, "status_code", None)
    body = getattr(error, "body", None)
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    return (status if isinstance(status, int) else None), (
        body if isinstance(body, Mapping) else {}
    )


def flex_refused(error: BaseException) -> bool:
    """Whether ``error`` is a flex request refused for capacity (``429``
    ``resource_unavailable``) or for a model without flex (:func:`flex_unsupported`)."""
    status, body = _error_fields(error)
    code = getattr(error, "code", None) or body.get("code")
    return (status == 429 and code == FLEX_UNAVAILABLE) or flex_unsupported(error)


def flex_unsupported(error: BaseException) -> bool:
    """Whether ``error`` says the model offers no flex processing (``400`` about
    ``service_tier``): flex is not tried again for the function."""
    status, body = _error_fields(error)
    param = getattr(error, "param", None) or body.get("param")
    return status == 400 and param == "service_tier"


class FlexProvider:
    """``provider``, with a flex refusal marked as not worth retrying.

    Everything else (sending, the other errors' advice, what the provider declares) is
    ``provider``'s own; the request asks for flex through its options
    (``service_tier="flex"``).
    """

    def __init__(self, provider: Any) -> None:
        self.inner = provider

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        """Send ``request`` through the wrapped provider."""
        completion: Completion = await self.inner.complete(request, on_text)
        return completion

    def advise(self, error: BaseException) -> RetryAdvice:
        """Never retry a flex refusal (the call falls back to real time); otherwise the
        wrapped provider's advice."""
        if flex_refused(error):
            return RetryAdvice(retry=False)
        advice: RetryAdvice = self.inner.advise(error)
        return advice

    def __repr__(self) -> str:
        return f"<FlexProvider {self.inner!r}>"
