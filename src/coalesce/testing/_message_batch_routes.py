"""The Anthropic Message Batches endpoints.

A batch runs ``in_progress`` → ``ended``, or ``canceling`` → ``ended``; it also ends
when its completion window does, with the requests not done by then ``expired``.
Creating one is refused with ``400`` for a bad or repeated ``custom_id`` and with
``429`` (``rate_limit_error``) when the enqueued-token limit is reached. Message
batches take no ``metadata``: the API has no such field.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

from starlette.responses import Response

from ._anthropic import ANTHROPIC
from ._batch_lines import batch_page, batch_usage, find_batch, jsonl, limit, store_batch
from ._batch_rules import OverLimit, duplicates, invalid_anthropic_ids, page_body, page_size
from ._batches import Batch, LineResult, anthropic_status, lines_done
from ._call import Call, Simulation
from ._http import HttpError

__all__ = [
    "cancel_message_batch",
    "create_message_batch",
    "get_message_batch",
    "list_message_batches",
    "message_batch_results",
]


def _rfc3339(sim: Simulation, moment: float | None) -> str | None:
    if moment is None:
        return None
    when = datetime.datetime.fromtimestamp(sim.clock.unix(moment), datetime.timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _requests(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """The ``(custom_id, params)`` of each request of a create.

    Raises:
        HttpError: The requests are missing, or a ``custom_id`` is invalid or repeated.
    """
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise HttpError(400, "'requests' must be a non-empty list")
    if not all(isinstance(r, dict) and isinstance(r.get("custom_id"), str) for r in requests):
        raise HttpError(400, "every request needs a string 'custom_id' and 'params'")
    ids = [r["custom_id"] for r in requests]
    bad = invalid_anthropic_ids(ids)
    if bad:
        raise HttpError(
            400,
            f"custom_id must be 1 to 64 characters of a-z, A-Z, 0-9, '_' or '-'; got {bad[0]!r}",
        )
    repeated = duplicates(ids)
    if repeated:
        raise HttpError(
            400, f"custom_id {ids[repeated[0]]!r} is used twice; each must be unique in a batch"
        )
    return [(r["custom_id"], r.get("params")) for r in requests]


def _limit_message(over: OverLimit) -> str:
    return (
        f"Number of enqueued tokens for {over.model} exceeds your rate limit of"
        f" {over.limit:,} ({over.enqueued:,} enqueued, {over.tokens:,} in this batch)."
        " Try again once some of your message batches have ended."
    )


async def create_message_batch(call: Call) -> Response:
    """``POST /v1/messages/batches``: a batch of Messages requests.

    Raises:
        HttpError: The requests are invalid (400), or the enqueued-token limit is
            reached (429).
    """
    requests = _requests(call.json_object())
    usage = batch_usage(ANTHROPIC, requests)
    over = limit(call.sim, "anthropic", usage)
    if over is not None:
        raise HttpError(429, _limit_message(over), "rate_limit_error")
    batch = store_batch(call, ANTHROPIC, "msgbatch_sim", requests, {}, [], usage, validate=False)
    return call.reply(_message_batch(call.sim, batch, call.base_url))


def _message_batch(sim: Simulation, batch: Batch, base_url: str) -> dict[str, Any]:
    now, line = sim.clock.now(), batch.timeline
    status = anthropic_status(line, batch.cancel_at, sim.batches.cancelling, now)
    done = batch.results[: batch.done(now)]
    succeeded = sum(r.status == 200 for r in done)
    pending = len(batch.custom_ids) - len(done)
    ended = status == "ended"
    cancelled = batch.cancel_at is not None
    return {
        "id": batch.id, "type": "message_batch", "processing_status": status,
        "request_counts": {
            "processing": 0 if ended else pending, "succeeded": succeeded,
            "errored": len(done) - succeeded,
            "canceled": pending if ended and cancelled else 0,
            "expired": pending if ended and not cancelled else 0,
        },
        "ended_at": _rfc3339(sim, sim.batches.end(batch)) if ended else None,
        "created_at": _rfc3339(sim, line.created), "expires_at": _rfc3339(sim, line.expires),
        "archived_at": None, "cancel_initiated_at": _rfc3339(sim, batch.cancel_at),
        "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if ended else None,
    }  # fmt: skip


def _anthropic(sim: Simulation, batch_id: str) -> Batch:
    return find_batch(sim, batch_id, "anthropic")


async def get_message_batch(call: Call) -> Response:
    """``GET /v1/messages/batches/{id}``."""
    batch = _anthropic(call.sim, call.id)
    return call.reply(_message_batch(call.sim, batch, call.base_url))


async def list_message_batches(call: Call) -> Response:
    """``GET /v1/messages/batches``: message batches, newest first, ``limit`` (default
    20, at most 1000) at a time, after ``after_id`` or before ``before_id``."""
    query = call.query
    chosen, more = batch_page(
        call.sim, "anthropic", page_size(query, 1000),
        after=query.get("after_id"), before=query.get("before_id"),
    )  # fmt: skip
    data = [_message_batch(call.sim, b, call.base_url) for b in chosen]
    return call.reply(page_body(data, more))


async def cancel_message_batch(call: Call) -> Response:
    """``POST /v1/messages/batches/{id}/cancel``: cancel it if it is still running."""
    batch = _anthropic(call.sim, call.id)
    if _message_batch(call.sim, batch, call.base_url)["processing_status"] == "in_progress":
        batch.cancel_at = call.sim.clock.now()
    return call.reply(_message_batch(call.sim, batch, call.base_url))


async def message_batch_results(call: Call) -> Response:
    """``GET /v1/messages/batches/{id}/results``: one JSON line per request.

    Raises:
        HttpError: The batch has not ended.
    """
    batch = _anthropic(call.sim, call.id)
    if _message_batch(call.sim, batch, call.base_url)["processing_status"] != "ended":
        raise HttpError(400, f"batch {batch.id} has not ended yet; its results are not available")
    done = lines_done(batch.timeline, math.inf if batch.cancel_at is None else batch.cancel_at)
    undone = "canceled" if batch.cancel_at is not None else "expired"
    outcomes = [_outcome(r) for r in batch.results[:done]]
    outcomes += [{"type": undone}] * (len(batch.custom_ids) - done)
    lines = [
        json.dumps({"custom_id": custom_id, "result": outcome}, ensure_ascii=False)
        for custom_id, outcome in zip(batch.custom_ids, outcomes, strict=True)
    ]
    return Response(jsonl(lines), media_type="application/binary")


def _outcome(result: LineResult) -> dict[str, Any]:
    if result.status == 200:
        return {"type": "succeeded", "message": result.body}
    return {"type": "errored", "error": result.body}
