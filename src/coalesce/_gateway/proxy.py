"""Every path the gateway does not coalesce, proxied untouched: models, embeddings,
files, batches, ``GET /v1/responses/{id}``, ...

The request goes to the provider it is for (Anthropic's when it carries
``anthropic-version`` or ``x-api-key``, which its SDK always sends; OpenAI's
otherwise) with its method, path, query, headers and body as they came (the body
streamed through, not read whole), and the upstream's response comes back byte for
byte: its status, its headers (compressed bodies stay compressed) and its body,
streamed as it arrives. Only hop-by-hop headers and the gateway's own ``x-coalesce*``
ones are dropped and, in ``--api-key`` mode, the client's key is checked and replaced by
the gateway's upstream key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .callers import Unauthorized, read_caller
from .errors import error_response
from .state import GatewayState

__all__ = ["provider_of", "proxy", "upstream_url"]

_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host",
    }
)  # fmt: skip
_CREDENTIALS = ("authorization", "x-api-key")


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
    headers.setdefault("accept-encoding", "identity")  # not httpx's own default
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
    started = anyio.current_time()
    provider = provider_of(request.headers)
    assert state.upstreams is not None  # the routes run between startup and shutdown
    upstream, http = state.upstreams.of(provider), state.upstreams.http
    try:
        headers = _headers(state, provider, request.headers)
    except Unauthorized as exc:
        return error_response(provider, 401, str(exc))
    if state.config.holds_keys and not upstream.has_key:
        return error_response(provider, 503, f"this gateway holds no {provider} key")
    url = upstream_url(upstream.base_url, request.url.path, request.url.query)
    sent = http.build_request(request.method, url, headers=headers, content=request.stream())
    try:
        response = await http.send(sent, stream=True)
    except httpx.TimeoutException:
        return error_response(provider, 504, "the upstream did not answer in time")
    except httpx.HTTPError:
        return error_response(provider, 502, "the gateway could not reach the upstream; try again")
    path, method, status = request.url.path, request.method, response.status_code

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
            seconds = anyio.current_time() - started
            state.metrics.proxied(provider, method, path, status, seconds)

    reply = StreamingResponse(body(), status)
    reply.raw_headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers.multi_items()
        if name.lower() not in _HOP and name.lower() not in ("date", "server")
    ]
    return reply
