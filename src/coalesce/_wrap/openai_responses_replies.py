"""The Responses API objects a coalesced call returns: a ``Response`` of its own answer
and usage share, or the SDK's own stream events of it.

Each caller's response has an id of its own (``resp_...``; its message ``msg_...``, a
function call ``fc_...`` with ``call_id`` ``call_...``), since the request that carried
it was a chat completion shared with others. The response echoes the caller's own
request (instructions, ``text``, tools, sampling options), as the API does. The SDK is
imported only here, when a response is built.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from .stream import Events
from .translator import Answer

__all__ = ["responses_events", "responses_response"]

#: Request fields the API echoes in its ``Response``, as the caller gave them.
_ECHOED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "prompt_cache_key",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "temperature",
    "top_p",
    "truncation",
    "user",
)


def _answer_text(answer: Answer) -> str:
    """The answer as output text: itself, or its JSON for a schema or a tool."""
    if answer.call.output_schema is None:
        return str(answer.value)
    return json.dumps(answer.value, ensure_ascii=False, separators=(",", ":"))


def _output_item(answer: Answer, base: str) -> dict[str, Any]:
    """The completed output item: a ``function_call`` for a forced tool, else a message."""
    text = _answer_text(answer)
    if answer.call.tool is not None:
        return {
            "id": f"fc_{base}",
            "type": "function_call",
            "call_id": f"call_{base}",
            "name": answer.call.tool,
            "arguments": text,
            "status": "completed",
        }
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{base}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _response(answer: Answer, given: Mapping[str, Any], head: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Response`` fields of one caller, ``head`` (id, time, status, output, usage)
    on top of what its request echoes."""
    text = dict(given.get("text") or {})
    text.setdefault("format", {"type": "text"})
    return {
        **{name: given[name] for name in _ECHOED if name in given},
        "object": "response",
        "model": answer.call.model,
        "text": text,
        "tools": list(given.get("tools") or []),
        "tool_choice": given.get("tool_choice") or "auto",
        "parallel_tool_calls": given.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "background": False,
        "error": None,
        "incomplete_details": None,
        **head,
    }


def responses_response(answer: Answer, given: Mapping[str, Any]) -> Any:
    """The ``Response`` of one answered item.

    Args:
        answer: The item's answer and usage share.
        given: The caller's ``responses.create`` arguments (echoed in the response).
    """
    from openai.types.responses import Response

    share = answer.share
    created = share.reply.get("created") or int(time.time())
    base = uuid.uuid4().hex
    head = {
        "id": f"resp_{base}",
        "created_at": created,
        "completed_at": created,
        "status": "completed",
        "model": share.reply.get("model") or answer.call.model,
        "output": [_output_item(answer, base)],
        "usage": _usage(share.prompt_tokens, share.completion_tokens),
    }
    return Response.model_validate(_response(answer, given, head))


@functools.cache
def _event_adapter() -> Any:
    import pydantic
    from openai.types.responses import ResponseStreamEvent

    return pydantic.TypeAdapter(ResponseStreamEvent)


def responses_events(answer: Answer, given: Mapping[str, Any]) -> Events:
    """The events of one answered item, as soon as its output is complete.

    The packed reply is still being written: the response's time is now and its model
    the requested one; its usage share comes with ``response.completed``, once the
    group is done.

    Args:
        answer: The item's answer and usage share.
        given: The caller's ``responses.create`` arguments (echoed in the response).
    """
    return _events(answer, given)


def _added(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` as it is announced, before its content."""
    if item["type"] == "function_call":
        return {**item, "arguments": "", "status": "in_progress"}
    return {**item, "content": [], "status": "in_progress"}


def _content_events(item: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events that write ``item``'s content, as (type, fields) in order."""
    at = {"item_id": item["id"], "output_index": 0}
    if item["type"] == "function_call":
        arguments = item["arguments"]
        return [
            ("response.function_call_arguments.delta", {**at, "delta": arguments}),
            ("response.function_call_arguments.done", {**at, "arguments": arguments}),
        ]
    part = item["content"][0]
    at = {**at, "content_index": 0}
    return [
        ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
        ("response.output_text.delta", {**at, "delta": part["text"], "logprobs": []}),
        ("response.output_text.done", {**at, "text": part["text"], "logprobs": []}),
        ("response.content_part.done", {**at, "part": part}),
    ]


async def _events(answer: Answer, given: Mapping[str, Any]) -> AsyncGenerator[Any, None]:
    """``response.created``, ``response.in_progress``, the output item added, its
    content, the item done, then (once the usage share is final) ``response.completed``,
    numbered from 0 as the API numbers them."""
    adapter, numbers = _event_adapter(), itertools.count()
    base, created = uuid.uuid4().hex, int(time.time())
    item = _output_item(answer, base)
    head = {"id": f"resp_{base}", "created_at": created, "status": "in_progress"}
    opening = _response(answer, given, {**head, "output": [], "usage": None})
    steps: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": opening}),
        ("response.in_progress", {"response": opening}),
        ("response.output_item.added", {"output_index": 0, "item": _added(item)}),
        *_content_events(item),
        ("response.output_item.done", {"output_index": 0, "item": item}),
    ]
    for kind, fields in steps:
        yield adapter.validate_python({"type": kind, "sequence_number": next(numbers), **fields})
    await answer.share.finished.wait()
    share = answer.share
    done = {**head, "status": "completed", "completed_at": int(time.time()), "output": [item]}
    done["usage"] = _usage(share.prompt_tokens, share.completion_tokens)
    completed = _response(answer, given, done)
    yield adapter.validate_python(
        {"type": "response.completed", "sequence_number": next(numbers), "response": completed}
    )
