"""What a streamed coalesced call (``stream=True``) returns: the SDK's own chunk objects
for one item, served as the SDK's own stream.

The packed request is streamed and split as it arrives, so a caller's stream opens as
soon as its own item's output is complete, while the model is still writing the other
items. Its usage share is known only when the whole reply (re-asks included) is done:
it comes with the stream's last event.

A translator answers a streamed call with :data:`Events`, an async generator of the
SDK's event objects (:func:`openai_chunks`, :func:`anthropic_events`); the client then
serves them as the SDK's own ``AsyncStream`` over a synthetic response, built the way
the SDK builds a stream from a response (:func:`~coalesce._wrap.raw.raw_response`),
so every attribute of the stream is the SDK's (``response`` and its headers,
``close()``, ``async with``, what the SDK's stream helpers read). A synchronous client
gets the SDK's own ``Stream`` over the same events (:func:`blocking_stream`).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from typing import Any

from .._sync.blocking import iterate_blocking

__all__ = ["Events", "anthropic_events", "blocking_stream", "openai_chunks"]

Events = AsyncGenerator[Any, None]
"""The SDK's event objects of one streamed answer, in order."""

Usage = Callable[[], Awaitable[tuple[int, int]]]
"""Waits until the group is done; returns the item's ``(input, output)`` token share."""


def blocking_stream(client: Any, stream: Any) -> Any:
    """The SDK's own synchronous ``Stream`` of the async ``stream`` (the SDK's
    ``AsyncStream`` a coalesced call of the async twin returned), for ``client``, the
    synchronous client that was called.

    Its ``response`` is a synchronous copy of the async stream's: the same status,
    headers and request, its body the same server-sent events, read on the background
    loop as they come. Closing it (or leaving ``with``) stops that reading.

    Args:
        client: The wrapped ``openai.OpenAI`` / ``anthropic.Anthropic``.
        stream: An ``openai.AsyncStream`` / ``anthropic.AsyncStream``.
    """
    import httpx2

    source = stream.response

    class Body(httpx2.SyncByteStream):
        def __init__(self) -> None:
            self.chunks = iterate_blocking(source.aiter_raw(), close=source.aclose)

        def __iter__(self) -> Iterator[bytes]:
            return self.chunks

        def close(self) -> None:
            getattr(self.chunks, "close", lambda: None)()

    response = httpx2.Response(
        source.status_code, headers=source.headers, stream=Body(), request=source.request
    )
    response.elapsed = source.elapsed
    sdk = sys.modules[type(stream).__module__.partition(".")[0]]
    cast_to = stream._cast_to  # the event type the SDK gave the async stream
    return sdk.Stream[cast_to](cast_to=cast_to, response=response, client=client)


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
