"""Every path the gateway does not coalesce, proxied untouched: models, embeddings,
files, batches, ``GET /v1/responses/{id}``, ...

The request goes to the provider it is for (Anthropic's when it carries
``anthropic-version`` or ``x-api-key``, which its SDK always sends; OpenAI's
otherwise) with its method, path, query, headers and body as they came (the body
streamed through, not read whole), and the upstream's response comes back byte for
byte: its status, its headers (compressed bodies stay compressed) and its body,
streamed as it arrives (a small reply of known length is read whole first, which costs
less than a stream). Only hop-by-hop headers and the gateway's own ``x-coalesce*``
ones are dropped and, in ``--api-key`` mode, the client's key is checked and replaced by
the gateway's upstream key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import urlsplit

import aiohttp
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .callers import Unauthorized, read_caller
from .errors import error_response
from .state import GatewayState

__all__ = ["forward", "provider_of", "proxy", "upstream_url"]

_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host",
    }
)  # fmt: skip
_CREDENTIALS = ("authorization", "x-api-key")
#: Response headers not passed on: hop-by-hop ones, and those the gateway's server writes.
_DROPPED = _HOP | {"date", "server"}
#: Request headers aiohttp would add when the client sent none: a proxied request carries
#: the client's own, or none (``Host`` and the body's length are still written).
_NOT_ADDED = frozenset({"User-Agent", "Accept", "Content-Type"})
#: Replies up to this many bytes, of a known length, are read whole before they are
#: passed on; longer ones, and streams, are passed on as they arrive.
_WHOLE = 1024 * 1024


def provider_of(headers: Mapping[str, str]) -> str:
    """Which provider a request is for: Anthropic's if it carries ``anthropic-version``
    or ``x-api-key``, else OpenAI's."""
    return "anthropic" if "anthropic-version" in headers or "x-api-key" in headers else "openai"


def upstream_url(base_url: str, path: str, query: str) -> str:
    """Where a request for ``path`` goes under ``base_url``: ``/v1/files`` under
    ``https://api.openai.com/v1`` is ``https://api.openai.com/v1/files`` (the ``/v1``
    the base ends with is the path's own)."""
    base = base_url.rstrip("/")
    if urlsplit(base).path.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
        path = path[3:]
    return f"{base}{path}" + (f"?{query}" if query else "")


def _headers(state: GatewayState, provider: str, given: Mapping[str, str]) -> dict[str, str]:
    """The request's headers as sent upstream (see the module doc).

    Raises:
        Unauthorized: ``--api-key`` mode, and the key is missing or not the gateway's.
    """
    headers = {
        name: value
        for name, value in given.items()
        if name not in _HOP and not name.startswith("x-coalesce")  # the gateway's own
    }
    headers.setdefault("accept-encoding", "identity")  # not the HTTP client's default
    config = state.config
    if config.holds_keys:
        read_caller(provider, given, config.api_keys)
        key = config.openai_api_key if provider == "openai" else config.anthropic_api_key
        for name in _CREDENTIALS:
            headers.pop(name, None)
        if "x-api-key" in given:
            headers["x-api-key"] = key or ""  # as the client sent its own
        else:
            headers["authorization"] = f"Bearer {key}"
    return headers


async def proxy(state: GatewayState, request: Request) -> Response:
    """Any other request, to its upstream and back (see the module doc)."""
    started = time.monotonic()
    provider = provider_of(request.headers)
    path, method = request.url.path, request.method

    def done(status: int) -> None:
        seconds = time.monotonic() - started
        state.metrics.proxied(provider, method, path, status, seconds)

    headers = request.headers
    sends = "content-length" in headers or "transfer-encoding" in headers
    return await forward(state, provider, request, request.stream() if sends else None, done)


async def forward(
    state: GatewayState,
    provider: str,
    request: Request,
    content: bytes | AsyncIterator[bytes] | None,
    done: Callable[[int], None],
    told: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None,
) -> Response:
    """``request`` (its method, path, query and headers, with ``content`` for its body)
    to ``provider``'s upstream, and the upstream's response back, streamed.

    Args:
        state: The gateway's state.
        provider: ``"openai"`` or ``"anthropic"``.
        request: The client's request.
        content: Its body: the bytes already read, its stream, or ``None`` (none).
        done: Called with the status once the response has been relayed, or failed
            upstream.
        told: Headers to add to the response, from the upstream's.
    """
    assert state.upstreams is not None  # the routes run between startup and shutdown
    upstream, http = state.upstreams.of(provider), state.upstreams.http
    try:
        sent_headers = _headers(state, provider, request.headers)
    except Unauthorized as exc:
        return error_response(provider, 401, str(exc))
    if state.config.holds_keys and not upstream.has_key:
        return error_response(provider, 503, f"this gateway holds no {provider} key")
    url = upstream_url(upstream.base_url, request.url.path, request.url.query)
    try:
        response = await http.request(
            request.method,
            url,
            headers=sent_headers,
            data=content,
            allow_redirects=False,
            skip_auto_headers=_NOT_ADDED,
            proxy=upstream.proxy,
        )
    except asyncio.TimeoutError:
        done(504)
        return error_response(provider, 504, "the upstream did not answer in time")
    except aiohttp.ClientError:
        done(502)
        return error_response(provider, 502, "the gateway could not reach the upstream; try again")
    added = told(response.headers) if told is not None else {}
    if _small(response):
        return await _whole(provider, response, done, added)
    return _relayed(response, done, added)


def _relayed(
    response: aiohttp.ClientResponse, done: Callable[[int], None], headers: Mapping[str, str]
) -> Response:
    """The upstream's ``response`` as the gateway's, its body streamed as it arrives."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        finally:
            response.release()  # the connection goes back to the pool if the body ended
            done(response.status)

    reply = StreamingResponse(body(), response.status)
    reply.raw_headers = _raw_headers(response, headers)
    return reply


async def _whole(
    provider: str,
    response: aiohttp.ClientResponse,
    done: Callable[[int], None],
    headers: Mapping[str, str],
) -> Response:
    """The upstream's small, complete ``response`` read whole and passed on (cheaper than
    a stream; its bytes as they came, compressed or not)."""
    try:
        content = await response.read()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        done(502)
        return error_response(provider, 502, "the upstream's reply broke off; try again")
    finally:
        response.release()
    done(response.status)
    reply = Response(content, response.status)
    reply.raw_headers = _raw_headers(response, headers)
    return reply


def _raw_headers(
    response: aiohttp.ClientResponse, headers: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    kept = [
        (name.lower(), value)
        for name, value in response.raw_headers
        if name.lower().decode("latin-1") not in _DROPPED
    ]
    added = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    return kept + added


def _small(response: aiohttp.ClientResponse) -> bool:
    """A reply of a known, small length that is not a stream of events."""
    length = response.headers.get("content-length", "")
    kind = response.headers.get("content-type", "")
    return length.isdigit() and int(length) <= _WHOLE and "event-stream" not in kind
