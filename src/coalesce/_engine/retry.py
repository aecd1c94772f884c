"""Retrying one provider request: what to retry, how long to wait, when to give up.

The decisions are pure functions (:func:`backoff_delay`, :func:`next_wait`; the
HTTP ones, ``retry-after`` and statuses, are in ``providers/_http.py``); :func:`complete_with_retries` feeds them
from tenacity's ``AsyncRetrying``, sleeping through ``anyio`` so virtual clocks apply.

What is retried is the provider's call (:meth:`Provider.advise`): 429, 5xx, timeouts
and dropped connections, never a request the provider rejected (400, 401, 404). A
request that already delivered text to ``on_text`` is never retried: its caller holds
a partial reply, and a second answer would be appended to the first.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from tenacity import AsyncRetrying, RetryCallState

from .._calls import Retry
from .._exceptions import ConfigurationError, RequestTimeoutError
from ..providers._base import RetryAdvice

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..providers._base import Completion, CompletionRequest, Provider

__all__ = [
    "backoff_delay",
    "complete_with_retries",
    "next_wait",
]

BACKOFF_BASE = 0.5
BACKOFF_CAP = 8.0

#: The jitter's random source when a request is given none (seeded once, not per request).
_JITTER = random.Random()


def backoff_delay(
    attempt: int, unit: float, *, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP
) -> float:
    """Exponential backoff with jitter: between half and all of ``min(cap, base·2ⁿ⁻¹)``.

    Args:
        attempt: The number of the attempt that failed (1 for the first).
        unit: A uniform draw in ``[0, 1)`` (the jitter).
        base: The first attempt's full delay.
        cap: The largest delay.
    """
    full = min(cap, base * 2.0 ** max(0, attempt - 1))
    return full * (0.5 + unit / 2)


def next_wait(
    attempt: int, advice: RetryAdvice, unit: float, now: float, deadline: float | None
) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` to give up now.

    The provider's ``after`` wins over the backoff. Giving up happens when the next
    attempt could not start before ``deadline``.

    Args:
        attempt: The number of the attempt that failed.
        advice: The provider's advice about the failure.
        unit: A uniform draw in ``[0, 1)`` for the jitter.
        now: The current time (``anyio.current_time()``).
        deadline: The absolute time by which an attempt must start, if any.
    """
    if not advice.retry:
        return None
    wait = advice.after if advice.after is not None else backoff_delay(attempt, unit)
    if deadline is not None and now + wait >= deadline:
        return None
    return wait


class _Attempts:
    """The retry loop's state: the last advice, whether text went out, the next wait."""

    def __init__(
        self,
        provider: Provider,
        max_attempts: int,
        deadline: float | None,
        rng: random.Random,
        on_retry: Callable[[Retry], None] | None,
    ) -> None:
        self.provider = provider
        self.max_attempts = max_attempts
        self.deadline = deadline
        self.rng = rng
        self.on_retry = on_retry
        self.streamed = False
        self.wait: float | None = None

    def text_sink(self, on_text: Callable[[str], None] | None) -> Callable[[str], None] | None:
        if on_text is None:
            return None

        def sink(delta: str) -> None:
            if delta:
                self.streamed = True
            on_text(delta)

        return sink

    def decide(self, state: RetryCallState) -> bool:
        """tenacity's ``retry``: compute the next wait, or ``None`` to re-raise."""
        error = state.outcome.exception() if state.outcome else None
        self.wait = None
        if not isinstance(error, Exception) or self.streamed:
            return False
        if state.attempt_number >= self.max_attempts:
            return False
        if isinstance(error, RequestTimeoutError):
            # Worth another attempt only if a deadline says how long to keep trying;
            # without one, the timeout is the longest its callers wait.
            advice = RetryAdvice(retry=self.deadline is not None and math.isfinite(self.deadline))
        else:
            advice = self.provider.advise(error)
        unit = self.rng.random()
        now = anyio.current_time()
        self.wait = next_wait(state.attempt_number, advice, unit, now, self.deadline)
        return self.wait is not None

    def wait_for(self, state: RetryCallState) -> float:
        return self.wait or 0.0

    def report(self, state: RetryCallState) -> None:
        if self.on_retry is not None and state.outcome is not None:
            error = state.outcome.exception()
            assert error is not None
            self.on_retry(Retry(state.attempt_number, self.wait or 0.0, error))


async def complete_with_retries(
    provider: Provider,
    request: CompletionRequest,
    *,
    on_text: Callable[[str], None] | None = None,
    max_attempts: int = 3,
    deadline: float | None = None,
    attempt_timeout: float | None = None,
    on_retry: Callable[[Retry], None] | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
) -> Completion:
    """Send ``request`` through ``provider``, retrying what the provider says may succeed.

    Args:
        provider: The provider.
        request: The request.
        on_text: Receives streamed text deltas. Once one non-empty delta went out,
            a failure is re-raised, never retried.
        max_attempts: The most attempts, the first included.
        deadline: Absolute time (``anyio.current_time()`` clock) by which an attempt
            must start: a retry whose wait would reach it is not made (the last error
            is re-raised). An attempt already running is not cut off by it.
        attempt_timeout: Cancel an attempt after this many seconds; that counts as a
            retryable failure while a finite ``deadline`` leaves time for another
            attempt (:class:`~coalesce.RequestTimeoutError`).
        on_retry: Called before each wait with the failed attempt (counts retries).
        rng: The jitter's random source (seed it for reproducible waits).
        sleep: The sleep function (``anyio.sleep``).

    Raises:
        ConfigurationError: ``max_attempts`` below 1 or a non-positive ``attempt_timeout``.
        RequestTimeoutError: The last attempt outlasted ``attempt_timeout``.
        Exception: The provider's own exception from the last attempt, unchanged.
    """
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be >= 1, got {max_attempts}")
    if attempt_timeout is not None and not attempt_timeout > 0:
        raise ConfigurationError(f"attempt_timeout must be > 0, got {attempt_timeout}")
    state = _Attempts(provider, max_attempts, deadline, rng or _JITTER, on_retry)
    sink = state.text_sink(on_text)
    # The first attempt is made as tenacity would make it; only once it fails does
    # tenacity take over, its first attempt raising that failure again (the same
    # decisions, waits and reports, without building a retry loop for every request).
    try:
        return await _attempt(provider, request, sink, deadline, attempt_timeout)
    except Exception as exc:
        first: Exception | None = exc

    async def again() -> Completion:
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return await _attempt(provider, request, sink, deadline, attempt_timeout)

    retrying = AsyncRetrying(
        retry=state.decide,
        wait=state.wait_for,
        before_sleep=state.report,
        sleep=sleep,
        reraise=True,
    )
    result: Completion = await retrying(again)
    return result


async def _attempt(
    provider: Provider,
    request: CompletionRequest,
    on_text: Callable[[str], None] | None,
    deadline: float | None,
    attempt_timeout: float | None,
) -> Completion:
    # The deadline only decides whether a retry may start: a latency budget is a
    # planning target, and an answer a little late beats an error for every caller
    # of the request. A hard stop is the client's own timeout (or attempt_timeout).
    if attempt_timeout is None:  # no limit: no cancel scope either
        return await provider.complete(request, on_text)
    with anyio.move_on_after(attempt_timeout):
        return await provider.complete(request, on_text)
    raise RequestTimeoutError(
        f"no reply from the provider within the {attempt_timeout:g} s timeout;"
        " raise timeout= if the provider is slow, or check that it is up",
        seconds=attempt_timeout,
    )
