"""The OpenAI batch endpoints: files and batches.

A batch runs ``validating`` → ``in_progress`` → ``finalizing`` → ``completed``, or
``cancelling`` → ``cancelled``, or ``expired`` when its completion window ends with
lines undone, or ``failed`` at validation (bad lines, repeated custom ids, the
enqueued-token limit). Once it has ended, the output file holds the lines that
succeeded and the error file the lines that failed, then the lines never done
(``batch_cancelled`` / ``batch_expired``); ``request_counts`` counts the same lines.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from ._batch_lines import batch_page, batch_usage, find_batch, jsonl, limit, store_batch
from ._batch_rules import OverLimit, check_metadata, duplicates, page_body, page_size
from ._batches import Batch, LineResult, StoredFile, openai_status
from ._call import Call, Simulation
from ._http import HttpError
from ._openai import OPENAI

__all__ = [
    "cancel_batch",
    "create_batch",
    "delete_file",
    "file_content",
    "get_batch",
    "get_file",
    "list_batches",
    "upload_file",
]

#: The error of a line never done, by the status its batch ended in.
_UNDONE = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request executed."),
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
}

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
    stored = StoredFile(sim.unique_id("file-sim"), filename, purpose, data, sim.clock.now())
    sim.batches.files[stored.id] = stored
    return stored


async def upload_file(call: Call) -> Response:
    """``POST /v1/files``: store a file sent as a multipart form.

    Raises:
        HttpError: The body is not a multipart form, or has no ``file`` or no ``purpose``.
    """
    if not call.request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise HttpError(400, "expected a multipart/form-data body")
    async with call.request.form() as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or not isinstance(purpose, str):
            raise HttpError(400, "a file upload needs the fields 'file' and 'purpose'")
        if isinstance(upload, str):  # a part without a filename
            filename, data = "upload.jsonl", upload.encode()
        else:
            filename, data = upload.filename or "upload.jsonl", await upload.read()
    return call.reply(_file_object(call.sim, _add_file(call.sim, filename, purpose, data)))


async def get_file(call: Call) -> Response:
    """``GET /v1/files/{id}``."""
    return call.reply(_file_object(call.sim, _file(call.sim, call.id)))


async def file_content(call: Call) -> Response:
    """``GET /v1/files/{id}/content``."""
    stored = _file(call.sim, call.id)
    return Response(stored.data, media_type="application/octet-stream")


async def delete_file(call: Call) -> Response:
    """``DELETE /v1/files/{id}``."""
    stored = _file(call.sim, call.id)
    del call.sim.batches.files[stored.id]
    return call.reply({"id": stored.id, "object": "file", "deleted": True})


# ------------------------------------------------------------------------ batches


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
            lines.append({**line, "_line": number})
    return lines, errors


def _line_error(code: str, message: str, param: str | None, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _duplicate_errors(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    message = (
        "The custom_id for this request is a duplicate of another request. The custom_id"
        " parameter must be unique for each request in a batch."
    )
    return [
        _line_error("duplicate_custom_id", message, "custom_id", lines[index]["_line"])
        for index in duplicates([line["custom_id"] for line in lines])
    ]


def _limit_error(over: OverLimit) -> dict[str, Any]:
    message = (
        f"Enqueued token limit reached for {over.model} in organization org-simulated."
        f" Limit: {over.limit:,} enqueued tokens. Please try again once some in_progress"
        f" batches have been completed. ({over.enqueued:,} tokens are enqueued, this batch"
        f" has {over.tokens:,}.)"
    )
    return _line_error("token_limit_exceeded", message, None, None)


async def create_batch(call: Call) -> Response:
    """``POST /v1/batches``: a batch over the lines of an uploaded JSONL file.

    Raises:
        HttpError: The endpoint is not simulated, the file does not exist, or the
            metadata is invalid.
    """
    body = call.json_object()
    if body.get("endpoint") != "/v1/chat/completions":
        raise HttpError(400, "only the endpoint /v1/chat/completions is simulated")
    problem = check_metadata(body.get("metadata"))
    if problem is not None:
        raise HttpError(400, problem)
    source = _file(call.sim, str(body.get("input_file_id")))
    lines, errors = _parse_jsonl(source.data)
    errors += _duplicate_errors(lines)
    requests = [(line["custom_id"], line.get("body")) for line in lines]
    usage = batch_usage(OPENAI, requests)
    over = None if errors else limit(call.sim, "openai", usage)
    if over is not None:
        errors = [_limit_error(over)]
    batch = store_batch(call, OPENAI, "batch_sim", requests, body, errors, usage, validate=True)
    return call.reply(_openai_batch(call.sim, batch))


def _stamp(sim: Simulation, moment: float | None, now: float) -> int | None:
    return None if moment is None or moment > now else int(sim.clock.unix(moment))


def _openai_batch(sim: Simulation, batch: Batch) -> dict[str, Any]:
    now, line = sim.clock.now(), batch.timeline
    status = openai_status(line, batch.cancel_at, sim.batches.cancelling, bool(batch.errors), now)
    done = batch.results[: batch.done(now)]
    if status in ("completed", "cancelled", "expired") and not batch.finished:
        _write_outputs(sim, batch, done, status)
    total = 0 if batch.errors else len(batch.custom_ids)
    undone = total - len(done) if status in _UNDONE else 0
    cancelled = batch.cancel_at is not None
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.request.get("endpoint"),
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.request.get("input_file_id"),
        "completion_window": batch.request.get("completion_window", "24h"), "status": status,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "created_at": int(sim.clock.unix(line.created)),
        "in_progress_at": None if batch.errors else _stamp(sim, line.validated, now),
        "expires_at": int(sim.clock.unix(line.expires)),
        "finalizing_at": None if cancelled else _stamp(sim, line.finalizing, now),
        "completed_at": None if cancelled else _stamp(sim, line.completed, now),
        "failed_at": _stamp(sim, line.validated, now) if batch.errors else None,
        "expired_at": _stamp(sim, line.expires, now) if status == "expired" else None,
        "cancelling_at": _stamp(sim, batch.cancel_at, now),
        "cancelled_at": _stamp(sim, sim.batches.end(batch), now) if cancelled else None,
        "request_counts": {
            "total": total, "completed": sum(r.status == 200 for r in done),
            "failed": sum(r.status != 200 for r in done) + undone,
        },
        "metadata": batch.request.get("metadata"),
    }  # fmt: skip


def _write_outputs(sim: Simulation, batch: Batch, done: list[LineResult], status: str) -> None:
    """Write the output file (lines that succeeded) and the error file (lines that
    failed, then lines never done), each only if it has a line."""
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
    code, message = _UNDONE.get(status, ("", ""))
    for number, custom_id in enumerate(batch.custom_ids[len(done) :], start=len(done) + 1):
        line = {
            "id": f"batch_req_{batch.id}_{number}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message},
        }  # fmt: skip
        bad.append(json.dumps(line, ensure_ascii=False))
    if good:
        batch.output_file_id = _add_file(
            sim, f"{batch.id}_output.jsonl", "batch_output", jsonl(good)
        ).id
    if bad:
        batch.error_file_id = _add_file(
            sim, f"{batch.id}_error.jsonl", "batch_output", jsonl(bad)
        ).id


async def get_batch(call: Call) -> Response:
    """``GET /v1/batches/{id}``."""
    return call.reply(_openai_batch(call.sim, _openai(call.sim, call.id)))


def _openai(sim: Simulation, batch_id: str) -> Batch:
    return find_batch(sim, batch_id, "openai")


async def cancel_batch(call: Call) -> Response:
    """``POST /v1/batches/{id}/cancel``.

    Raises:
        HttpError: The batch has already ended.
    """
    batch = _openai(call.sim, call.id)
    status = _openai_batch(call.sim, batch)["status"]
    if status in ("completed", "failed", "expired", "cancelled"):
        raise HttpError(400, f"cannot cancel a batch whose status is {status!r}")
    if batch.cancel_at is None:
        batch.cancel_at = call.sim.clock.now()
    return call.reply(_openai_batch(call.sim, batch))


async def list_batches(call: Call) -> Response:
    """``GET /v1/batches``: OpenAI batches, newest first, ``limit`` (default 20, at most
    100) at a time from the one ``after`` the cursor."""
    size = page_size(call.query, 100)
    chosen, more = batch_page(call.sim, "openai", size, after=call.query.get("after"))
    data = [_openai_batch(call.sim, b) for b in chosen]
    return call.reply({"object": "list", **page_body(data, more)})
