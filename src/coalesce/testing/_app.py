"""The ASGI app: routing, the generation endpoints and the ``/_sim`` endpoints."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._accounting import RequestRecord
from ._anthropic import AnthropicFlavour
from ._asgi import (
    HttpError,
    HttpRequest,
    Receive,
    Scope,
    Send,
    SimulatedDisconnect,
    read_request,
    send_json,
    send_start,
    wait_for_disconnect,
)
from ._engine import Answer, Prompt, ReplyContext, compose, count_text, prompt_tokens, split_pieces
from ._faults import HTTP_FAULTS, Fault
from ._latency import Delays, compute_delays, pace
from ._openai import OpenAIFlavour
from ._ratelimit import RateDecision, RateLimiter, retry_headers

if TYPE_CHECKING:
    from ._provider import SimulatedProvider

__all__ = ["Flavour", "generate", "handle"]

StreamEvent = tuple["str | None", dict[str, Any], int]
Handler = Callable[
    ["SimulatedProvider", HttpRequest, "re.Match[str]", Receive, Send], Awaitable[None]
]

_FAULT_STATUS = {Fault.RATE_LIMIT: 429, Fault.SERVER_ERROR: 500, Fault.UNAVAILABLE: 503}
OPENAI = OpenAIFlavour()
ANTHROPIC = AnthropicFlavour()


class Flavour(Protocol):
    """What differs between the OpenAI and Anthropic APIs."""

    api: str
    id_prefix: str
    request_id_header: str
    done: bytes

    def parse(self, body: dict[str, Any]) -> Prompt: ...
    def render(self, answer: Answer, ctx: ReplyContext) -> dict[str, Any]: ...
    def stream(self, answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]: ...
    def error(self, status: int, message: str, kind: str) -> dict[str, Any]: ...
    def error_kind(self, status: int) -> str: ...
    def rate_headers(self, decision: RateDecision, unix_now: float) -> dict[str, str]: ...
    def sse(self, event: str | None, data: dict[str, Any]) -> bytes: ...


def flavour_of(path: str) -> Flavour:
    """Return the API flavour of a path (Anthropic under ``/v1/messages``)."""
    return ANTHROPIC if path.startswith("/v1/messages") else OPENAI


async def send_error(
    send: Send, flavour: Flavour, status: int, message: str, headers: dict[str, str] | None = None
) -> None:
    """Send an error in the flavour's shape.

    Args:
        send: The ASGI send callable.
        flavour: The API the request was for.
        status: The HTTP status.
        message: What went wrong.
        headers: Further headers.
    """
    body = flavour.error(status, message, flavour.error_kind(status))
    await send_json(send, status, body, headers or {})


def _rate_message(model: str, decision: RateDecision, limiter: RateLimiter) -> str:
    kind = (
        "requests"
        if decision.requests.limit is not None and decision.requests.remaining < 1
        else "tokens"
    )
    quota = decision.requests if kind == "requests" else decision.tokens
    return (
        f"Rate limit reached for {model} on {kind} per min: limit {quota.limit},"
        f" remaining {quota.remaining}. Please try again in {decision.retry_after:.3f}s."
    )


async def generate(
    sim: SimulatedProvider, flavour: Flavour, request: HttpRequest, receive: Receive, send: Send
) -> None:
    """Answer one Chat Completions or Messages request.

    Args:
        sim: The provider.
        flavour: The API.
        request: The request, fully read.
        receive: The ASGI receive callable (to notice a client going away).
        send: The ASGI send callable.

    Raises:
        HttpError: The request is invalid.
        SimulatedDisconnect: The ``disconnect`` fault dropped the connection.
    """
    body = request.json_object()
    prompt = flavour.parse(body)
    started = sim.clock.now()

    tokens_in = prompt_tokens(prompt, count_text)
    clean = compose(
        prompt, frozenset(), lengths=sim.output_tokens, rng=sim.faults.rng, count=count_text
    )
    decision = sim.limiter.check(request.api_key, tokens_in + clean.completion_tokens, started)
    ctx = ReplyContext(
        sim.next_id(flavour.id_prefix), int(sim.clock.unix(started)), tokens_in, prompt, body
    )
    headers = {
        flavour.request_id_header: f"req_{ctx.id}",
        **flavour.rate_headers(decision, sim.clock.unix(started)),
    }

    def record(status: int, answer: Answer | None, faults: frozenset[Fault]) -> None:
        sim.ledger.add(
            RequestRecord(
                api=flavour.api, model=prompt.model, api_key=request.api_key, items=clean.items,
                prompt_tokens=tokens_in, completion_tokens=answer.completion_tokens if answer else 0,
                status=status, faults=tuple(sorted(f.value for f in faults)), started_at=started,
                finished_at=sim.clock.now(), stream=prompt.stream,
            )
        )  # fmt: skip

    if not decision.allowed:
        record(429, None, frozenset())
        message = _rate_message(prompt.model, decision, sim.limiter)
        await send_error(
            send, flavour, 429, message, {**headers, **retry_headers(decision.retry_after)}
        )
        return
    faults = sim.faults.next()
    for fault in sorted(faults & HTTP_FAULTS):
        status = _FAULT_STATUS[fault]
        record(status, None, frozenset({fault}))
        extra = retry_headers(sim.time_scale) if status == 429 else {}
        await send_error(
            send, flavour, status, f"simulated fault: {fault.value}", {**headers, **extra}
        )
        return
    answer = clean
    if faults - {Fault.HANG, Fault.DISCONNECT}:
        answer = compose(
            prompt, faults, lengths=sim.output_tokens, rng=sim.faults.rng, count=count_text
        )
    applied = answer.faults | (faults & {Fault.HANG, Fault.DISCONNECT})
    profile = sim.latency.profile_for(prompt.model)
    delays = compute_delays(
        profile, tokens_in, answer.completion_tokens, time_scale=sim.time_scale,
        jitter=sim.latency.jitter, noise=sim.jitter_rng.random(),
    )  # fmt: skip
    status = 499  # the client went away before the answer was complete
    try:
        if Fault.HANG in faults and await _hang(
            sim.fault_plan.hang_seconds * sim.time_scale, receive
        ):
            return
        drop = Fault.DISCONNECT in faults
        if prompt.stream:
            events = flavour.stream(answer, split_pieces(answer.text), ctx)
            status = 200
            await _send_stream(send, flavour, events, delays, headers, drop=drop)
        else:
            await anyio.sleep(delays.total)
            status = 200
            await _send_reply(send, flavour.render(answer, ctx), headers, drop=drop)
    finally:
        record(status, answer if status == 200 else None, applied)


async def _hang(seconds: float, receive: Receive) -> bool:
    """Sleep ``seconds``; return ``True`` early if the client disconnects first."""
    gone = False
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            nonlocal gone
            await wait_for_disconnect(receive)
            gone = True
            group.cancel_scope.cancel()

        group.start_soon(watch)
        await anyio.sleep(seconds)
        group.cancel_scope.cancel()
    return gone


async def _send_reply(
    send: Send, value: dict[str, Any], headers: dict[str, str], *, drop: bool
) -> None:
    import json

    body = json.dumps(value, ensure_ascii=False).encode()
    all_headers = {**headers, "content-type": "application/json", "content-length": str(len(body))}
    await send_start(send, 200, all_headers)
    if drop:
        await send(
            {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
        )
        raise SimulatedDisconnect("simulated fault: the connection dropped mid-response")
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_stream(
    send: Send,
    flavour: Flavour,
    events: list[StreamEvent],
    delays: Delays,
    headers: dict[str, str],
    *,
    drop: bool,
) -> None:
    stream_headers = {**headers, "content-type": "text/event-stream", "cache-control": "no-cache"}
    await send_start(send, 200, stream_headers)
    # Each piece is due at a fixed offset from the start, so a busy event loop delays a
    # piece but not every piece after it (a real server's decoding does not slow down
    # because its client is busy).
    due = anyio.current_time() + delays.first_token
    await anyio.sleep_until(due)
    pauses = pace(delays.decode, [weight for _, _, weight in events])
    content = sum(1 for _, _, weight in events if weight)
    sent = 0
    for (event, data, weight), pause in zip(events, pauses, strict=True):
        if weight:
            if drop and sent >= content // 2:
                raise SimulatedDisconnect("simulated fault: the connection dropped mid-stream")
            due += pause
            await anyio.sleep_until(due)
            sent += 1
        await send(
            {"type": "http.response.body", "body": flavour.sse(event, data), "more_body": True}
        )
    await send({"type": "http.response.body", "body": flavour.done, "more_body": False})


# ---------------------------------------------------------------------------- routing


async def _chat(
    sim: SimulatedProvider, req: HttpRequest, match: re.Match[str], receive: Receive, send: Send
) -> None:
    await generate(sim, OPENAI, req, receive, send)


async def _messages(
    sim: SimulatedProvider, req: HttpRequest, match: re.Match[str], receive: Receive, send: Send
) -> None:
    await generate(sim, ANTHROPIC, req, receive, send)


async def _root(
    sim: SimulatedProvider, req: HttpRequest, match: re.Match[str], receive: Receive, send: Send
) -> None:
    info = {
        "name": "coalesce simulated provider",
        "status": "ok",
        "time_scale": sim.time_scale,
        "apis": [
            "/v1/chat/completions",
            "/v1/files",
            "/v1/batches",
            "/v1/messages",
            "/v1/messages/batches",
        ],
        "admin": ["/_sim/stats", "/_sim/reset", "/_sim/faults"],
    }
    await send_json(send, 200, info, {})


async def _stats(
    sim: SimulatedProvider, req: HttpRequest, match: re.Match[str], receive: Receive, send: Send
) -> None:
    value = {
        "totals": sim.statistics()._asdict(),
        "requests": [record.as_dict() for record in sim.requests],
    }
    await send_json(send, 200, value, {})


async def _reset(
    sim: SimulatedProvider, req: HttpRequest, match: re.Match[str], receive: Receive, send: Send
) -> None:
    sim.reset()
    await send_json(send, 200, {"reset": True}, {})


async def _inject(
    sim: SimulatedProvider, req: HttpRequest, match: re.Match[str], receive: Receive, send: Send
) -> None:
    from coalesce._exceptions import ConfigurationError

    script = req.json_object().get("script")
    if not isinstance(script, list):
        raise HttpError(
            400, 'send {"script": [...]}: one entry (null, a fault or a list) per request'
        )
    try:
        sim.inject(*script)
    except ConfigurationError as exc:
        raise HttpError(400, str(exc)) from None
    await send_json(send, 200, {"pending": sim.faults.pending}, {})


def _routes() -> list[tuple[str, re.Pattern[str], Handler]]:
    from . import _batch_routes

    table: list[tuple[str, str, Handler]] = [
        ("GET", r"/", _root),
        ("POST", r"/v1/chat/completions", _chat),
        ("POST", r"/v1/messages", _messages),
        ("GET", r"/_sim/stats", _stats),
        ("POST", r"/_sim/reset", _reset),
        ("POST", r"/_sim/faults", _inject),
        *_batch_routes.ROUTES,
    ]
    return [(method, re.compile(pattern + r"/?\Z"), handler) for method, pattern, handler in table]


_ROUTES: list[tuple[str, re.Pattern[str], Handler]] = []


async def handle(sim: SimulatedProvider, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one ASGI connection scope.

    Args:
        sim: The provider.
        scope: The ASGI scope.
        receive: The ASGI receive callable.
        send: The ASGI send callable.
    """
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    if not _ROUTES:
        _ROUTES.extend(_routes())
    request = await read_request(scope, receive)
    flavour = flavour_of(request.path)
    path_matched = False
    for method, pattern, handler in _ROUTES:
        match = pattern.match(request.path)
        if match is None:
            continue
        path_matched = True
        if method == request.method:
            try:
                await handler(sim, request, match, receive, send)
            except HttpError as exc:
                await send_error(send, flavour, exc.status, exc.message)
            return
    status = 405 if path_matched else 404
    await send_error(send, flavour, status, f"no route for {request.method} {request.path}")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
