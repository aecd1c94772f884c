"""The batch endpoints: OpenAI files and batches, Anthropic message batches."""

from __future__ import annotations

import datetime
import json
from typing import Any

from ._accounting import RequestRecord
from ._anthropic import ANTHROPIC
from ._asgi import HttpError, send_body
from ._batches import Batch, LineResult, StoredFile, anthropic_status, lines_done, openai_status
from ._cache_store import CacheUse
from ._engine import Prompt, ReplyContext, count_text, prompt_tokens
from ._faults import HTTP_FAULTS, Fault
from ._flavour import Flavour, error_body, fault_error
from ._generate import compose_answer
from ._multipart import parse_form
from ._openai import OPENAI
from ._routing import Call, Simulation

__all__ = [
    "cancel_batch",
    "cancel_message_batch",
    "create_batch",
    "create_message_batch",
    "delete_file",
    "file_content",
    "get_batch",
    "get_file",
    "get_message_batch",
    "list_batches",
    "message_batch_results",
    "upload_file",
]


def answer_line(
    sim: Simulation, flavour: Flavour, body: Any, api_key: str, batch_id: str, finish: float
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
        return 400, error_body(flavour, 400, "the request body must be an object")
    try:
        prompt = flavour.parse({**body, "stream": False})
    except HttpError as exc:
        return exc.status, error_body(flavour, exc.status, exc.message)
    now = sim.clock.now()

    faults = sim.faults.next()
    answer = compose_answer(sim, prompt, faults)
    tokens_in = prompt_tokens(prompt, count_text)
    broken = sorted(faults & (HTTP_FAULTS | {Fault.HANG, Fault.DISCONNECT}))
    status, error = fault_error(flavour, broken[0]) if broken else (200, None)
    faults_seen = {*broken} if broken else answer.faults
    cache = _line_cache(sim, prompt, api_key, tokens_in, finish) if error is None else CacheUse()
    sim.ledger.add(
        RequestRecord(
            api=flavour.api.split(".")[0] + ".batch", model=prompt.model, api_key=api_key,
            items=answer.items, prompt_tokens=tokens_in,
            completion_tokens=answer.completion_tokens if status == 200 else 0, status=status,
            faults=tuple(sorted(f.value for f in faults_seen)), started_at=now,
            finished_at=finish, batch_id=batch_id, cached_tokens=cache.read,
            cache_write_tokens=cache.written,
        )
    )  # fmt: skip
    if error is not None:
        return status, error
    ctx = ReplyContext(
        sim.next_id(flavour.id_prefix), int(sim.clock.unix(finish)), tokens_in, prompt, body,
        cached_tokens=cache.read, cache_write_tokens=cache.written,
    )  # fmt: skip
    return 200, flavour.render(answer, ctx)


def _line_cache(
    sim: Simulation, prompt: Prompt, api_key: str, tokens_in: int, finish: float
) -> CacheUse:
    """Read and write the prompt cache as the line is processed: lines run one after
    another, so a line reads what the lines before it wrote."""
    use = sim.prompt_cache.lookup(
        prompt.cache, (api_key, prompt.model), tokens_in, finish, count_text
    )
    sim.prompt_cache.commit(use, finish, finish)
    return use


# ------------------------------------------------------------------------- files


def _file_object(sim: Simulation, stored: StoredFile) -> dict[str, Any]:
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


def _file(sim: Simulation, file_id: str) -> StoredFile:
    stored = sim.batches.files.get(file_id)
    if stored is None:
        raise HttpError(404, f"no file with id {file_id!r}")
    return stored


def _add_file(sim: Simulation, filename: str, purpose: str, data: bytes) -> StoredFile:
    stored = StoredFile(sim.next_id("file-sim"), filename, purpose, data, sim.clock.now())
    sim.batches.files[stored.id] = stored
    return stored


async def upload_file(call: Call) -> None:
    """``POST /v1/files``: store a file sent as a multipart form."""
    form = parse_form(call.request.headers.get("content-type", ""), call.request.body)
    if "file" not in form or "purpose" not in form:
        raise HttpError(400, "a file upload needs the fields 'file' and 'purpose'")
    upload, purpose = form["file"], form["purpose"].value.decode()
    stored = _add_file(call.sim, upload.filename or "upload.jsonl", purpose, upload.value)
    await call.reply(_file_object(call.sim, stored))


async def get_file(call: Call) -> None:
    """``GET /v1/files/{id}``."""
    await call.reply(_file_object(call.sim, _file(call.sim, call.match["id"])))


async def file_content(call: Call) -> None:
    """``GET /v1/files/{id}/content``."""
    stored = _file(call.sim, call.match["id"])
    await send_body(call.send, 200, stored.data, "application/octet-stream", {})


async def delete_file(call: Call) -> None:
    """``DELETE /v1/files/{id}``."""
    stored = _file(call.sim, call.match["id"])
    del call.sim.batches.files[stored.id]
    await call.reply({"id": stored.id, "object": "file", "deleted": True})


# ------------------------------------------------------------------- both batch APIs


def _store_batch(
    call: Call,
    flavour: Flavour,
    prefix: str,
    requests: list[tuple[str, Any]],
    request: dict[str, Any],
    errors: list[dict[str, Any]],
    *,
    validate: bool,
) -> Batch:
    """Answer every line of a new batch now; its timeline shows them over time.

    Args:
        call: The request that creates the batch.
        flavour: The API of its lines.
        prefix: The prefix of the batch id.
        requests: ``(custom_id, request body)`` of each line.
        request: The creating request's body, kept for the batch object.
        errors: Validation errors; a batch with errors fails and runs no line.
        validate: Whether the batch goes through a validation phase first.
    """
    sim = call.sim
    batch_id = sim.next_id(prefix)
    lines = 0 if errors else len(requests)
    timeline = sim.batches.timeline(sim.clock.now(), lines, validate=validate)
    results = [
        LineResult(custom_id, *answer_line(sim, flavour, params, call.request.api_key, batch_id, finish))
        for (custom_id, params), finish in zip(requests[:lines], timeline.finishes, strict=True)
    ]  # fmt: skip
    batch = Batch(batch_id, timeline, results, request, errors)
    sim.batches.batches[batch_id] = batch
    return batch


def _batch(sim: Simulation, batch_id: str) -> Batch:
    batch = sim.batches.batches.get(batch_id)
    if batch is None:
        raise HttpError(404, f"no batch with id {batch_id!r}")
    return batch


def _jsonl(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


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
            message = "each line must be a JSON object with a custom_id"
            errors.append(_line_error("invalid_json_line", message, None, number))
        elif line.get("url") != "/v1/chat/completions":
            message = "only /v1/chat/completions is simulated"
            errors.append(_line_error("invalid_url", message, "url", number))
        else:
            lines.append(line)
    return lines, errors


def _line_error(code: str, message: str, param: str | None, line: int) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


async def create_batch(call: Call) -> None:
    """``POST /v1/batches``: a batch over the lines of an uploaded JSONL file."""
    body = call.request.json_object()
    if body.get("endpoint") != "/v1/chat/completions":
        raise HttpError(400, "only the endpoint /v1/chat/completions is simulated")
    source = _file(call.sim, str(body.get("input_file_id")))
    lines, errors = _parse_jsonl(source.data)
    requests = [(line["custom_id"], line.get("body")) for line in lines]
    batch = _store_batch(call, OPENAI, "batch_sim", requests, body, errors, validate=True)
    await call.reply(_openai_batch(call.sim, batch))


def _stamp(sim: Simulation, moment: float | None, now: float) -> int | None:
    return None if moment is None or moment > now else int(sim.clock.unix(moment))


def _openai_batch(sim: Simulation, batch: Batch) -> dict[str, Any]:
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


def _write_outputs(sim: Simulation, batch: Batch, done: list[LineResult]) -> None:
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


async def get_batch(call: Call) -> None:
    """``GET /v1/batches/{id}``."""
    await call.reply(_openai_batch(call.sim, _batch(call.sim, call.match["id"])))


async def cancel_batch(call: Call) -> None:
    """``POST /v1/batches/{id}/cancel``.

    Raises:
        HttpError: The batch has already ended.
    """
    batch = _batch(call.sim, call.match["id"])
    status = _openai_batch(call.sim, batch)["status"]
    if status in ("completed", "failed", "expired", "cancelled"):
        raise HttpError(400, f"cannot cancel a batch whose status is {status!r}")
    if batch.cancel_at is None:
        batch.cancel_at = call.sim.clock.now()
    await call.reply(_openai_batch(call.sim, batch))


async def list_batches(call: Call) -> None:
    """``GET /v1/batches``: every OpenAI batch, newest first."""
    batches = call.sim.batches.batches.values()
    data = [_openai_batch(call.sim, b) for b in batches if b.id.startswith("batch_")]
    await call.reply(
        {"object": "list", "data": data[::-1], "has_more": False, "first_id": None, "last_id": None}
    )


# --------------------------------------------------------------- Anthropic batches


def _rfc3339(sim: Simulation, moment: float | None) -> str | None:
    if moment is None:
        return None
    when = datetime.datetime.fromtimestamp(sim.clock.unix(moment), datetime.timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


async def create_message_batch(call: Call) -> None:
    """``POST /v1/messages/batches``: a batch of Messages requests."""
    requests = call.request.json_object().get("requests")
    if not isinstance(requests, list) or not requests:
        raise HttpError(400, "'requests' must be a non-empty list")
    if not all(isinstance(r, dict) and isinstance(r.get("custom_id"), str) for r in requests):
        raise HttpError(400, "every request needs a string 'custom_id' and 'params'")
    lines = [(r["custom_id"], r.get("params")) for r in requests]
    batch = _store_batch(call, ANTHROPIC, "msgbatch_sim", lines, {}, [], validate=False)
    await call.reply(_message_batch(call.sim, batch, call.request.base_url))


def _message_batch(sim: Simulation, batch: Batch, base_url: str) -> dict[str, Any]:
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


async def get_message_batch(call: Call) -> None:
    """``GET /v1/messages/batches/{id}``."""
    batch = _batch(call.sim, call.match["id"])
    await call.reply(_message_batch(call.sim, batch, call.request.base_url))


async def cancel_message_batch(call: Call) -> None:
    """``POST /v1/messages/batches/{id}/cancel``: cancel it if it is still running."""
    batch = _batch(call.sim, call.match["id"])
    if _message_batch(call.sim, batch, call.request.base_url)["processing_status"] == "in_progress":
        batch.cancel_at = call.sim.clock.now()
    await call.reply(_message_batch(call.sim, batch, call.request.base_url))


async def message_batch_results(call: Call) -> None:
    """``GET /v1/messages/batches/{id}/results``: one JSON line per request.

    Raises:
        HttpError: The batch has not ended.
    """
    batch = _batch(call.sim, call.match["id"])
    if _message_batch(call.sim, batch, call.request.base_url)["processing_status"] != "ended":
        raise HttpError(400, f"batch {batch.id} has not ended yet; its results are not available")
    until = batch.cancel_at if batch.cancel_at is not None else batch.timeline.completed
    done = lines_done(batch.timeline, until)
    lines = [
        json.dumps({"custom_id": r.custom_id, "result": _outcome(r, i < done)}, ensure_ascii=False)
        for i, r in enumerate(batch.results)
    ]
    await send_body(call.send, 200, _jsonl(lines), "application/binary", {})


def _outcome(result: LineResult, done: bool) -> dict[str, Any]:
    if not done:
        return {"type": "canceled"}
    if result.status == 200:
        return {"type": "succeeded", "message": result.body}
    return {"type": "errored", "error": result.body}
