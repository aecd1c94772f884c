"""Any OpenAI-compatible endpoint (vLLM, TGI, llama.cpp server, Ollama) over ``httpx``.

Also home of the small pieces every provider shares: header normalisation, the
collector that assembles a streamed reply, retry advice from an HTTP status, and
recognising a transport error without importing its library.
"""

from __future__ import annotations

import json
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from types import TracebackType
from typing import Any

import httpx

from .._batching.runtime import current_time
from ._base import Completion, CompletionRequest, RetryAdvice, Usage
from ._shapes import openai_response_format

__all__ = [
    "REPLY_FIELDS",
    "Collector",
    "OpenAICompatibleProvider",
    "chat_completion",
    "chat_url",
    "lower_headers",
    "read_chat_stream",
    "retry_after",
    "status_advice",
    "transport_error_kind",
]

_VERSIONED = re.compile(r"/v\d+$")
#: What a chat completion (or each of its chunks) says about itself, kept in
#: :attr:`Completion.reply`.
REPLY_FIELDS = ("id", "created", "model", "system_fingerprint", "service_tier")
#: Statuses worth sending again: request timeout, conflict, rate limit.
RETRY_STATUSES = frozenset({408, 409, 429})


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked to wait, from ``retry-after-ms`` or ``retry-after``.

    Only numbers are understood; an HTTP date (rare for APIs) gives ``None``, since
    reading it would need the wall clock.

    Args:
        headers: Response headers; names are matched case-insensitively.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            seconds = float(lowered[name]) * scale
        except (KeyError, ValueError):
            continue
        if 0 <= seconds < float("inf"):
            return seconds
    return None


def status_advice(status: int, headers: Mapping[str, str]) -> RetryAdvice:
    """Whether a response with HTTP ``status`` is worth retrying, and when.

    408, 409, 429 and every 5xx (including Anthropic's 529 "overloaded") are retried;
    other statuses are the request's own fault. An explicit ``x-should-retry`` header
    (sent by OpenAI and Anthropic) wins.

    Args:
        status: The HTTP status code.
        headers: The response headers.
    """
    lowered = {name.lower(): value.lower() for name, value in headers.items()}
    should = lowered.get("x-should-retry")
    if should in ("true", "false"):
        retry = should == "true"
    else:
        retry = status in RETRY_STATUSES or status >= 500
    after = retry_after(headers) if retry else None
    return RetryAdvice(retry=retry, after=after, headers={k.lower(): v for k, v in headers.items()})


def lower_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Response headers as a plain dict with lower-case names.

    Args:
        headers: ``(name, value)`` pairs (``headers.items()`` of any HTTP library).
    """
    return {name.lower(): value for name, value in headers}


class Collector:
    """Assembles a streamed reply: text pieces, time to first text, the total time.

    Args:
        on_text: Receives each non-empty text delta.
    """

    def __init__(self, on_text: Callable[[str], None] | None) -> None:
        self.start = current_time()
        self.pieces: list[str] = []
        self.ttft: float | None = None
        self._on_text = on_text

    def add(self, delta: str | None) -> None:
        """Record one text delta and pass it on.

        Args:
            delta: The delta; empty or ``None`` is ignored.
        """
        if not delta:
            return
        if self.ttft is None:
            self.ttft = current_time() - self.start
        self.pieces.append(delta)
        if self._on_text is not None:
            self._on_text(delta)

    @property
    def text(self) -> str:
        """The text so far."""
        return "".join(self.pieces)

    def elapsed(self) -> float:
        """Seconds since the collector was made (when the request was sent)."""
        return current_time() - self.start


def chat_url(base_url: str) -> str:
    """The chat-completions URL of an OpenAI-compatible server.

    A base URL ending in ``/chat/completions`` is used as is; one ending in a version
    segment (``/v1``, ``/v2``...) gets ``/chat/completions``; any other gets
    ``/v1/chat/completions``. So ``http://localhost:8000`` and
    ``http://localhost:8000/v1`` both work.

    Args:
        base_url: The server's URL.
    """
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if _VERSIONED.search(url):
        return f"{url}/chat/completions"
    return f"{url}/v1/chat/completions"


def chat_body(
    request: CompletionRequest,
    *,
    structured: bool,
    strict: bool = True,
    max_tokens_key: str = "max_tokens",
) -> dict[str, Any]:
    """The JSON body (or SDK keyword arguments) of a chat-completions request.

    ``request.options`` come first, so the request's own fields win.

    Args:
        request: The request.
        structured: Send ``reply_schema`` as a ``json_schema`` response format.
        strict: Ask for strict schema adherence.
        max_tokens_key: ``max_tokens`` (every compatible server knows it) or OpenAI's
            newer ``max_completion_tokens``.
    """
    body: dict[str, Any] = {
        **request.options,
        "model": request.model,
        "messages": [
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.user},
        ],
    }
    if request.max_output_tokens is not None:
        body[max_tokens_key] = request.max_output_tokens
    if structured and request.reply_schema is not None:
        body["response_format"] = openai_response_format(
            request.reply_schema, name=request.schema_name, strict=strict
        )
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def openai_usage(data: Any) -> Usage | None:
    """A :class:`Usage` from an OpenAI-style ``usage`` object (JSON), if present.

    Args:
        data: The ``usage`` value.
    """
    if not isinstance(data, Mapping):
        return None
    details = data.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Usage(
        input_tokens=int(data.get("prompt_tokens") or 0),
        output_tokens=int(data.get("completion_tokens") or 0),
        cached_input_tokens=int(cached or 0),
    )


async def sse_data(lines: AsyncIterator[str]) -> AsyncGenerator[Any, None]:
    """The JSON payloads of ``data:`` lines, until ``data: [DONE]``.

    The body is read to its end even after ``[DONE]``: stopping early would leave the
    HTTP library's nested body iterators to the garbage collector, which trio reports
    as a ``ResourceWarning``.

    Args:
        lines: The response's lines.
    """
    done = False
    async for line in lines:
        if done or not line.startswith("data:"):
            continue  # event:, id:, comments, blank separators, anything after [DONE]
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
        elif payload:
            yield json.loads(payload)


class OpenAICompatibleProvider:
    """Any server speaking OpenAI's Chat Completions API, over plain ``httpx``.

    Args:
        base_url: The server's URL, with or without ``/v1`` (see :func:`chat_url`).
        api_key: Sent as ``Authorization: Bearer``; ``None`` sends no key.
        timeout: Seconds for each network operation (connect, each read...).
        structured: Whether the server enforces ``response_format`` ``json_schema``
            (vLLM, llama.cpp, Ollama do); if not, the reply format is only described
            in the prompt.
        headers: More headers for every request.
        http_client: An ``httpx.AsyncClient`` to use (it stays yours to close);
            ``None`` makes one, closed by :meth:`aclose`.
        name: The provider's name in statistics.
        enforces_schema: Whether the server holds every reply to the schema (a
            grammar, strict structured outputs). Default ``False``: many servers accept
            ``response_format`` and ignore it, so streamed answers are held until the
            reply ends.

    Raises on :meth:`complete`:
        httpx.HTTPStatusError: A non-2xx answer; the message carries the body.
        httpx.TimeoutException: The server did not answer in time.
        httpx.TransportError: The connection failed or dropped.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        structured: bool = True,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        name: str = "openai-compatible",
        enforces_schema: bool = False,
    ) -> None:
        self.name = name
        self.structured = structured
        self.enforces_schema = enforces_schema
        self.url = chat_url(base_url)
        self._headers = dict(headers or {})
        if api_key is not None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(timeout)
        self._owns_client = http_client is None
        self._client = http_client or httpx.AsyncClient()

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        """POST ``request`` to :attr:`url` with ``httpx``; stream it if ``request.stream``.

        Args:
            request: The request.
            on_text: Receives each text delta of a streamed reply.

        Raises:
            httpx.HTTPStatusError: A non-2xx answer.
            httpx.TimeoutException: The server did not answer in time.
            httpx.TransportError: The connection failed or dropped.
        """
        body = chat_body(request, structured=self.structured)
        collector = Collector(on_text)
        http_request = self._client.build_request(
            "POST", self.url, json=body, headers=self._headers, timeout=self._timeout
        )
        response = await self._client.send(http_request, stream=True)
        try:
            await _raise_for_status(response)
            if request.stream:
                return await _read_stream(response, collector)
            return await _read_body(response, collector)
        finally:
            await response.aclose()

    def advise(self, error: BaseException) -> RetryAdvice:
        """Retry 408, 409, 429 (after ``retry-after``), 5xx, timeouts and dropped connections.

        Args:
            error: What :meth:`complete` raised.
        """
        if isinstance(error, httpx.HTTPStatusError):
            response = error.response
            return status_advice(response.status_code, lower_headers(response.headers.items()))
        if isinstance(error, httpx.UnsupportedProtocol):
            return RetryAdvice(retry=False)
        return RetryAdvice(retry=isinstance(error, (httpx.TimeoutException, httpx.TransportError)))

    async def aclose(self) -> None:
        """Close the HTTP client, if this provider made it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> OpenAICompatibleProvider:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<OpenAICompatibleProvider url={self.url!r} structured={self.structured}>"


async def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    body = (await response.aread()).decode("utf-8", errors="replace")
    message = f"{response.status_code} {response.reason_phrase} from {response.url}: {body[:2000]}"
    raise httpx.HTTPStatusError(message, request=response.request, response=response)


async def _read_body(response: httpx.Response, collector: Collector) -> Completion:
    data = json.loads(await response.aread())
    return chat_completion(data, collector, lower_headers(response.headers.items()))


def chat_completion(
    data: Mapping[str, Any],
    collector: Collector,
    headers: dict[str, str],
    fields: Sequence[str] = (),
) -> Completion:
    """The :class:`Completion` of a chat completion's JSON (not streamed).

    Args:
        data: The reply's JSON.
        collector: Its timing.
        headers: The response headers.
        fields: The reply's fields kept as :attr:`Completion.reply` (if not null).
    """
    choice = (data.get("choices") or [{}])[0]
    finish = choice.get("finish_reason")  # compatible servers may send null
    return Completion(
        text=(choice.get("message") or {}).get("content") or "",
        finish_reason=finish if isinstance(finish, str) and finish else "stop",
        usage=openai_usage(data.get("usage")),
        seconds=collector.elapsed(),
        headers=headers,
        reply={k: data[k] for k in fields if data.get(k) is not None},
    )


async def _read_stream(response: httpx.Response, collector: Collector) -> Completion:
    headers = lower_headers(response.headers.items())
    return await read_chat_stream(response.aiter_lines(), collector, headers, _stream_error)


def _stream_error(error: Mapping[str, Any]) -> Exception:
    return ValueError(f"the server reported an error mid-stream: {json.dumps(error)[:2000]}")


async def read_chat_stream(
    lines: AsyncIterator[str],
    collector: Collector,
    headers: dict[str, str],
    error: Callable[[Mapping[str, Any]], Exception],
) -> Completion:
    """Read a streamed chat completion (server-sent events) to its end.

    Args:
        lines: The response body's lines.
        collector: Receives the text deltas.
        headers: The response headers, for the completion.
        error: Makes the exception for an ``{"error": ...}`` event.

    Raises:
        Exception: ``error(...)`` for an error event.
    """
    finish_reason = "stop"
    usage: Usage | None = None
    reply: dict[str, Any] = {}
    async with aclosing(sse_data(lines)) as events:
        async for chunk in events:
            if isinstance(chunk.get("error"), Mapping):
                raise error(chunk["error"])
            if not reply:
                reply = {k: chunk[k] for k in REPLY_FIELDS if chunk.get(k) is not None}
            usage = openai_usage(chunk.get("usage")) or usage
            for choice in chunk.get("choices") or []:
                collector.add((choice.get("delta") or {}).get("content"))
                finish_reason = choice.get("finish_reason") or finish_reason
    return Completion(
        text=collector.text,
        finish_reason=finish_reason,
        usage=usage,
        ttft=collector.ttft,
        seconds=collector.elapsed(),
        headers=headers,
        reply=reply,
    )


def transport_error_kind(error: BaseException) -> str | None:
    """``"timeout"`` or ``"connection"`` for an httpx / httpx2 request error, else ``None``.

    Recognised by class name, so neither transport is imported: the SDKs wrap these
    while sending, but can let them through while a stream is read.

    Args:
        error: The exception.
    """
    names = {cls.__name__ for cls in type(error).__mro__}
    if type(error).__module__.split(".")[0] not in ("httpx", "httpx2"):
        return None
    if "RequestError" not in names:
        return None
    return "timeout" if "TimeoutException" in names else "connection"
