"""The SDK objects a coalesced call returns: its own answer and its usage share.

A non-streamed caller gets a genuine ``ChatCompletion`` / ``Message`` once its group's
reply is complete; a streamed one a :class:`~coalesce._wrap.stream.CoalescedStream` of
the SDK's own chunks as soon as its answer is, its usage share with the last event.
The SDKs are imported only here, when a response is built.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .._calls import Job
from .plan import Plan
from .stream import CoalescedStream, anthropic_events, openai_chunks

__all__ = ["anthropic_response", "anthropic_stream", "openai_response", "openai_stream"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _usage_dict(job: Job, names: tuple[str, str]) -> dict[str, int]:
    return {names[0]: job.prompt_tokens, names[1]: job.completion_tokens}


def openai_response(value: Any, job: Job, plan: Plan) -> Any:
    """The ``ChatCompletion`` of one answered item."""
    from openai.types.chat import ChatCompletion

    reply = dict(job.reply)
    text = value if plan.output_schema is None else _dumps(value)
    usage = _usage_dict(job, ("prompt_tokens", "completion_tokens"))
    usage["total_tokens"] = job.prompt_tokens + job.completion_tokens
    return ChatCompletion.model_validate(
        {
            **reply,
            "id": f"{reply.get('id', 'chatcmpl-coalesce')}-{job.reply_id}",
            "object": "chat.completion",
            "created": reply.get("created") or 0,
            "model": reply.get("model") or plan.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    )


def _anthropic_block(value: Any, base: str, plan: Plan) -> dict[str, Any]:
    if plan.tool is not None:
        return {"type": "tool_use", "id": f"toolu_{base}", "name": plan.tool, "input": value}
    text = value if plan.output_schema is None else _dumps(value)
    return {"type": "text", "text": text}


def anthropic_response(value: Any, job: Job, plan: Plan) -> Any:
    """The ``Message`` of one answered item."""
    from anthropic.types import Message

    reply = dict(job.reply)
    base = f"{reply.get('id', 'msg_coalesce')}_{job.reply_id}"
    return Message.model_validate(
        {
            "id": base,
            "type": "message",
            "role": "assistant",
            "model": reply.get("model") or plan.model,
            "content": [_anthropic_block(value, base, plan)],
            "stop_reason": "tool_use" if plan.tool is not None else "end_turn",
            "stop_sequence": None,
            "usage": _usage_dict(job, ("input_tokens", "output_tokens")),
        }
    )


def _share(job: Job, finished: anyio.Event) -> Callable[[], Awaitable[tuple[int, int]]]:
    """Waits until the job's group is done; then its ``(input, output)`` token share."""

    async def share() -> tuple[int, int]:
        await finished.wait()
        return job.prompt_tokens, job.completion_tokens

    return share


def openai_stream(value: Any, job: Job, plan: Plan, finished: anyio.Event) -> CoalescedStream[Any]:
    """The chunks of one answered item, as soon as its output is complete.

    The packed reply is still being written, so the chunks carry coalesce's own id
    (``chatcmpl-coalesce-...``) and the requested model name.
    """
    text = value if plan.output_schema is None else _dumps(value)
    reply = {
        "id": f"chatcmpl-coalesce-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": plan.model,
    }
    chunks = openai_chunks(
        text, reply, include_usage=plan.include_usage, usage=_share(job, finished)
    )
    return CoalescedStream(chunks)


def anthropic_stream(
    value: Any, job: Job, plan: Plan, finished: anyio.Event
) -> CoalescedStream[Any]:
    """The events of one answered item, as soon as its output is complete."""
    base = f"msg_coalesce_{uuid.uuid4().hex}"
    message = {
        "id": base,
        "model": plan.model,
        "stop_reason": "tool_use" if plan.tool is not None else "end_turn",
    }
    block = _anthropic_block(value, base, plan)
    return CoalescedStream(anthropic_events(block, message, usage=_share(job, finished)))
