"""The coalescing routes: ``POST /v1/chat/completions``, ``/v1/responses`` and
``/v1/messages``, each answered through ``coalesce.wrap``.

One call's path (:func:`answer`):

1. :func:`read_call`: the body, at most ``max_body_size`` bytes (else 413), as JSON
   with a model (else 400 in the provider's shape), the ``x-coalesce*`` headers
   (:func:`~.controls.read_controls`), the caller (:func:`~.callers.read_caller`, else
   401), and, for a call that may share a request, the SDK method's keyword arguments
   (:func:`sdk_arguments`: fields the SDK does not name go in ``extra_body``, and then
   ``wrap`` passes the call through untouched);
2. a call that cannot share a request (``x-coalesce: off``, or ``max_items`` 1) is
   proxied untouched (:func:`pass_through`): no SDK client, arguments or call, only the
   gateway's plain HTTP client (the fast path of docs/gateway.md's overhead figures);
3. otherwise the SDK method's ``with_streaming_response`` form on the caller's copy of
   the wrapped client: ``wrap`` coalesces the call, or passes it through, and either way
   returns the SDK's raw response;
4. :func:`relay`: its status, headers and body to the client, a stream event for event,
   with the ``x-coalesce-*`` reply headers; an error as :mod:`.errors` shapes it.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .._exceptions import ConfigurationError
from .anthropic_beta import general_form
from .callers import Caller, Unauthorized, read_caller
from .controls import GROUP_SIZE_HEADER, Controls, read_controls, reply_headers, served_lane
from .errors import error_response, failure_response, reply_headers_of
from .logs import label
from .proxy import forward
from .state import GatewayState
from .upstream import PARTITION

__all__ = ["APIS", "Api", "Call", "Refused", "answer", "read_body", "read_call", "sdk_arguments"]

#: The SDK methods' arguments that are not API fields: never taken from a body.
_TRANSPORT = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
#: Request headers that travel upstream with a coalesced call (besides its credential).
_FORWARDED = ("anthropic-version", "openai-beta")
_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Api:
    """One coalescing route.

    Attributes:
        name: ``"openai.chat"``, ``"openai.responses"`` or ``"anthropic.messages"``.
        provider: ``"openai"`` or ``"anthropic"``.
        resource: The SDK resource's path on the client (``"chat.completions"``).
        path: The route's path.
    """

    name: str
    provider: str
    resource: str
    path: str


APIS = (
    Api("openai.chat", "openai", "chat.completions", "/v1/chat/completions"),
    Api("openai.responses", "openai", "responses", "/v1/responses"),
    Api("anthropic.messages", "anthropic", "messages", "/v1/messages"),
)


@dataclass(frozen=True)
class Call:
    """One call, read and checked."""

    api: Api
    model: str
    controls: Controls
    caller: Caller
    method: Any  # the SDK method's with_streaming_response form, on the caller's copy;
    # None for a call proxied untouched (and then kwargs is empty)
    kwargs: dict[str, Any]
    started: float
    body: bytes


class Refused(Exception):
    """A call the gateway answers itself, with ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@functools.lru_cache(maxsize=16)
def _parameters(method: Callable[..., Any]) -> tuple[frozenset[str], tuple[str, ...]]:
    """The API fields an SDK method names, and those it requires."""
    fields = {
        name: p
        for name, p in inspect.signature(method).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in _TRANSPORT
    }
    required = tuple(name for name, p in fields.items() if p.default is inspect.Parameter.empty)
    return frozenset(fields), required


def sdk_arguments(
    method: Callable[..., Any], body: Mapping[str, Any], headers: Mapping[str, str]
) -> dict[str, Any]:
    """The keyword arguments of ``method`` (an SDK resource's ``create``, as its class
    defines it) for a request ``body``.

    Fields the method names are its arguments; the others go in ``extra_body`` (so the
    SDK sends them, and ``wrap`` passes the call through untouched); ``headers`` go in
    ``extra_headers``. The SDK's own transport arguments are never read from a body.

    Raises:
        ConfigurationError: The body lacks a field the method requires.
    """
    names, required = _parameters(method)
    missing = [name for name in required if name not in body]
    if missing:
        raise ConfigurationError(f"the body lacks {', '.join(missing)}: give every required field")
    kwargs = {name: value for name, value in body.items() if name in names}
    extra = {name: value for name, value in body.items() if name not in names}
    if extra:
        kwargs["extra_body"] = extra
    if headers:
        kwargs["extra_headers"] = dict(headers)
    return kwargs


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) once it is over ``limit`` bytes: by its declared
    length before any of it is read, else as it streams in."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> Refused:
    return Refused(
        413,
        f"the request body is larger than this gateway's limit of {limit} bytes; send a"
        " smaller call, or start the gateway with a larger --max-body-size",
    )


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(data, dict):
        raise Refused(400, f"the body must be a JSON object, got {type(data).__name__}")
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise Refused(400, "the body has no model: give the model's name as a string")
    return data


def _resource(
    client: Any, api: Api, headers: Mapping[str, str], data: dict[str, Any]
) -> tuple[Any, list[str], dict[str, Any]]:
    """The SDK resource a call goes through, its betas (Anthropic's beta header) and its
    body (beta structured outputs read as ``output_config``: :func:`general_form`)."""
    betas = [b.strip() for b in headers.get("anthropic-beta", "").split(",") if b.strip()]
    if api.provider == "anthropic":
        data, betas = general_form(data, betas)
        if betas:
            return client.beta.messages, betas, data
    resource = client
    for part in api.resource.split("."):
        resource = getattr(resource, part)
    return resource, [], data


async def read_call(state: GatewayState, api: Api, request: Request) -> Call:
    """Read and check one call (step 1 of the module doc).

    Raises:
        Refused: A malformed call (400), a missing or refused key (401), or a gateway
            without the upstream key it should hold (503).
    """
    started = time.monotonic()
    config, headers = state.config, request.headers
    raw = await read_body(request, config.max_body_size)
    data = _json(raw)
    try:
        controls = read_controls(headers.items(), budget=config.budget, lane=config.lane)
        caller = read_caller(api.provider, headers, config.api_keys)
    except ConfigurationError as exc:
        raise Refused(400, str(exc)) from None
    except Unauthorized as exc:
        raise Refused(401, str(exc)) from None
    assert state.upstreams is not None  # the routes run between startup and shutdown
    upstream = state.upstreams.of(api.provider)
    if config.holds_keys and not upstream.has_key:
        raise Refused(503, f"this gateway holds no {api.provider} key; set it and restart")
    model = state.metrics.model(data["model"])
    if config.max_items == 1 or not controls.coalesce:  # proxied as it came: no SDK call
        return Call(api, model, controls, caller, None, {}, started, raw)
    resource, betas, data = _resource(upstream.client_for(caller), api, headers, data)
    sent = {name: headers[name] for name in _FORWARDED if name in headers}
    try:
        method = resource.with_streaming_response.create
        kwargs = sdk_arguments(type(resource).create, data, {**sent, **controls.forwarded})
    except ConfigurationError as exc:
        raise Refused(400, str(exc)) from None
    if betas:
        kwargs["betas"] = betas
    return Call(api, model, controls, caller, method, kwargs, started, raw)


async def answer(state: GatewayState, api: Api, request: Request) -> Response:
    """``POST`` to a coalescing route: the call's reply (see the module doc)."""
    metrics = state.metrics
    metrics.in_flight.inc()
    try:
        call = await read_call(state, api, request)
    except Refused as exc:
        metrics.in_flight.dec()
        return error_response(api.provider, exc.status, str(exc))
    lane = served_lane(call.controls.lane)
    if call.method is None:  # x-coalesce: off, or max_items 1
        return await pass_through(state, call, lane, request)
    token = PARTITION.set(call.caller.partition)
    try:
        manager = call.method(**call.kwargs)
        response = await manager.__aenter__()
    except Exception as exc:
        failed = failure_response(api.provider, exc)
        _finished(state, call, lane, failed.status_code)
        return failed
    finally:
        PARTITION.reset(token)
    return await relay(state, call, lane, manager, response)


async def pass_through(state: GatewayState, call: Call, lane: str, request: Request) -> Response:
    """A call that cannot share a request (``x-coalesce: off``, or a gateway with
    ``max_items`` 1): proxied untouched, as ``wrap`` would pass it through, without the
    cost of an SDK call."""

    def done(status: int) -> None:
        _finished(state, call, lane, status, alone=True)

    def told(upstream: Mapping[str, str]) -> dict[str, str]:
        return _told(upstream, False, lane)

    return await forward(state, call.api.provider, request, call.body, done, told)


async def relay(
    state: GatewayState, call: Call, lane: str, manager: Any, response: Any
) -> Response:
    """The SDK's raw ``response`` to the client: its status, headers and body (a stream
    event for event), with the ``x-coalesce-*`` headers of what is known."""
    lane = response.headers.get("x-coalesce-lane", lane)  # issue 23: the lane that answered
    coalesced = response.headers.get("x-coalesce") == "on"
    headers = reply_headers_of(response.headers)
    headers.update(_told(response.headers, coalesced, lane))
    status = response.status_code
    if "text/event-stream" not in response.headers.get("content-type", ""):
        reply: Response
        try:
            reply = Response(await response.read(), status, headers)
        except Exception as exc:  # the body broke off: the connection dropped
            reply = failure_response(call.api.provider, exc)
        finally:
            await manager.__aexit__(None, None, None)
        _finished(state, call, lane, reply.status_code, alone=not coalesced)
        return reply
    done = coalesced and call.api.name == "openai.chat"

    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.iter_bytes():
                yield chunk
            if done:  # the SDKs' streams end with the body; other clients wait for this
                yield _DONE
        finally:
            with anyio.CancelScope(shield=True):
                await manager.__aexit__(None, None, None)
            _finished(state, call, lane, status, alone=not coalesced)

    return StreamingResponse(events(), status, headers)


def _told(upstream: Mapping[str, str], coalesced: bool, lane: str) -> dict[str, str]:
    """The reply's ``x-coalesce-*`` headers: for a coalesced call, the packed reply and
    its group's size as ``wrap`` tells them on the raw response; a passed-through call
    went alone, as its own request."""
    if coalesced:
        reply_id = upstream.get("x-coalesce-reply-id")
        told = upstream.get(GROUP_SIZE_HEADER, "")
        size = int(told) if told.isdigit() else None
    else:
        reply_id = upstream.get("x-request-id") or upstream.get("request-id")
        size = 1
    return reply_headers(lane=lane, group_size=size, request_id=reply_id and label(reply_id))


def _finished(
    state: GatewayState, call: Call, lane: str, status: int, *, alone: bool = False
) -> None:
    """Count a call that got its reply (and, passed through, its upstream request)."""
    metrics, api = state.metrics, call.api
    seconds = time.monotonic() - call.started
    metrics.in_flight.dec()
    if alone:
        metrics.alone(api.provider, api.name, call.model, lane, status, seconds)
    metrics.call_done(api.name, call.model, lane, status, seconds, call.controls.budget)
