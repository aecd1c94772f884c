"""Accounting: one record per request, and the totals over them."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Ledger", "RequestRecord", "SimulatorStatistics"]


@dataclass(frozen=True)
class RequestRecord:
    """What the simulated provider saw and did for one request.

    Attributes:
        api: ``"openai.chat"``, ``"openai.responses"``, ``"anthropic.messages"``,
            ``"openai.batch"`` or ``"anthropic.batch"`` (one record per line of a batch).
        model: The requested model.
        api_key: The bearer token or ``x-api-key`` (``""`` if none).
        items: Items in the request: the packed items, or 1.
        prompt_tokens: Tokens of the prompt, every one (cached and cache-written
            ones included).
        completion_tokens: Tokens of the answer (0 if none was sent).
        status: The HTTP status sent (499 when the client went away first).
        faults: Names of the faults injected into this request.
        started_at: When the request arrived (``anyio.current_time()``).
        finished_at: When the answer was complete.
        stream: Whether the answer was streamed.
        batch_id: The batch this line belongs to, if any.
        cached_tokens: Of ``prompt_tokens``, those read from the prompt cache
            (OpenAI ``cached_tokens``, Anthropic ``cache_read_input_tokens``).
        cache_write_tokens: Of ``prompt_tokens``, those written to the prompt cache
            (Anthropic ``cache_creation_input_tokens``; always 0 on OpenAI, which
            does not bill writes).
        service_tier: The service tier the reply states (OpenAI Chat Completions and
            Responses: ``"default"``, ``"flex"`` or ``"priority"``); ``None`` for
            Anthropic and batch lines. A flex request refused for capacity has status 429, this
            tier and the fault ``"resource_unavailable"``.
        degraded: Of ``items``, the answers a :class:`PackingDegradation` made wrong
            (0 for a plain request, and for an answer not sent).
    """

    api: str
    model: str
    api_key: str
    items: int
    prompt_tokens: int
    completion_tokens: int
    status: int
    faults: tuple[str, ...]
    started_at: float
    finished_at: float
    stream: bool = False
    batch_id: str | None = None
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    service_tier: str | None = None
    degraded: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-able dict."""
        return dataclasses.asdict(self)


class SimulatorStatistics(NamedTuple):
    """Totals over every request since the start or the last reset.

    Attributes:
        requests: Requests answered (batch lines included).
        items: Items carried by those requests.
        prompt_tokens: Their prompt tokens.
        completion_tokens: Their completion tokens.
        rate_limited: Responses with status 429 (real or injected).
        faults: Requests that had at least one fault injected.
        errors: Responses with a status of 400 or more.
        cached_tokens: Prompt tokens read from the prompt cache.
        cache_write_tokens: Prompt tokens written to the prompt cache.
        degraded: Answers a :class:`PackingDegradation` made wrong.
    """

    requests: int
    items: int
    prompt_tokens: int
    completion_tokens: int
    rate_limited: int
    faults: int
    errors: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    degraded: int = 0

    def as_dict(self) -> dict[str, int]:
        """Return the totals as a JSON-able dict."""
        return self._asdict()


class Ledger:
    """The request log; safe to read from another thread than the server's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def add(self, record: RequestRecord) -> None:
        """Append one finished request's record."""
        with self._lock:
            self._records.append(record)

    def records(self) -> tuple[RequestRecord, ...]:
        """Return every record so far, in order of completion."""
        with self._lock:
            return tuple(self._records)

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._records.clear()

    def statistics(self) -> SimulatorStatistics:
        """Return the totals over every record."""
        records = self.records()
        return SimulatorStatistics(
            requests=len(records),
            items=sum(r.items for r in records),
            prompt_tokens=sum(r.prompt_tokens for r in records),
            completion_tokens=sum(r.completion_tokens for r in records),
            rate_limited=sum(r.status == 429 for r in records),
            faults=sum(bool(r.faults) for r in records),
            errors=sum(r.status >= 400 for r in records),
            cached_tokens=sum(r.cached_tokens for r in records),
            cache_write_tokens=sum(r.cache_write_tokens for r in records),
            degraded=sum(r.degraded for r in records),
        )
