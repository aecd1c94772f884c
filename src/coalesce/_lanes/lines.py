"""Batch-API lines: one packed request per line, chunked to the providers' limits. Pure.

A batch job is a list of lines, each one request under a ``custom_id``; on the batch
lane each line carries a *packed* request, so the batch discount and the
shared-instruction saving multiply. :func:`chunk` splits lines into jobs within the
providers' limits (``docs/lanes.md``); :func:`read_openai_line` and
:func:`read_anthropic_result` turn one result into a :class:`LineOutcome`: the reply's
text, or why there is none and whether asking again may help.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._exceptions import ConfigurationError
from ..providers import Usage

__all__ = [
    "ANTHROPIC_LIMITS",
    "OPENAI_LIMITS",
    "BatchLimits",
    "LineOutcome",
    "anthropic_request",
    "as_json",
    "chunk",
    "encoded_size",
    "jsonl",
    "openai_line",
    "read_anthropic_result",
    "read_openai_line",
]

OPENAI_CHAT_URL = "/v1/chat/completions"


@dataclass(frozen=True)
class BatchLimits:
    """How much one batch job may carry.

    Attributes:
        max_lines: Most requests (lines) per job.
        max_bytes: Most bytes of the encoded requests per job.
    """

    max_lines: int
    max_bytes: int


#: OpenAI's Batch API: 50,000 requests and 200 MB per input file.
OPENAI_LIMITS = BatchLimits(max_lines=50_000, max_bytes=200 * 1024 * 1024)
#: Anthropic's Message Batches: 100,000 requests and 256 MB per batch.
ANTHROPIC_LIMITS = BatchLimits(max_lines=100_000, max_bytes=256 * 1024 * 1024)


def openai_line(custom_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One Batch API input line asking ``body`` (the ``chat.completions.create``
    arguments, as :meth:`~coalesce.providers.OpenAIProvider.arguments` builds them)."""
    return {"custom_id": custom_id, "method": "POST", "url": OPENAI_CHAT_URL, "body": dict(body)}


def anthropic_request(custom_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """One Message Batches request asking ``params`` (the ``messages.create``
    arguments, as :meth:`~coalesce.providers.AnthropicProvider.arguments` builds them)."""
    body = {key: value for key, value in params.items() if key != "stream"}
    return {"custom_id": custom_id, "params": body}


def _encode(line: Mapping[str, Any]) -> bytes:
    text = json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=_mapping)
    return text.encode() + b"\n"


def _mapping(value: object) -> dict[str, Any]:
    """Read-only mappings (as the job store returns requests) encode as objects."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encoded_size(line: Mapping[str, Any]) -> int:
    """Bytes of ``line`` as one JSONL line (UTF-8, with its newline)."""
    return len(_encode(line))


def as_json(line: Mapping[str, Any]) -> dict[str, Any]:
    """A plain (mutable, JSON-typed) copy of ``line``, such as the SDKs accept."""
    copy: dict[str, Any] = json.loads(_encode(line))
    return copy


def jsonl(lines: Iterable[Mapping[str, Any]]) -> bytes:
    """``lines`` as a JSONL file, one compact UTF-8 line each."""
    return b"".join(map(_encode, lines))


def chunk(
    lines: Sequence[Mapping[str, Any]], limits: BatchLimits
) -> Iterator[list[Mapping[str, Any]]]:
    """Split ``lines`` into jobs of at most ``limits.max_lines`` lines and
    ``limits.max_bytes`` bytes each, in order.

    Raises:
        ConfigurationError: One line alone is larger than a job may be.
    """
    job: list[Mapping[str, Any]] = []
    size = 0
    for line in lines:
        line_size = encoded_size(line)
        if line_size > limits.max_bytes:
            raise ConfigurationError(
                f"batch line {line.get('custom_id')!r} is {line_size:,} bytes, more than a"
                f" batch job may hold ({limits.max_bytes:,}); lower max_items for this lane"
            )
        if job and (len(job) == limits.max_lines or size + line_size > limits.max_bytes):
            yield job
            job, size = [], 0
        job.append(line)
        size += line_size
    if job:
        yield job


@dataclass(frozen=True)
class LineOutcome:
    """What came back for one line.

    Attributes:
        custom_id: The line's id.
        status: ``"ok"`` (``text`` is the reply), ``"retry"`` (no reply, but asking again
            may give one: expired, cancelled, a 429 or 5xx) or ``"failed"`` (the request
            itself was refused, a 400).
        text: The reply's text (a forced tool's input as JSON), when ``"ok"``.
        finish_reason: ``"stop"``, ``"length"``, or the provider's own value.
        usage: Its tokens (none for a line without a reply).
        error: Why there is no reply, when not ``"ok"``.
    """

    custom_id: str
    status: Literal["ok", "retry", "failed"]
    text: str = ""
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=lambda: Usage(0, 0))
    error: str = ""


_RETRY_CODES = frozenset({"batch_expired", "batch_cancelled", "rate_limit_exceeded"})


def read_openai_line(line: Mapping[str, Any]) -> LineOutcome:
    """One line of a Batch API output or error file."""
    custom_id = str(line.get("custom_id", ""))
    response = line.get("response")
    error = line.get("error")
    if isinstance(response, Mapping) and response.get("status_code") == 200:
        return _openai_reply(custom_id, response.get("body") or {})
    if isinstance(response, Mapping):
        status = response.get("status_code")
        body = response.get("body") or {}
        message = (
            str(body.get("error", {}).get("message", body)) if isinstance(body, Mapping) else ""
        )
        transient = isinstance(status, int) and (status == 429 or status >= 500)
        return LineOutcome(
            custom_id, "retry" if transient else "failed", error=f"{status}: {message}"
        )
    code = str(error.get("code", "")) if isinstance(error, Mapping) else ""
    message = str(error.get("message", "")) if isinstance(error, Mapping) else "no response"
    kind: Literal["retry", "failed"] = "retry" if code in _RETRY_CODES else "failed"
    return LineOutcome(custom_id, kind, error=f"{code}: {message}" if code else message)


def _openai_reply(custom_id: str, body: Mapping[str, Any]) -> LineOutcome:
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return LineOutcome(
        custom_id,
        "ok",
        text=message.get("content") or "",
        finish_reason=choice.get("finish_reason") or "stop",
        usage=Usage(
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0),
        ),
    )


def read_anthropic_result(entry: Mapping[str, Any]) -> LineOutcome:
    """One entry of a Message Batches result set."""
    custom_id = str(entry.get("custom_id", ""))
    result = entry.get("result") or {}
    kind = result.get("type")
    if kind == "succeeded":
        return _anthropic_reply(custom_id, result.get("message") or {})
    if kind in ("expired", "canceled"):
        return LineOutcome(custom_id, "retry", error=str(kind))
    error = (result.get("error") or {}).get("error") or result.get("error") or {}
    error_type = str(error.get("type", "")) if isinstance(error, Mapping) else ""
    message = str(error.get("message", "")) if isinstance(error, Mapping) else str(error)
    transient = error_type in ("rate_limit_error", "overloaded_error", "api_error")
    return LineOutcome(
        custom_id, "retry" if transient else "failed", error=f"{error_type}: {message}"
    )


def _anthropic_reply(custom_id: str, message: Mapping[str, Any]) -> LineOutcome:
    blocks = message.get("content") or []
    tools = [block for block in blocks if block.get("type") == "tool_use"]
    if tools:
        text = json.dumps(tools[0].get("input"), ensure_ascii=False)
    else:
        text = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
    usage = message.get("usage") or {}
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    stop = message.get("stop_reason")
    return LineOutcome(
        custom_id,
        "ok",
        text=text,
        finish_reason="length" if stop == "max_tokens" else "stop",
        usage=Usage(
            int(usage.get("input_tokens") or 0) + read + written,
            int(usage.get("output_tokens") or 0),
            read,
            written,
        ),
    )
