"""The SDK objects a coalesced call returns: its own answer and its usage share.

A non-streamed caller gets a genuine ``ChatCompletion`` / ``Message`` (``BetaMessage``
for ``beta.messages.create``) once its group's reply is complete; a streamed one the
SDK's own chunks as soon as its answer is (:data:`~coalesce._wrap.stream.Events`, which
the client serves as the SDK's own stream), its usage share with the last event. A call that forced a tool gets a tool
call of its own: its own id (``call_...``, ``toolu_...``), the tool's name, its own
answer as the arguments. The SDKs are imported only here, when a response is built.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from .._observe.listeners import UsageShare
from .stream import Events, anthropic_events, openai_chunks
from .translator import Answer

__all__ = ["anthropic_response", "anthropic_stream", "openai_response", "openai_stream"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _usage_dict(share: UsageShare, names: tuple[str, str]) -> dict[str, int]:
    return {names[0]: share.prompt_tokens, names[1]: share.completion_tokens}


def _text(answer: Answer) -> str:
    """The answer as the SDK's message text: itself, or its JSON for a schema."""
    return answer.value if answer.call.output_schema is None else _dumps(answer.value)


def _tool_id(prefix: str) -> str:
    """A new tool call's id, shaped like the provider's own (24 characters after the
    prefix): each caller's tool call is its own."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _openai_message(answer: Answer) -> tuple[dict[str, Any], str]:
    """The ``message`` of one answered item and its ``finish_reason``."""
    tool = answer.call.tool
    if tool is None:
        return {"role": "assistant", "content": _text(answer), "refusal": None}, "stop"
    function = {"name": tool, "arguments": _dumps(answer.value)}
    call = {"id": _tool_id("call_"), "type": "function", "function": function}
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}
    return message, "tool_calls"


def openai_response(answer: Answer) -> Any:
    """The ``ChatCompletion`` of one answered item."""
    from openai.types.chat import ChatCompletion

    share = answer.share
    message, finish = _openai_message(answer)
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
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    )


def _anthropic_block(answer: Answer) -> dict[str, Any]:
    tool = answer.call.tool
    if tool is not None:
        return {"type": "tool_use", "id": _tool_id("toolu_"), "name": tool, "input": answer.value}
    return {"type": "text", "text": _text(answer)}


def _stop_reason(answer: Answer) -> str:
    return "tool_use" if answer.call.tool is not None else "end_turn"


def anthropic_response(answer: Answer, *, beta: bool = False) -> Any:
    """The ``Message`` of one answered item (``BetaMessage`` with ``beta``)."""
    from anthropic.types import Message
    from anthropic.types.beta import BetaMessage

    share = answer.share
    reply = dict(share.reply)
    base = f"{reply.get('id', 'msg_coalesce')}_{share.reply_id}"
    return (BetaMessage if beta else Message).model_validate(
        {
            "id": base,
            "type": "message",
            "role": "assistant",
            "model": reply.get("model") or answer.call.model,
            "content": [_anthropic_block(answer)],
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


def openai_stream(answer: Answer) -> Events:
    """The chunks of one answered item, as soon as its output is complete.

    The packed reply is still being written, so the chunks carry coalesce's own id
    (``chatcmpl-coalesce-...``) and the requested model name.
    """
    reply = {
        "id": f"chatcmpl-coalesce-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": answer.call.model,
    }
    message, finish = _openai_message(answer)
    return openai_chunks(
        message, finish, reply, include_usage=answer.call.include_usage, usage=_share(answer)
    )


def anthropic_stream(answer: Answer, *, beta: bool = False) -> Events:
    """The events of one answered item, as soon as its output is complete
    (``BetaRawMessageStreamEvent`` objects with ``beta``)."""
    base = f"msg_coalesce_{uuid.uuid4().hex}"
    message = {"id": base, "model": answer.call.model, "stop_reason": _stop_reason(answer)}
    block = _anthropic_block(answer)
    return anthropic_events(block, message, usage=_share(answer), beta=beta)
