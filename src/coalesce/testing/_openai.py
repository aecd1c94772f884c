"""The OpenAI Chat Completions flavour: parse a request, render answers and errors.

A forced function tool is answered as a tool call (``finish_reason`` ``"tool_calls"``),
its arguments the answer to the tool's ``parameters``; streamed, as the SDK's
``tool_calls`` deltas.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._cache import openai_cache_request
from ._engine import Answer, Prompt, ReplyContext
from ._fields import conversation, max_tokens, require_messages, require_str
from ._flavour import StreamEvent
from ._ratelimit import RateDecision, openai_headers
from ._tools import described_schema, forced_function

__all__ = ["OPENAI", "OpenAIFlavour", "reply_tier"]


class OpenAIFlavour:
    """``POST /v1/chat/completions``."""

    api = "openai.chat"
    id_prefix = "chatcmpl-sim"
    request_id_header = "x-request-id"

    def parse(self, body: Mapping[str, Any]) -> Prompt:
        """Return the prompt of a Chat Completions request.

        ``response_format`` gives the schema of the answer (``json_schema``) or asks
        for any JSON (``json_object``); the schema the messages spell out, if any, shapes
        an answer the request leaves free (see :attr:`Prompt.described`); a
        forced function tool's ``parameters`` are the schema of its arguments, the
        answer; ``max_completion_tokens`` wins over the older ``max_tokens``;
        ``prompt_cache_key`` scopes the prompt cache.

        Args:
            body: The request body.

        Raises:
            HttpError: ``model`` or ``messages`` is missing or malformed, a token
                limit is not a positive integer, ``prompt_cache_key`` not a string,
                or ``tool_choice`` names a function not in ``tools``.
        """
        model = require_str(body, "model")
        messages = require_messages(body)
        texts, user_parts = conversation(messages)
        schema, json_mode = self._response_format(body.get("response_format"))
        described = described_schema(texts, user_parts)
        if schema is not None:
            texts.append(json.dumps(schema))
        tool = forced_function(body, nested=True)
        if tool is not None:
            schema = tool.schema
        if isinstance(body.get("tools"), list):
            texts.append(json.dumps(body["tools"]))
        return Prompt(
            model=model,
            texts=tuple(texts),
            user_parts=tuple(user_parts),
            schema=schema,
            json_mode=json_mode,
            described=described if tool is None else None,
            tool=tool.name if tool is not None else None,
            max_tokens=max_tokens(body, "max_completion_tokens", "max_tokens"),
            stream=bool(body.get("stream")),
            messages=len(messages),
            cache=openai_cache_request(body, messages, schema),
        )

    @staticmethod
    def _response_format(value: Any) -> tuple[Mapping[str, Any] | None, bool]:
        if not isinstance(value, Mapping):
            return None, False
        if value.get("type") == "json_schema":
            spec = value.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            return (schema if isinstance(schema, Mapping) else {}), True
        return None, value.get("type") == "json_object"

    def render(self, answer: Answer, ctx: ReplyContext) -> dict[str, Any]:
        """Return the non-streamed completion object."""
        id, created, model = ctx.id, ctx.created, ctx.prompt.model
        message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
        if _calls_tool(answer, ctx):
            message.update(content=None, tool_calls=[_tool_call(ctx, answer.text)])
        return {
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _finish_reason(answer, ctx),
                }
            ],
            "usage": _usage(ctx, answer),
            "service_tier": reply_tier(ctx.body),
            "system_fingerprint": "fp_simulated",
        }

    def stream(self, answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]:
        """Return the SSE events of a streamed completion: (event, data, weight)."""
        id, created, model = ctx.id, ctx.created, ctx.prompt.model
        options = ctx.body.get("stream_options")
        with_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            data: dict[str, Any] = {
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "service_tier": reply_tier(ctx.body),
                "system_fingerprint": "fp_simulated",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if with_usage:
                data["usage"] = None
            return data

        events: list[StreamEvent]
        if _calls_tool(answer, ctx):
            call = {"index": 0, **_tool_call(ctx, "")}
            first = {"role": "assistant", "content": None, "tool_calls": [call]}
            events = [(None, chunk(first), 0)]
            events += [(None, chunk(_arguments_delta(piece)), len(piece)) for piece in pieces]
        else:
            events = [(None, chunk({"role": "assistant", "content": ""}), 0)]
            events += [(None, chunk({"content": piece}), len(piece)) for piece in pieces]
        events.append((None, chunk({}, _finish_reason(answer, ctx)), 0))
        if with_usage:
            final = {
                **chunk({}),
                "choices": [],
                "usage": _usage(ctx, answer),
            }
            events.append((None, final, 0))
        return events

    @staticmethod
    def error(status: int, message: str, kind: str) -> dict[str, Any]:
        """Return an error body."""
        code = {429: "rate_limit_exceeded", 404: "not_found"}.get(status)
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    @staticmethod
    def error_kind(status: int) -> str:
        """Return the error type of a status."""
        return {429: "rate_limit_error", 404: "invalid_request_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )

    @staticmethod
    def rate_headers(decision: RateDecision, unix_now: float) -> dict[str, str]:
        """Return the rate-limit headers."""
        return openai_headers(decision)

    @staticmethod
    def sse(event: str | None, data: dict[str, Any]) -> bytes:
        """Encode one server-sent event."""
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    done = b"data: [DONE]\n\n"


OPENAI = OpenAIFlavour()


def reply_tier(body: Mapping[str, Any]) -> str:
    """Return the ``service_tier`` a reply states: ``"flex"`` or ``"priority"`` when
    asked for, else ``"default"`` (``"auto"`` and no tier included)."""
    tier = body.get("service_tier")
    return tier if tier in ("flex", "priority") else "default"


def _calls_tool(answer: Answer, ctx: ReplyContext) -> bool:
    """The answer is a tool call: a tool was forced, and no fault turned it into prose."""
    return ctx.prompt.tool is not None and answer.tool_input is not None


def _finish_reason(answer: Answer, ctx: ReplyContext) -> str:
    if answer.truncated:
        return "length"
    return "tool_calls" if _calls_tool(answer, ctx) else "stop"


def _tool_call(ctx: ReplyContext, arguments: str) -> dict[str, Any]:
    """The reply's tool call: its id is the response's own (``call_sim000001``)."""
    return {
        "id": "call_" + ctx.id.split("-", 1)[-1],
        "type": "function",
        "function": {"name": ctx.prompt.tool, "arguments": arguments},
    }


def _arguments_delta(piece: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def _usage(ctx: ReplyContext, answer: Answer) -> dict[str, Any]:
    """``prompt_tokens`` counts every prompt token, cached ones included."""
    return {
        "prompt_tokens": ctx.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": ctx.prompt_tokens + answer.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": ctx.cached_tokens, "audio_tokens": 0},
    }
