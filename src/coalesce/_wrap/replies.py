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

from .._observe.listeners import UsageShare
from .stream import CoalescedStream, anthropic_events, openai_chunks
from .translator import Answer

__all__ = ["anthropic_response", "anthropic_stream", "openai_response", "openai_stream"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _usage_dict(share: UsageShare, names: tuple[str, str]) -> dict[str, int]:
    return {names[0]: share.prompt_tokens, names[1]: share.completion_tokens}


def _text(answer: Answer) -> str:
    """The answer as the SDK's message text: itself, or its JSON for a schema."""
    return answer.value if answer.call.output_schema is None else _dumps(answer.value)


def openai_response(answer: Answer) -> Any:
    """The ``ChatCompletion`` of one answered item."""
    from openai.types.chat import ChatCompletion

    share = answer.share
    reply = dict(share.reply)
    usage = _usage_dict(share, ("prompt_tokens", "completion_tokens"))
    usage["total_tokens"] = share.prompt_tokens + share.completion_tokens
    return ChatCompletion.model_validate(
        {
            **reply,
            "id": f"{reply.get('id', 'chatcmpl-coalesce')}-{share.reply_id}",
            "object": "chat.completion",
            "created": reply.get("created") or 0,
            "model": reply.get("model") or answer.call.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": _text(answer), "refusal": None},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    )


def _anthropic_block(answer: Answer, base: str) -> dict[str, Any]:
    tool = answer.call.tool
    if tool is not None:
        return {"type": "tool_use", "id": f"toolu_{base}", "name": tool, "input": answer.value}
    return {"type": "text", "text": _text(answer)}


def _stop_reason(answer: Answer) -> str:
    return "tool_use" if answer.call.tool is not None else "end_turn"


def anthropic_response(answer: Answer) -> Any:
    """The ``Message`` of one answered item."""
    from anthropic.types import Message

    share = answer.share
    reply = dict(share.reply)
    base = f"{reply.get('id', 'msg_coalesce')}_{share.reply_id}"
    return Message.model_validate(
        {
            "id": base,
            "type": "message",
            "role": "assistant",
            "model": reply.get("model") or answer.call.model,
            "content": [_anthropic_block(answer, base)],
            "stop_reason": _stop_reason(answer),
            "stop_sequence": None,
            "usage": _usage_dict(share, ("input_tokens", "output_tokens")),
        }
    )


def _share(answer: Answer) -> Callable[[], Awaitable[tuple[int, int]]]:
    """Waits until the call's group is done; then its ``(input, output)`` token share."""

    async def share() -> tuple[int, int]:
        await answer.share.finished.wait()
        return answer.share.prompt_tokens, answer.share.completion_tokens

    return share


def openai_stream(answer: Answer) -> CoalescedStream[Any]:
    """The chunks of one answered item, as soon as its output is complete.

    The packed reply is still being written, so the chunks carry coalesce's own id
    (``chatcmpl-coalesce-...``) and the requested model name.
    """
    reply = {
        "id": f"chatcmpl-coalesce-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": answer.call.model,
    }
    include_usage = answer.call.include_usage
    chunks = openai_chunks(_text(answer), reply, include_usage=include_usage, usage=_share(answer))
    return CoalescedStream(chunks)


def anthropic_stream(answer: Answer) -> CoalescedStream[Any]:
    """The events of one answered item, as soon as its output is complete."""
    base = f"msg_coalesce_{uuid.uuid4().hex}"
    message = {"id": base, "model": answer.call.model, "stop_reason": _stop_reason(answer)}
    block = _anthropic_block(answer, base)
    return CoalescedStream(anthropic_events(block, message, usage=_share(answer)))
