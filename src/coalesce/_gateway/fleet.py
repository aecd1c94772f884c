"""The coalescing routes of a gateway in a fleet (``--fleet``): each call goes to its
partition's owner, which answers it with its own engine and replies per call.

A call's partition is its API, its model and who sends it (the digest of its
credential, and its ``--api-key`` and ``x-coalesce-partition`` partitions): calls of two
credentials never share a partition, so never an owner's request either. On the
forwarder, :func:`answer`:

1. reads the body (at most ``max_body_size``) and what routing needs; a call that
   cannot be forwarded (streamed, ``x-coalesce: off``, a deferred lane, or malformed,
   which the local path answers with its error) is answered here, as without a fleet;
2. :meth:`~coalesce._fleet.Member.dispatch` sends it to the owner with its remaining
   budget; the owner's reply (status, headers, body) is the caller's;
3. owned here, or taken back (NATS down, the owner gone or silent): answered by this
   gateway's own engine, with the budget it has left.

On the owner, :func:`serve` hands a forwarded call to the coalescing route as a
request of its own: the owner's engine groups it with its own callers' calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .._exceptions import ConfigurationError
from .._fleet.decide import forwarded_budget, late, partition_key
from .._fleet.wire import Forwarded, Reply
from .._wrap.headers import SWITCH_HEADER
from .callers import Unauthorized, read_caller
from .controls import read_controls
from .errors import error_response
from .routes import APIS, Api, Refused, read_body
from .routes import answer as answer_here
from .state import GatewayState

__all__ = ["BUDGET_HEADER", "answer", "partition_of", "serve"]

#: The header a forwarded or taken-back call carries its remaining budget in.
BUDGET_HEADER = "x-coalesce-budget"
#: Request headers that describe one hop, not the call: never forwarded.
_HOP = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "expect"}
)
_BY_NAME = {api.name: api for api in APIS}
_REALTIME = frozenset({"auto", "realtime"})


def partition_of(
    state: GatewayState, api: Api, headers: Mapping[str, str], body: bytes
) -> str | None:
    """The partition key of a call that may be forwarded, else ``None`` (see step 1)."""
    config = state.config
    try:
        data = json.loads(body)
        controls = read_controls(headers.items(), budget=config.budget, lane=config.lane)
        caller = read_caller(api.provider, headers, config.api_keys)
    except (ValueError, ConfigurationError, Unauthorized):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        return None
    if data.get("stream") or not controls.coalesce or config.max_items == 1:
        return None
    if controls.lane not in _REALTIME:
        return None
    asked = controls.forwarded.get("x-coalesce-partition", "")
    return partition_key(api.name, data["model"], caller.digest, caller.partition or "", asked)


def _budget(state: GatewayState, headers: Mapping[str, str]) -> float | None:
    return read_controls(headers.items(), budget=state.config.budget, lane="auto").budget


async def answer(state: GatewayState, api: Api, request: Request) -> Response:
    """``POST`` to a coalescing route of a gateway in a fleet (see the module doc)."""
    started = anyio.current_time()
    try:
        body = await read_body(request, state.config.max_body_size)
    except Refused as exc:
        return error_response(api.provider, exc.status, str(exc))
    headers = request.headers
    key = partition_of(state, api, headers, body)
    if key is None or state.member is None:
        return await answer_here(state, api, _replayed(request, body))
    budget = _budget(state, headers)
    sent = tuple((n, v) for n, v in headers.items() if n not in _HOP and n != BUDGET_HEADER)
    call = Forwarded(api.name, sent, body, None, key)
    reply = await state.member.dispatch(call, budget, started)
    if reply is None:  # answered here, with what is left of its budget
        elapsed = anyio.current_time() - started
        if late(budget, elapsed):  # taken back from an owner that died: alone, at once
            return await answer_here(state, api, _replayed(request, body, alone=True))
        left = forwarded_budget(budget, elapsed, hop=0.0)
        return await answer_here(state, api, _replayed(request, body, left))
    shown = {n: v for n, v in reply.headers if n.lower() != "content-length"}
    return Response(reply.body, reply.status, shown)


def _replayed(
    request: Request, body: bytes, budget: float | None = None, *, alone: bool = False
) -> Request:
    """``request`` again, its body already read; with ``budget`` (seconds), its budget
    header says what is left of it; ``alone``, it goes upstream as it came
    (``x-coalesce: off``)."""
    raw: list[tuple[bytes, bytes]] = list(request.scope["headers"])
    if budget is not None:
        raw = [(n, v) for n, v in raw if n.lower() != BUDGET_HEADER.encode()]
        raw.append((BUDGET_HEADER.encode(), _seconds(budget).encode()))
    if alone:
        raw = [(n, v) for n, v in raw if n.lower() != SWITCH_HEADER.encode()]
        raw.append((SWITCH_HEADER.encode(), b"off"))
    return Request({**request.scope, "headers": raw}, _once(body))


def _seconds(budget: float) -> str:
    return f"{max(budget, 0.001):.3f}"


def _once(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:  # the body is read: what follows is the client going away, never
            await anyio.sleep_forever()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _scope(api: Api, headers: Iterable[tuple[str, str]], call: Forwarded) -> dict[str, Any]:
    raw = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in headers
        if name.lower() not in _HOP and name.lower() != BUDGET_HEADER
    ]
    if call.remaining is not None:
        raw.append((BUDGET_HEADER.encode(), _seconds(call.remaining).encode()))
    raw.append((b"content-length", str(len(call.body)).encode()))
    return {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": api.path, "raw_path": api.path.encode(), "root_path": "",
        "query_string": b"", "headers": raw, "server": None, "client": None,
    }  # fmt: skip


async def serve(state: GatewayState, call: Forwarded) -> Reply | None:
    """Answer a call another member forwarded (see the module doc); ``None`` when this
    gateway is stopping, and the forwarder answers it itself."""
    api = _BY_NAME.get(call.api)
    if api is None or not state.ready:
        return None
    request = Request(_scope(api, call.headers, call), _once(call.body))
    response = await answer_here(state, api, request)
    body = await _body(response)
    headers = tuple(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in response.raw_headers
        if name != b"content-length"
    )
    return Reply(response.status_code, headers, body)


async def _body(response: Response) -> bytes:
    if not isinstance(response, StreamingResponse):
        return bytes(response.body)
    chunks: list[bytes] = []
    async for chunk in response.body_iterator:
        chunks.append(chunk if isinstance(chunk, bytes) else str(chunk).encode())
    return b"".join(chunks)
