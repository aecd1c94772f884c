"""The batch endpoints: OpenAI files and batches, Anthropic message batches."""

from __future__ import annotations

import datetime
import json
import re
from typing import TYPE_CHECKING, Any

from ._accounting import RequestRecord
from ._asgi import HttpError, HttpRequest, Receive, Send, send_body, send_json
from ._batches import Batch, LineResult, StoredFile, anthropic_status, lines_done, openai_status
from ._engine import ReplyContext, compose, count_text, prompt_tokens
from ._faults import HTTP_FAULTS, Fault
from ._multipart import parse_form

if TYPE_CHECKING:
    from ._app import Flavour
    from ._provider import SimulatedProvider

__all__ = ["ROUTES"]

Match = re.Match[str]
_FAULT_STATUS = {Fault.RATE_LIMIT: 429, Fault.SERVER_ERROR: 500, Fault.UNAVAILABLE: 503}


def answer_line(
    sim: SimulatedProvider, flavour: Flavour, body: Any, api_key: str, batch_id: str, finish: float
) -> tuple[int, dict[str, Any]]:
    """Answer one batch line at once: (status, response body).

    Args:
        sim: The provider.
        flavour: The API of the line.
        body: The line's request body.
        api_key: The key of the batch's creator.
        batch_id: The batch, for the request log.
        finish: When the line will be done.
    """
    if not isinstance(body, dict):
        return 400, flavour.error(
            400, "the request body must be an object", flavour.error_kind(400)
        )
    try:
        prompt = flavour.parse({**body, "stream": False})
    except HttpError as exc:
        return exc.status, flavour.error(exc.status, exc.message, flavour.error_kind(exc.status))
    now = sim.clock.now()

    faults = sim.faults.next()
    answer = compose(
        prompt, faults, lengths=sim.output_tokens, rng=sim.faults.rng, count=count_text
    )
    tokens_in = prompt_tokens(prompt, count_text)
    broken = sorted(faults & (HTTP_FAULTS | {Fault.HANG, Fault.DISCONNECT}))
    status = _FAULT_STATUS.get(broken[0], 500) if broken else 200
    faults_seen = {*broken} if broken else answer.faults
    sim.ledger.add(
        RequestRecord(
            api=flavour.api.split(".")[0] + ".batch", model=prompt.model, api_key=api_key,
            items=answer.items, prompt_tokens=tokens_in,
            completion_tokens=answer.completion_tokens if status == 200 else 0, status=status,
            faults=tuple(sorted(f.value for f in faults_seen)), started_at=now,
            finished_at=finish, batch_id=batch_id,
        )
    )  # fmt: skip
    if status != 200:
        return status, flavour.error(
            status, f"simulated fault: {broken[0].value}", flavour.error_kind(status)
        )
    ctx = ReplyContext(
        sim.next_id(flavour.id_prefix), int(sim.clock.unix(finish)), tokens_in, prompt, body
    )
    return 200, flavour.render(answer, ctx)


# ------------------------------------------------------------------------- files


def _file_object(sim: SimulatedProvider, stored: StoredFile) -> dict[str, Any]:
    return {
        "id": stored.id,
        "object": "file",
        "bytes": len(stored.data),
        "created_at": int(sim.clock.unix(stored.created_at)),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def _file(sim: SimulatedProvider, file_id: str) -> StoredFile:
    stored = sim.batches.files.get(file_id)
    if stored is None:
        raise HttpError(404, f"no file with id {file_id!r}")
    return stored


def _add_file(sim: SimulatedProvider, filename: str, purpose: str, data: bytes) -> StoredFile:
    stored = StoredFile(sim.next_id("file-sim"), filename, purpose, data, sim.clock.now())
    sim.batches.files[stored.id] = stored
    return stored


async def _upload(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    form = parse_form(req.headers.get("content-type", ""), req.body)
    if "file" not in form or "purpose" not in form:
        raise HttpError(400, "a file upload needs the fields 'file' and 'purpose'")
    purpose = form["purpose"].value.decode()
    stored = _add_file(sim, form["file"].filename or "upload.jsonl", purpose, form["file"].value)
    await send_json(send, 200, _file_object(sim, stored), {})


async def _get_file(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    await send_json(send, 200, _file_object(sim, _file(sim, m["id"])), {})


async def _file_content(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    await send_body(send, 200, _file(sim, m["id"]).data, "application/octet-stream", {})


async def _delete_file(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    stored = _file(sim, m["id"])
    del sim.batches.files[stored.id]
    await send_json(send, 200, {"id": stored.id, "object": "file", "deleted": True}, {})


# ------------------------------------------------------------------ OpenAI batches


def _parse_jsonl(data: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lines, errors = [], []
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            errors.append(
                {
                    "code": "invalid_json_line",
                    "message": "each line must be a JSON object with a custom_id",
                    "param": None,
                    "line": number,
                }
            )
        elif line.get("url") != "/v1/chat/completions":
            errors.append(
                {
                    "code": "invalid_url",
                    "message": "only /v1/chat/completions is simulated",
                    "param": "url",
                    "line": number,
                }
            )
        else:
            lines.append(line)
    return lines, errors


async def _create_batch(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    from ._app import OPENAI

    body = req.json_object()
    if body.get("endpoint") != "/v1/chat/completions":
        raise HttpError(400, "only the endpoint /v1/chat/completions is simulated")
    source = _file(sim, str(body.get("input_file_id")))
    lines, errors = _parse_jsonl(source.data)
    batch_id = sim.next_id("batch_sim")
    timeline = sim.batches.timeline(sim.clock.now(), 0 if errors else len(lines), validate=True)
    results = [] if errors else [
        LineResult(line["custom_id"], *answer_line(sim, OPENAI, line.get("body"), req.api_key, batch_id, finish))
        for line, finish in zip(lines, timeline.finishes, strict=True)
    ]  # fmt: skip
    batch = Batch(batch_id, timeline, results, body, errors)
    sim.batches.batches[batch_id] = batch
    await send_json(send, 200, _openai_batch(sim, batch), {})


def _stamp(sim: SimulatedProvider, moment: float | None, now: float) -> int | None:
    return None if moment is None or moment > now else int(sim.clock.unix(moment))


def _openai_batch(sim: SimulatedProvider, batch: Batch) -> dict[str, Any]:
    now, line = sim.clock.now(), batch.timeline
    cancelling = sim.batches.cancelling
    status = openai_status(line, batch.cancel_at, cancelling, bool(batch.errors), now)
    done_until = min(now, batch.cancel_at) if batch.cancel_at is not None else now
    done = batch.results[: lines_done(line, done_until)]
    if status in ("completed", "cancelled") and not batch.finished:
        _write_outputs(sim, batch, done)
    cancel_end = None if batch.cancel_at is None else batch.cancel_at + cancelling
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.request.get("endpoint"),
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.request.get("input_file_id"),
        "completion_window": batch.request.get("completion_window", "24h"), "status": status,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "created_at": int(sim.clock.unix(line.created)),
        "in_progress_at": None if batch.errors else _stamp(sim, line.validated, now),
        "expires_at": int(sim.clock.unix(line.created)) + 86400,
        "finalizing_at": None if batch.cancel_at is not None else _stamp(sim, line.finalizing, now),
        "completed_at": None if batch.cancel_at is not None else _stamp(sim, line.completed, now),
        "failed_at": _stamp(sim, line.validated, now) if batch.errors else None,
        "expired_at": None, "cancelling_at": _stamp(sim, batch.cancel_at, now),
        "cancelled_at": _stamp(sim, cancel_end, now),
        "request_counts": {
            "total": len(batch.results),
            "completed": sum(r.status == 200 for r in done),
            "failed": sum(r.status != 200 for r in done),
        },
        "metadata": batch.request.get("metadata"),
    }  # fmt: skip


def _write_outputs(sim: SimulatedProvider, batch: Batch, done: list[LineResult]) -> None:
    batch.finished = True
    good: list[str] = []
    bad: list[str] = []
    for number, result in enumerate(done, start=1):
        line = {
            "id": f"batch_req_{batch.id}_{number}", "custom_id": result.custom_id,
            "response": {"status_code": result.status, "request_id": f"req_{batch.id}_{number}", "body": result.body},
            "error": None,
        }  # fmt: skip
        (good if result.status == 200 else bad).append(json.dumps(line, ensure_ascii=False))
    if good:
        batch.output_file_id = _add_file(
            sim, f"{batch.id}_output.jsonl", "batch_output", _jsonl(good)
        ).id
    if bad:
        batch.error_file_id = _add_file(
            sim, f"{batch.id}_error.jsonl", "batch_output", _jsonl(bad)
        ).id


def _jsonl(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _batch(sim: SimulatedProvider, batch_id: str) -> Batch:
    batch = sim.batches.batches.get(batch_id)
    if batch is None:
        raise HttpError(404, f"no batch with id {batch_id!r}")
    return batch


async def _get_batch(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    await send_json(send, 200, _openai_batch(sim, _batch(sim, m["id"])), {})


async def _cancel_batch(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    batch = _batch(sim, m["id"])
    status = _openai_batch(sim, batch)["status"]
    if status in ("completed", "failed", "expired", "cancelled"):
        raise HttpError(400, f"cannot cancel a batch whose status is {status!r}")
    if batch.cancel_at is None:
        batch.cancel_at = sim.clock.now()
    await send_json(send, 200, _openai_batch(sim, batch), {})


async def _list_batches(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    data = [
        _openai_batch(sim, b) for b in sim.batches.batches.values() if b.id.startswith("batch_")
    ]
    await send_json(
        send,
        200,
        {
            "object": "list",
            "data": data[::-1],
            "has_more": False,
            "first_id": None,
            "last_id": None,
        },
        {},
    )


# --------------------------------------------------------------- Anthropic batches


def _rfc3339(sim: SimulatedProvider, moment: float | None) -> str | None:
    if moment is None:
        return None
    when = datetime.datetime.fromtimestamp(sim.clock.unix(moment), datetime.timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


async def _create_message_batch(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    from ._app import ANTHROPIC

    requests = req.json_object().get("requests")
    if not isinstance(requests, list) or not requests:
        raise HttpError(400, "'requests' must be a non-empty list")
    if not all(isinstance(r, dict) and isinstance(r.get("custom_id"), str) for r in requests):
        raise HttpError(400, "every request needs a string 'custom_id' and 'params'")
    batch_id = sim.next_id("msgbatch_sim")
    timeline = sim.batches.timeline(sim.clock.now(), len(requests), validate=False)
    results = [
        LineResult(
            r["custom_id"],
            *answer_line(sim, ANTHROPIC, r.get("params"), req.api_key, batch_id, finish),
        )
        for r, finish in zip(requests, timeline.finishes, strict=True)
    ]
    batch = Batch(batch_id, timeline, results, {})
    sim.batches.batches[batch_id] = batch
    await send_json(send, 200, _message_batch(sim, batch, req.base_url), {})


def _message_batch(sim: SimulatedProvider, batch: Batch, base_url: str) -> dict[str, Any]:
    now, line = sim.clock.now(), batch.timeline
    status = anthropic_status(line, batch.cancel_at, sim.batches.cancelling, now)
    done_until = min(now, batch.cancel_at) if batch.cancel_at is not None else now
    done = batch.results[: lines_done(line, done_until)]
    ended_at = None
    if status == "ended":
        ended_at = (
            line.completed if batch.cancel_at is None else batch.cancel_at + sim.batches.cancelling
        )
    succeeded = sum(r.status == 200 for r in done)
    pending = len(batch.results) - len(done)
    return {
        "id": batch.id, "type": "message_batch", "processing_status": status,
        "request_counts": {
            "processing": 0 if status == "ended" else pending, "succeeded": succeeded,
            "errored": len(done) - succeeded, "canceled": pending if status == "ended" else 0,
            "expired": 0,
        },
        "ended_at": _rfc3339(sim, ended_at), "created_at": _rfc3339(sim, line.created),
        "expires_at": _rfc3339(sim, line.created + 86400), "archived_at": None,
        "cancel_initiated_at": _rfc3339(sim, batch.cancel_at),
        "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if status == "ended" else None,
    }  # fmt: skip


async def _get_message_batch(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    await send_json(send, 200, _message_batch(sim, _batch(sim, m["id"]), req.base_url), {})


async def _cancel_message_batch(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    batch = _batch(sim, m["id"])
    if _message_batch(sim, batch, req.base_url)["processing_status"] == "in_progress":
        batch.cancel_at = sim.clock.now()
    await send_json(send, 200, _message_batch(sim, batch, req.base_url), {})


async def _message_batch_results(
    sim: SimulatedProvider, req: HttpRequest, m: Match, receive: Receive, send: Send
) -> None:
    batch = _batch(sim, m["id"])
    if _message_batch(sim, batch, req.base_url)["processing_status"] != "ended":
        raise HttpError(400, f"batch {batch.id} has not ended yet; its results are not available")
    until = batch.cancel_at if batch.cancel_at is not None else batch.timeline.completed
    done = lines_done(batch.timeline, until)
    lines = []
    for index, result in enumerate(batch.results):
        if index >= done:
            outcome: dict[str, Any] = {"type": "canceled"}
        elif result.status == 200:
            outcome = {"type": "succeeded", "message": result.body}
        else:
            outcome = {"type": "errored", "error": result.body}
        lines.append(
            json.dumps({"custom_id": result.custom_id, "result": outcome}, ensure_ascii=False)
        )
    await send_body(send, 200, _jsonl(lines), "application/binary", {})


ROUTES = [
    ("POST", r"/v1/files", _upload),
    ("GET", r"/v1/files/(?P<id>[^/]+)", _get_file),
    ("DELETE", r"/v1/files/(?P<id>[^/]+)", _delete_file),
    ("GET", r"/v1/files/(?P<id>[^/]+)/content", _file_content),
    ("POST", r"/v1/batches", _create_batch),
    ("GET", r"/v1/batches", _list_batches),
    ("GET", r"/v1/batches/(?P<id>[^/]+)", _get_batch),
    ("POST", r"/v1/batches/(?P<id>[^/]+)/cancel", _cancel_batch),
    ("POST", r"/v1/messages/batches", _create_message_batch),
    ("GET", r"/v1/messages/batches/(?P<id>[^/]+)", _get_message_batch),
    ("POST", r"/v1/messages/batches/(?P<id>[^/]+)/cancel", _cancel_message_batch),
    ("GET", r"/v1/messages/batches/(?P<id>[^/]+)/results", _message_batch_results),
]
