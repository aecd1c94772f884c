"""The OpenAI Responses flavour: ``POST /v1/responses``.

A request is read into the same :class:`Prompt` as the Chat Completions request that
says the same thing (``instructions`` as the system message, ``input`` as the
messages, ``text.format`` as ``response_format``, a forced function tool as a forced
tool), so the simulated model gives it the same answer. The answer is a ``Response``
with one ``message`` item holding the text, or one ``function_call`` item; streamed,
the API's typed events (``response.created`` ... ``response.completed``). Errors and
rate-limit headers are OpenAI's, as for Chat Completions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._cache import openai_cache_request
from ._engine import Answer, Prompt, ReplyContext
from ._fields import conversation, max_tokens, require_str
from ._flavour import StreamEvent
from ._http import HttpError
from ._openai import OpenAIFlavour, reply_tier
from ._tools import described_schema, forced_function

__all__ = ["RESPONSES", "ResponsesFlavour"]


def _input_messages(value: Any) -> list[Mapping[str, Any]]:
    """The request's ``input`` as messages: a string is one user message."""
    if isinstance(value, str) and value:
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        return value
    raise HttpError(400, "'input' is required: a non-empty string or a list of input items")


def _text_format(body: Mapping[str, Any]) -> Mapping[str, Any]:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    return fmt if isinstance(fmt, Mapping) else {"type": "text"}


def _schema_of(fmt: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, bool]:
    """The format's schema (``json_schema``), and whether it asks for JSON at all."""
    if fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return (schema if isinstance(schema, Mapping) else {}), True
    return None, fmt.get("type") == "json_object"


class ResponsesFlavour(OpenAIFlavour):
    """``POST /v1/responses``: OpenAI's errors and rate-limit headers, its own shapes."""

    api = "openai.responses"
    id_prefix = "resp_sim"
    done = b""

    def parse(self, body: Mapping[str, Any]) -> Prompt:
        """Return the prompt of a Responses request.

        ``instructions`` is the system message and ``input`` the messages (a string
        is one user message; content is a string or ``input_text`` parts);
        ``text.format`` gives the schema (``json_schema``) or asks for JSON
        (``json_object``); ``tools`` with ``tool_choice`` ``"required"`` or
        ``{"type": "function", "name": ...}`` force a function call;
        ``max_output_tokens`` limits the answer.

        Args:
            body: The request body.

        Raises:
            HttpError: ``model`` or ``input`` is missing or malformed,
                ``max_output_tokens`` is not a positive integer, or ``tool_choice``
                names a function not in ``tools``.
        """
        model = require_str(body, "model")
        instructions = body.get("instructions")
        system = [{"role": "system", "content": instructions}] if instructions else []
        messages = [*system, *_input_messages(body.get("input"))]
        texts, user_parts = conversation(messages)
        schema, json_mode = _schema_of(_text_format(body))
        described = described_schema(texts, user_parts)
        if schema is not None:
            texts.append(json.dumps(schema))
        tool = forced_function(body, nested=False)
        if isinstance(body.get("tools"), list):
            texts.append(json.dumps(body["tools"]))
        return Prompt(
            model=model,
            texts=tuple(texts),
            user_parts=tuple(user_parts),
            schema=tool.schema if tool is not None else schema,
            json_mode=json_mode,
            described=described if tool is None else None,
            tool=tool.name if tool is not None else None,
            max_tokens=max_tokens(body, "max_output_tokens"),
            stream=bool(body.get("stream")),
            messages=len(messages),
            cache=openai_cache_request(body, messages, schema),
        )

    def render(self, answer: Answer, ctx: ReplyContext) -> dict[str, Any]:
        """Return the ``Response`` object."""
        status = "incomplete" if answer.truncated else "completed"
        return _response(ctx, [_item(answer, ctx, status)], status, _usage(ctx, answer))

    def stream(self, answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]:
        """Return the SSE events of a streamed response: (event, data, weight)."""
        begun = _response(ctx, [], "in_progress", None)
        events = [_event("response.created", response=begun)]
        events.append(_event("response.in_progress", response=begun))
        if _calls_tool(answer, ctx):
            events += _call_events(answer, pieces, ctx)
        else:
            events += _message_events(answer, pieces, ctx)
        final = self.render(answer, ctx)
        events.append(_event(f"response.{final['status']}", response=final))
        for number, (_, data, _) in enumerate(events):
            data["sequence_number"] = number
        return events

    @staticmethod
    def sse(event: str | None, data: dict[str, Any]) -> bytes:
        """Encode one server-sent event, named as its ``type``."""
        return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


RESPONSES = ResponsesFlavour()


def _calls_tool(answer: Answer, ctx: ReplyContext) -> bool:
    """The answer is a function call: one was forced, and no fault turned it into prose."""
    return ctx.prompt.tool is not None and answer.tool_input is not None


def _suffix(ctx: ReplyContext) -> str:
    """What the ids of one response's parts share: ``resp_sim000001`` → ``sim000001``."""
    return ctx.id.removeprefix("resp_")


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _item(answer: Answer, ctx: ReplyContext, status: str, *, empty: bool = False) -> dict[str, Any]:
    """The response's one output item (``empty``: as first announced in a stream)."""
    if _calls_tool(answer, ctx):
        return {
            "id": f"fc_{_suffix(ctx)}",
            "type": "function_call",
            "status": status,
            "call_id": f"call_{_suffix(ctx)}",
            "name": ctx.prompt.tool,
            "arguments": "" if empty else answer.text,
        }
    return {
        "id": f"msg_{_suffix(ctx)}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [] if empty else [_text_part(answer.text)],
    }


def _response(
    ctx: ReplyContext, output: list[dict[str, Any]], status: str, usage: dict[str, Any] | None
) -> dict[str, Any]:
    body = ctx.body
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": ctx.id,
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": ctx.prompt.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": reply_tier(body),
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": _text_format(body), "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def _usage(ctx: ReplyContext, answer: Answer) -> dict[str, Any]:
    """``input_tokens`` counts every prompt token, cached ones included."""
    return {
        "input_tokens": ctx.prompt_tokens,
        "input_tokens_details": {"cached_tokens": ctx.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": answer.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": ctx.prompt_tokens + answer.completion_tokens,
    }


def _event(kind: str, *, weight: int = 0, **data: Any) -> StreamEvent:
    """One event; its ``sequence_number`` is set once every event is known."""
    return kind, {"type": kind, **data}, weight


def _message_events(answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]:
    """From the message item's announcement to its end, its text in ``pieces``."""
    status = "incomplete" if answer.truncated else "completed"
    where: dict[str, Any] = {"item_id": f"msg_{_suffix(ctx)}", "output_index": 0}
    part: dict[str, Any] = {**where, "content_index": 0}
    added = _item(answer, ctx, "in_progress", empty=True)
    events = [
        _event("response.output_item.added", output_index=0, item=added),
        _event("response.content_part.added", **part, part=_text_part("")),
    ]
    events += [
        _event("response.output_text.delta", weight=len(piece), **part, delta=piece, logprobs=[])
        for piece in pieces
    ]
    events += [
        _event("response.output_text.done", **part, text=answer.text, logprobs=[]),
        _event("response.content_part.done", **part, part=_text_part(answer.text)),
        _event("response.output_item.done", output_index=0, item=_item(answer, ctx, status)),
    ]
    return events


def _call_events(answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]:
    """From the function call's announcement to its end, its arguments in ``pieces``."""
    status = "incomplete" if answer.truncated else "completed"
    where: dict[str, Any] = {"item_id": f"fc_{_suffix(ctx)}", "output_index": 0}
    added = _item(answer, ctx, "in_progress", empty=True)
    events = [_event("response.output_item.added", output_index=0, item=added)]
    events += [
        _event("response.function_call_arguments.delta", weight=len(piece), **where, delta=piece)
        for piece in pieces
    ]
    events += [
        _event(
            "response.function_call_arguments.done",
            **where,
            name=ctx.prompt.tool,
            arguments=answer.text,
        ),
        _event("response.output_item.done", output_index=0, item=_item(answer, ctx, status)),
    ]
    return events
