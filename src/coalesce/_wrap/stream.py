"""What a streamed coalesced call (``stream=True``) returns: the SDK's own chunk objects
for one item, in place of the SDK's ``AsyncStream``.

The packed request is streamed and split as it arrives, so a caller's stream opens as
soon as its own item's output is complete, while the model is still writing the other
items. Its usage share is known only when the whole reply (re-asks included) is done:
it comes with the stream's last event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = ["CoalescedStream", "anthropic_events", "openai_chunks"]

T = TypeVar("T")

Usage = Callable[[], Awaitable[tuple[int, int]]]
"""Waits until the group is done; returns the item's ``(input, output)`` token share."""


class CoalescedStream(Generic[T]):
    """Stands in for the SDK's ``AsyncStream``: ``async for``, ``async with``, ``close()``.

    Iterating yields the SDK's own event objects (``ChatCompletionChunk`` for OpenAI,
    ``RawMessageStreamEvent`` for Anthropic) for the caller's item.
    """

    def __init__(self, events: AsyncGenerator[T, None]) -> None:
        self._events = events

    def __aiter__(self) -> CoalescedStream[T]:
        return self

    async def __anext__(self) -> T:
        return await self._events.__anext__()

    async def __aenter__(self) -> CoalescedStream[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the stream (the coalesced request itself carries on for the others)."""
        await self._events.aclose()

    aclose = close

    def __repr__(self) -> str:
        return "<coalesced stream>"


async def openai_chunks(
    message: Mapping[str, Any],
    finish: str,
    reply: Mapping[str, Any],
    *,
    include_usage: bool,
    usage: Usage,
) -> AsyncGenerator[Any, None]:
    """``ChatCompletionChunk`` objects of one answer, shaped like OpenAI's stream.

    The role, the content (or, for a tool call, its id and name, then its arguments),
    the finish reason; then, with ``include_usage``, a chunk with no choices and the
    item's usage share (every earlier chunk has ``usage=None``).

    Args:
        message: The answer's complete ``message``: its ``content`` (JSON text when the
            call asked for a schema), or its one ``tool_calls`` entry.
        finish: Its ``finish_reason`` (``"stop"``, ``"tool_calls"``).
        reply: ``id``, ``created``, ``model`` (and ``system_fingerprint``,
            ``service_tier``) of the chunks.
        include_usage: The call's ``stream_options={"include_usage": True}``.
        usage: Waits for the item's token share.
    """
    from openai.types.chat import ChatCompletionChunk

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> Any:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return ChatCompletionChunk.model_validate(
            {**reply, "object": "chat.completion.chunk", "choices": [choice], "usage": None}
        )

    for delta in _deltas(message):
        yield chunk(delta)
    yield chunk({}, finish)
    if include_usage:
        prompt, completion = await usage()
        yield ChatCompletionChunk.model_validate(
            {
                **reply,
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )


def _deltas(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The deltas OpenAI streams for ``message``: the role (with a tool call's id, type
    and name, its arguments still empty), then the content or the arguments."""
    calls = message.get("tool_calls")
    if not calls:
        opened = {"role": "assistant", "content": "", "refusal": None}
        return [opened, {"content": message["content"]}]
    (call,) = calls
    function = call["function"]
    head = {**call, "index": 0, "function": {"name": function["name"], "arguments": ""}}
    rest = {"index": 0, "function": {"arguments": function["arguments"]}}
    return [
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [head]},
        {"tool_calls": [rest]},
    ]


async def anthropic_events(
    block: Mapping[str, Any], message: Mapping[str, Any], *, usage: Usage, beta: bool = False
) -> AsyncGenerator[Any, None]:
    """``RawMessageStreamEvent`` objects of one answer, shaped like Anthropic's stream.

    ``message_start``, one content block (text, or the forced tool's input as one
    ``input_json_delta``), ``message_delta`` with the stop reason and the item's usage
    share (input and output tokens: ``message_start`` reports zeros, since the share is
    known only when the group is done), ``message_stop``.

    Args:
        block: The content block of the answer (``text`` or ``tool_use``), complete.
        message: ``id``, ``model`` and ``stop_reason`` of the message.
        usage: Waits for the item's token share.
        beta: Yield ``BetaRawMessageStreamEvent`` objects (``beta.messages.create``).
    """
    import json

    import pydantic
    from anthropic.types import RawMessageStreamEvent
    from anthropic.types.beta import BetaRawMessageStreamEvent

    event: Any = BetaRawMessageStreamEvent if beta else RawMessageStreamEvent
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(event)
    start = {
        "id": message["id"],
        "type": "message",
        "role": "assistant",
        "model": message["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    yield adapter.validate_python({"type": "message_start", "message": start})
    if block["type"] == "tool_use":
        opened = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        opened = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    yield adapter.validate_python(
        {"type": "content_block_start", "index": 0, "content_block": opened}
    )
    yield adapter.validate_python({"type": "content_block_delta", "index": 0, "delta": delta})
    yield adapter.validate_python({"type": "content_block_stop", "index": 0})
    prompt, completion = await usage()
    yield adapter.validate_python(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }
    )
    yield adapter.validate_python({"type": "message_stop"})
