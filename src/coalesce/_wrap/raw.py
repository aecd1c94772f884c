"""Raw responses of coalesced calls, and their streams, built the SDK's way; a caller's
own time limit.

``client.chat.completions.with_raw_response.create(...)`` (and
``with_streaming_response``, on the client or on the resource) is the SDK's wrapper
around the resource's ``create``: it adds the ``X-Stainless-Raw-Response`` header and
expects the SDK's raw-response object back. A coalesced call's reply becomes such an
object (:func:`raw_response`): the SDK's own ``LegacyAPIResponse`` / ``AsyncAPIResponse``
around a synthetic ``httpx2`` response whose body is the reply's JSON (a streamed
call's body is its server-sent events), so ``.parse()``, ``.headers``, ``.json()``,
``.iter_lines()`` and ``http_response`` behave as the SDK's.

A streamed call that did not ask for the raw response gets what the SDK itself makes of
such a response: its ``.parse()``, the SDK's own ``AsyncStream`` of the event type
(``openai.AsyncStream[ChatCompletionChunk]``, ``anthropic.AsyncStream[RawMessageStreamEvent]``...),
whose ``response`` is that synthetic response. Every attribute of the stream is then
the SDK's, and the SDK's stream helpers (``chat.completions.stream``,
``responses.stream``) take it as they take their own.

A call's ``timeout=`` (else its client's ``timeout``) is that caller's own limit
(:func:`call_limit`; its translator reads ``timeout=`` into the call); past it the caller gets the SDK's own ``APITimeoutError``
(:func:`timeout_error`), and the request runs on for the others.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from ..providers import _sdk_anthropic, _sdk_openai
from ..providers._sdk import timeout_seconds
from .headers import without_headers
from .registry import Endpoint
from .stream import Events

__all__ = ["RAW_HEADER", "call_limit", "raw_mode", "raw_response", "timeout_error"]

#: The header the SDKs' raw-response wrappers add to a call: ``"true"`` (openai's
#: ``with_raw_response``), ``"raw"`` (anthropic's), ``"stream"`` (``with_streaming_response``).
RAW_HEADER = "x-stainless-raw-response"
#: Where each SDK reads a response's request id.
_REQUEST_ID = {"openai": "x-request-id", "anthropic": "request-id"}


def raw_mode(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``kwargs`` without the SDK's raw-response header, and that header's value
    (``None``: the caller asked for the parsed object).

    Args:
        kwargs: Keyword arguments of an SDK method.
    """
    headers = kwargs.get("extra_headers")
    if not isinstance(headers, Mapping):
        return dict(kwargs), None
    ours = [name for name in headers if isinstance(name, str) and name.lower() == RAW_HEADER]
    if not ours:
        return dict(kwargs), None
    return without_headers(kwargs, ours), str(headers[ours[-1]])


def call_limit(given: Mapping[str, Any], own: float | None, default: Any) -> float | None:
    """The seconds a coalesced caller waits at most: its own ``timeout=`` (``own``, as
    its translator read it), none for ``timeout=None`` (as the SDK), else its client's
    ``timeout`` (``default``).

    Args:
        given: The call's keyword arguments, the SDK's "not given" sentinels left out.
        own: The call's ``timeout=`` in seconds, if it gave a number.
        default: The client's ``timeout``.
    """
    if own is not None:
        return own
    return None if "timeout" in given else timeout_seconds(default)


def timeout_error(sdk: str, url: str) -> Exception:
    """The SDK's own ``APITimeoutError`` for a call to ``url``."""
    import httpx2

    module = importlib.import_module(sdk)
    return module.APITimeoutError(request=httpx2.Request("POST", url))  # type: ignore[no-any-return]


def _url(client: Any, endpoint: Endpoint) -> str:
    return str(client.base_url).rstrip("/") + endpoint.url


@functools.lru_cache(maxsize=64)
def _parsed_url(url: str) -> Any:
    """``url`` as an ``httpx2.URL``, parsed once (a request made from it copies it)."""
    import httpx2

    return httpx2.URL(url)


def _json_body(reply: Any) -> bytes:
    # A parsed reply's ``parsed`` field is typed by a type variable: pydantic warns.
    return str(reply.to_json(indent=None, warnings=False)).encode()


async def _events(events: Events) -> AsyncGenerator[bytes, None]:
    """``events`` as server-sent events. No ``[DONE]`` line at the end: the SDK's
    stream stops at the end of the body all the same, and, reading to the end, leaves
    no generator of its own unfinished."""
    try:
        async for event in events:
            kind = getattr(event, "type", None)
            head = f"event: {kind}\n" if isinstance(kind, str) else ""
            yield f"{head}data: {event.to_json(indent=None, warnings=False)}\n\n".encode()
    finally:
        await events.aclose()


def _response(request: Any, reply: Any, stream: bool, headers: dict[str, str]) -> Any:
    """The synthetic ``httpx2.Response`` of one reply, as if read from the server."""
    import httpx2

    if not stream:
        headers["content-type"] = "application/json"
        return httpx2.Response(200, headers=headers, content=_json_body(reply), request=request)

    class Body(httpx2.AsyncByteStream):
        def __init__(self) -> None:
            self.events = _events(reply)

        def __aiter__(self) -> AsyncIterator[bytes]:
            return self.events

        async def aclose(self) -> None:
            await self.events.aclose()

    headers["content-type"] = "text/event-stream"
    return httpx2.Response(200, headers=headers, stream=Body(), request=request)


def _type(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _headers(
    sdk: str, own_id: str | None, reply_id: str | None, group_size: int | None
) -> dict[str, str]:
    """A coalesced call's response headers: its request id, and what coalesce did."""
    headers = {_REQUEST_ID[sdk]: str(own_id or f"req_{uuid.uuid4().hex}"), "x-coalesce": "on"}
    if reply_id:
        headers["x-coalesce-reply-id"] = reply_id
    if group_size is not None:
        headers["x-coalesce-group-size"] = str(group_size)
    return headers


@functools.lru_cache(maxsize=64)
def _options_template(kind: Any, url: str, no_parser: Any) -> Any:
    """The SDK's request options of a post to ``url`` without a parser, made once."""
    return kind.construct(method="post", url=url, headers={}, post_parser=no_parser)


def _request_options(kind: Any, url: str, headers: dict[str, str], no_parser: Any) -> Any:
    """``kind.construct(method="post", url=url, headers=headers, post_parser=no_parser)``,
    as a copy of the options made once for ``url``: every default that is a dict (the
    query, ...) copied too, so that no two responses share one (as ``construct`` makes
    them afresh)."""
    template = _options_template(kind, url, no_parser)
    update = {name: dict(value) for name, value in vars(template).items() if type(value) is dict}
    update["headers"] = headers
    options = template.model_copy(update=update)
    # Fields given, as construct() would have them (model_copy counts the update's too).
    options.__pydantic_fields_set__ = set(template.__pydantic_fields_set__)
    return options


def raw_response(
    client: Any,
    sdk: str,
    mode: str | None,
    reply: Any,
    endpoint: Endpoint,
    *,
    stream: bool = False,
    parsed: bool = False,
    waited: float = 0.0,
    reply_id: str | None = None,
    group_size: int | None = None,
) -> Any:
    """The SDK's raw-response object for a coalesced ``reply``.

    Args:
        client: The wrapped client (the response's ``parse()`` goes through it).
        sdk: ``"openai"`` or ``"anthropic"``.
        mode: The raw-response header's value (see :data:`RAW_HEADER`); ``None`` for a
            call that asked for no raw response: the ``AsyncAPIResponse`` the SDK
            itself parses a reply from (for a stream, its ``AsyncStream``).
        reply: The SDK's object the call returns without ``with_raw_response``, or
            the :data:`~coalesce._wrap.stream.Events` of a streamed call.
        stream: The call asked for a stream (``stream=True``).
        endpoint: Where the method posts, and its stream's event type.
        parsed: A ``parse()`` method: ``.parse()`` gives ``reply`` itself, as the SDK's
            own ``parse`` post-processes its reply.
        waited: Seconds the caller waited (the response's ``elapsed``).
        reply_id: The id of the packed reply that carried the call, if known.
        group_size: Calls in the request that answered it (``x-coalesce-group-size``).
    """
    import httpx2

    module = importlib.import_module(sdk)
    sent = {} if mode is None else {RAW_HEADER: mode}
    request = httpx2.Request("POST", _parsed_url(_url(client, endpoint)), headers=sent)
    headers = _headers(sdk, None if stream else getattr(reply, "id", None), reply_id, group_size)
    response = _response(request, reply, stream, headers)
    response.elapsed = datetime.timedelta(seconds=waited)
    events = _type(endpoint.events)
    internals = _sdk_openai if sdk == "openai" else _sdk_anthropic
    if parsed:
        options = internals.FinalRequestOptions.construct(
            method="post", url=endpoint.url, headers=sent, post_parser=lambda _: reply
        )
    else:
        kind = internals.FinalRequestOptions
        options = _request_options(kind, endpoint.url, sent, module.NOT_GIVEN)
    # openai's with_raw_response gives its LegacyAPIResponse; the rest AsyncAPIResponse.
    legacy = mode == "true"
    kind = internals.LegacyAPIResponse if legacy else internals.AsyncAPIResponse
    return kind(
        raw=response,
        cast_to=events if stream else type(reply),
        client=client,
        stream=stream,
        stream_cls=module.AsyncStream[events] if stream else None,
        options=options,
    )
